// Kernel bench of the prefill products (engine/gpu/kernels/mul_mat.ts tiles, wgsl/mul_mat.wgsl)
// with and without prefetching and in each tile shape (rows × token slots), on the bench model's
// shapes for a run of tokens: each checked bit for bit against the decode kernel token by token
// (the batch invariance the engine needs), then timed in rounds of every variant. Prints shape |
// variant (p: prefetching, rows x slots, * the engine's choice) | µs a product (median) | TFLOPS |
// slowest pass / fastest, and the adapter's feature list.
//
//   deno run -A bench/kernels/prefill_mul_mat.ts --gpu dawn [--tokens 512] [--out r.json]
//   deno run -A bench/kernels/prefill_mul_mat.ts --gpu builtin --shapes tiny --allow-software-gpu

import { GpuMemory, readBuffer } from "../../engine/gpu/buffers.ts";
import { type GpuContext, openGpu } from "../../engine/gpu/device.ts";
import { createStepTimer, ParamArena, StepEncoder } from "../../engine/gpu/encoder.ts";
import { gatherTiles, gatherWords, moeGather } from "../../engine/gpu/kernels/moe_gather.ts";
import {
  mulMat,
  type MulMatOptions,
  PREFILL_TT,
  tileFor,
  type TileShape as Tile,
} from "../../engine/gpu/kernels/mul_mat.ts";
import { PREFETCH_TYPES } from "../../engine/gpu/kernels/mul_mat_vec.ts";
import { PROVIDER_CHOICES, selectProvider } from "../../engine/gpu/provider.ts";
import { type GpuTensor, uploadTensorBytes } from "../../engine/gpu/tensor.ts";
import { GgmlType } from "../../engine/quant/ggml_types.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../../lib/cli.ts";
import { randomBlocks } from "../../tools/synth/random_blocks.ts";
import { median, randomF32, timeDispatches } from "./decode_matvec.ts";
import { rng } from "../../tests/_fuzz.ts";
import { benchProducts, type ProductShape } from "./bench_shapes.ts";

/**
 * One prefill product: experts run over a gather table; a tile takes x as it is (`norm` is the
 * decode product's).
 */
export interface TileShape extends ProductShape {
  /** Tokens of this product (the LM head runs its logits in chunks); default --tokens. */
  readonly tokens?: number;
}

/** The prefill products of the qwen35moe-35b layers, and a chunk of its LM head. */
export function fullShapes(): TileShape[] {
  const m = benchProducts();
  return Object.values({
    ...m,
    lmHead: { ...m.lmHead, name: "LM head 64K rows T64", rows: 65536, tokens: 64 },
  });
}

/** CPU-adapter sizes with the same epilogues and partial tiles. */
export function tinyShapes(): TileShape[] {
  return [
    { name: "q8", type: GgmlType.Q8_0, rows: 70, k: 1280 },
    { name: "f32 router", type: GgmlType.F32, rows: 133, k: 544 },
    { name: "q8 add", type: GgmlType.Q8_0, rows: 70, k: 576, add: true },
    { name: "iq4 experts", type: GgmlType.IQ4_XS, rows: 70, k: 512, experts: 6, nUsed: 3 },
    {
      name: "iq4 down",
      type: GgmlType.IQ4_XS,
      rows: 70,
      k: 256,
      experts: 6,
      nUsed: 3,
      swiglu: true,
    },
    { name: "q6", type: GgmlType.Q6_K, rows: 70, k: 256 },
  ];
}

/**
 * Random blocks for `n` weights: at most 8M generated and repeated (the products' time does
 * not depend on the values; generating 500M in JS would take most of a run).
 */
function repeatedBlocks(type: GgmlType, n: number, r: () => number): Uint8Array {
  const unique = Math.min(n, 2 ** 23);
  const some = randomBlocks(type, unique, 0.05, r);
  if (unique === n) return some;
  const out = new Uint8Array((some.length / unique) * n);
  for (let at = 0; at < out.length; at += some.length) {
    out.set(some.subarray(0, Math.min(some.length, out.length - at)), at);
  }
  return out;
}

/** Everything a shape's dispatches bind. */
export interface Setup {
  readonly w: GpuTensor;
  readonly x: GPUBuffer;
  readonly y: GPUBuffer;
  readonly yInit: Float32Array<ArrayBuffer>;
  /** Per token, its expert ids (decode calls read them from the start of a buffer). */
  readonly tokenIds: readonly GPUBuffer[];
  /** The gather table over all tokens' ids. */
  readonly table?: GPUBuffer;
  readonly options: Omit<MulMatOptions, "prefetch" | "tile">;
  readonly tokens: number;
  /** Floats a token's outputs take in y and its input in x. */
  readonly yStride: number;
  readonly xStride: number;
}

/** A shape's weights: random blocks, uploaded. */
export function uploadShape(mem: GpuMemory, shape: TileShape): Promise<GpuTensor> {
  const { type, rows, k } = shape;
  const experts = shape.experts ?? 1;
  return uploadTensorBytes(mem, {
    name: shape.name,
    type,
    shape: shape.experts ? [k, rows, experts] : [k, rows],
  }, repeatedBlocks(type, k * rows * experts, rng(shape.rows * 31 + shape.k)));
}

/**
 * Expert ids of `tokens` tokens, nUsed distinct experts each: uniform, or `skewed` (each expert's
 * popularity log-normal with σ = 1, so a few experts take several times the average load and some
 * almost none, as routers do).
 */
function route(
  tokens: number,
  nUsed: number,
  experts: number,
  skewed: boolean,
  r: () => number,
): Uint32Array {
  const normal = () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  const weight = Array.from({ length: experts }, () => skewed ? Math.exp(normal()) : 1);
  const total = weight.reduce((a, b) => a + b, 0);
  const ids = new Uint32Array(tokens * nUsed);
  for (let t = 0; t < tokens; t++) {
    const picked = new Set<number>();
    while (picked.size < nUsed) {
      let u = r() * total;
      let e = 0;
      while (e < experts - 1 && u >= weight[e]) u -= weight[e++];
      picked.add(e);
    }
    ids.set([...picked], t * nUsed);
  }
  return ids;
}

/** The operands of a shape's products for `tokens` tokens, on weights `w` (uploadShape). */
export function prepare(
  ctx: GpuContext,
  mem: GpuMemory,
  shape: TileShape,
  tokens: number,
  w: GpuTensor,
  skewed = false,
): Setup {
  const r = rng(shape.rows * 31 + shape.k + tokens);
  const { rows, k } = shape;
  const experts = shape.experts ?? 1;
  const nUsed = shape.nUsed ?? 1;
  // Under SwiGLU each (token, rank) has its own [gate | up] row; else ranks share the token's x.
  const xStride = shape.swiglu ? nUsed * 2 * k : k;
  const yStride = nUsed * rows;
  const x = mem.upload("x", randomF32(tokens * xStride, r));
  const yInit = shape.add ? randomF32(tokens * yStride, r) : new Float32Array(tokens * yStride);
  const y = mem.storage("y", yInit.byteLength);
  const options: Setup["options"] = {
    tokens,
    nUsed: shape.experts ? nUsed : undefined,
    add: shape.add,
    swiglu: shape.swiglu,
    upOffset: shape.swiglu ? k : undefined,
    xStrideT: xStride,
    xStrideI: shape.experts ? (shape.swiglu ? 2 * k : 0) : undefined,
  };
  if (!shape.experts) return { w, x, y, yInit, tokenIds: [], options, tokens, yStride, xStride };
  const ids = route(tokens, nUsed, experts, skewed, r);
  const idsb = mem.upload("ids", ids);
  const slots = tokens * nUsed;
  const table = mem.storage("table", 4 * gatherWords(slots, experts, PREFILL_TT));
  const enc = new StepEncoder(ctx, new ParamArena(mem, 4));
  moeGather(enc, { ids: idsb, table }, { slots, experts, tt: PREFILL_TT });
  enc.submit();
  const tokenIds = Array.from(
    { length: tokens },
    (_, t) => mem.upload(`ids ${t}`, ids.slice(t * nUsed, (t + 1) * nUsed)),
  );
  return {
    w,
    x,
    y,
    yInit,
    tokenIds,
    table,
    options: { ...options, gatherTiles: gatherTiles(slots, experts, PREFILL_TT) },
    tokens,
    yStride,
    xStride,
  };
}

/** One way to run a shape's tiles. */
interface Variant {
  readonly prefetch: boolean;
  readonly tile: Tile;
  /** false: x rows unpadded (-pad), where the engine pads them if they fit. */
  readonly pad?: boolean;
}

function variantName(v: Variant, chosen: Tile): string {
  const mark = v.prefetch && v.pad !== false && v.tile.rows === chosen.rows &&
    v.tile.tokens === chosen.tokens;
  return `${v.prefetch ? "p" : ""}${v.tile.rows}x${v.tile.tokens}${mark ? "*" : ""}${
    v.pad === false ? "-pad" : ""
  }`;
}

/**
 * The variants timed: the engine's tile without prefetching, then every tile shape prefetching
 * (a gathered tile takes the gather table's PREFILL_TT slots), then the engine's tile with its x
 * rows unpadded; without prefetching alone for types that have none.
 */
function variantsOf(shape: TileShape, chosen: Tile): Variant[] {
  const slots = shape.experts ? [PREFILL_TT as 32] : [64 as const, 32 as const];
  const tiles = slots.flatMap((tokens) =>
    [64 as const, 128 as const].map((rows) => ({ rows, tokens }))
  );
  if (!PREFETCH_TYPES.includes(shape.type)) return tiles.map((tile) => ({ prefetch: false, tile }));
  return [
    { prefetch: false, tile: chosen },
    ...tiles.map((tile) => ({ prefetch: true, tile })),
    { prefetch: true, tile: chosen, pad: false },
  ];
}

function recordTile(enc: StepEncoder, s: Setup, v: Variant): void {
  mulMat(enc, { w: s.w, x: s.x, y: s.y, ids: s.table }, { ...s.options, ...v });
}

/** The decode kernel's outputs of `token` alone, into y at the token's place. */
function recordDecode(enc: StepEncoder, s: Setup, token: number): void {
  const { gatherTiles: _, ...o } = s.options;
  mulMat(enc, { w: s.w, x: s.x, y: s.y, ids: s.tokenIds[token] }, {
    ...o,
    tokens: 1,
    xOffset: token * s.xStride,
    yOffset: token * s.yStride,
  });
}

/** Runs the tile, then checks the tokens `checked` bit for bit against the decode kernel. */
async function check(
  ctx: GpuContext,
  arena: ParamArena,
  s: Setup,
  v: Variant,
  checked: readonly number[],
): Promise<string> {
  const run = async (recordAll: (enc: StepEncoder) => void) => {
    ctx.device.queue.writeBuffer(s.y, 0, s.yInit);
    const enc = new StepEncoder(ctx, arena);
    recordAll(enc);
    ctx.device.pushErrorScope("validation");
    enc.submit();
    const error = await ctx.device.popErrorScope();
    if (error) throw new Error(error.message);
    return new Float32Array(await readBuffer(ctx, s.y, 0, s.yInit.byteLength));
  };
  try {
    const tiled = await run((enc) => recordTile(enc, s, v));
    const alone = await run((enc) => checked.forEach((t) => recordDecode(enc, s, t)));
    if (!tiled.some((v) => v !== 0)) return "wrong: all outputs are zero";
    for (const t of checked) {
      for (let i = t * s.yStride; i < (t + 1) * s.yStride; i++) {
        if (!Object.is(tiled[i], alone[i])) {
          return `bits differ from decode at y[${i}]: ${tiled[i]} tiled, ${alone[i]} alone`;
        }
      }
    }
    return "ok";
  } catch (e) {
    return `rejected: ${(e as Error).message}`;
  }
}

interface TileResult {
  readonly shape: string;
  readonly variant: string;
  readonly us?: number;
  readonly tflops?: number;
  /** The slowest timed pass over the fastest. */
  readonly spread?: number;
  readonly check: string;
}

function line(r: TileResult): string {
  const us = r.us === undefined
    ? ""
    : `${r.us.toFixed(1)} µs  ${r.tflops!.toFixed(2)} TFLOPS  ×${r.spread!.toFixed(2)}`;
  return `${r.shape.padEnd(22)} ${r.variant.padEnd(10)} ${us.padEnd(36)} ${r.check}`;
}

const PREFILL_MUL_MAT = {
  name: "Prefill mul_mat bench",
  usage: "deno run -A bench/kernels/prefill_mul_mat.ts",
  about:
    "Checks then times the prefill tiles with and without prefetching, in each tile shape, on the bench model's shapes.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
    shapes: flag(
      oneOf(["full", "tiny"] as const),
      "the bench model's shapes, or CPU-sized ones",
      "full",
    ),
    tokens: flag(whole(1), "tokens a product takes (the prefill length)", 512),
    dispatches: flag(whole(1), "back-to-back dispatches a timed pass", 4),
    runs: flag(whole(1), "rounds of timed passes, one per variant each (the median is kept)", 5),
    variant: flag(text("NAME,..."), "variants (e.g. p64x64) to time instead of all"),
    only: flag(text("NAME,..."), "shapes whose name contains one of these"),
    out: flag(text("FILE"), "write every result here as JSON"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof PREFILL_MUL_MAT.flags>): Promise<void> {
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });
  // The adapter's whole feature list: whether it offers more than the engine asks for (such as
  // a subgroup-matrix feature).
  const adapter = await (await selectProvider(values.gpu)).gpu.requestAdapter({
    powerPreference: "high-performance",
  });
  console.log(`adapter features: ${[...(adapter?.features ?? [])].sort().join(", ")}`);
  console.log(`workgroup memory: ${ctx.limits.maxComputeWorkgroupStorageSize} bytes`);
  const mem = new GpuMemory(ctx);
  const timer = createStepTimer(mem);
  if (!timer) console.log("no timestamp-query: times are wall clock per pass");
  const arena = new ParamArena(mem, 16);
  const results: TileResult[] = [];
  const all = values.shapes === "full" ? fullShapes() : tinyShapes();
  const only = values.only?.split(",");
  for (const shape of only ? all.filter((s) => only.some((o) => s.name.includes(o))) : all) {
    const shapeMem = new GpuMemory(ctx);
    const tokens = shape.tokens ?? values.tokens;
    const s = prepare(ctx, shapeMem, shape, tokens, await uploadShape(shapeMem, shape));
    const flops = 2 * shape.rows * shape.k * tokens * (shape.nUsed ?? 1);
    const checked = [...new Set([0, 1, Math.floor(tokens / 2), tokens - 1])];
    const chosen = tileFor(ctx, shape.rows, !!shape.experts);
    const wanted = values.variant?.split(",");
    const timed: { v: Variant; result: TileResult; us: number[] }[] = [];
    for (const v of variantsOf(shape, chosen)) {
      const variant = variantName(v, chosen);
      if (wanted && !wanted.includes(variant.replace("*", ""))) continue;
      const verdict = await check(ctx, arena, s, v, checked);
      timed.push({ v, result: { shape: shape.name, variant, check: verdict }, us: [] });
    }
    const ok = timed.filter((t) => t.result.check === "ok");
    const pass = (v: Variant, n: number) => (enc: StepEncoder) => {
      for (let i = 0; i < n; i++) recordTile(enc, s, v);
    };
    for (const t of ok) await timeDispatches(ctx, arena, timer, pass(t.v, 1));
    // Rounds of every variant once each: whatever drifts while a shape is timed (the GPU's clocks,
    // how its memory is mapped) falls on all variants alike, not on whichever ran first. Timed one
    // after another, the same product measured 2-4× apart (docs/PERFORMANCE.md "Prefill tiles").
    for (let r = 0; r < values.runs; r++) {
      for (const t of ok) {
        const n = values.dispatches;
        t.us.push((await timeDispatches(ctx, arena, timer, pass(t.v, n))) / n);
      }
    }
    for (const { result, us } of timed) {
      const mid = median(us);
      const timing = us.length
        ? { us: mid, tflops: flops / mid / 1e6, spread: Math.max(...us) / Math.min(...us) }
        : {};
      results.push({ ...result, ...timing });
      console.log(line({ ...result, ...timing }));
    }
    shapeMem.destroy();
  }
  if (values.out) {
    await Deno.writeTextFile(
      values.out,
      JSON.stringify({ gpu: ctx.summary, tokens: values.tokens, results }, null, 2),
    );
  }
  mem.destroy();
  ctx.device.destroy();
}

if (import.meta.main) await runCommand(PREFILL_MUL_MAT, main);
