// Kernel bench of the tensor-core prefill products (engine/gpu/kernels/mul_mat_mma.ts) beside the
// engine's f32 tiles (wgsl/mul_mat.wgsl) on the bench model's shapes, at each of --tokens, experts
// routed unevenly as routers do. Every tensor-core tile of the engine's precision ("split": f16
// pairs, three products) is checked (close to the f32 tile, the same bits in every tile, a few
// tokens run alone giving their bits in the run), and the single-product precision ("f16") in the
// tile it would take, for what the accuracy costs; then all are timed in rounds. Prints a line a
// variant with its distance from the f32 tile, then, last, each shape's best split tile against
// the f32 tile and the f16 products, and what the products of a whole prefill of the model take
// each way.
//
//   deno run -A bench/kernels/prefill_mma.ts --gpu dawn [--tokens 512,2048] [--out r.json]
//   deno run -A bench/kernels/prefill_mma.ts --gpu builtin --shapes tiny --emulate --allow-software-gpu

import { GpuMemory, readBuffer } from "../../engine/gpu/buffers.ts";
import { type GpuContext, openGpu } from "../../engine/gpu/device.ts";
import { createStepTimer, ParamArena, StepEncoder } from "../../engine/gpu/encoder.ts";
import { gatherTiles, gatherWords, moeGather } from "../../engine/gpu/kernels/moe_gather.ts";
import { mulMat, PREFILL_TT } from "../../engine/gpu/kernels/mul_mat.ts";
import {
  type MmaPrecision,
  mmaScratchBytes,
  mmaStagesF32,
  type MmaTile,
  mmaTileFor,
  mmaWorkgroupBytes,
} from "../../engine/gpu/kernels/mul_mat_mma.ts";
import { PROVIDER_CHOICES } from "../../engine/gpu/provider.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  listOf,
  oneOf,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../../lib/cli.ts";
import { BENCH_MODEL, benchProducts } from "./bench_shapes.ts";
import { median, timeDispatches } from "./decode_matvec.ts";
import {
  fullShapes,
  prepare,
  type Setup,
  type TileShape,
  tinyShapes,
  uploadShape,
} from "./prefill_mul_mat.ts";

/** The f32 tile the engine picks (no `tile`), or a tensor-core tile of one precision. */
interface Variant {
  readonly name: string;
  readonly tile?: MmaTile;
  readonly precision?: MmaPrecision;
}

const DENSE_TILES: readonly MmaTile[] = [
  { rows: 128, tokens: 128, stages: 1 },
  { rows: 128, tokens: 64, stages: 1 },
  { rows: 64, tokens: 128, stages: 1 },
  { rows: 64, tokens: 64, stages: 2 },
  { rows: 64, tokens: 64, stages: 1 },
  { rows: 128, tokens: 32, stages: 2 },
];
const GATHERED_TILES: readonly MmaTile[] = [
  { rows: 128, tokens: 32, stages: 2 },
  { rows: 64, tokens: 32, stages: 2 },
  { rows: 128, tokens: 32, stages: 1 },
  { rows: 64, tokens: 32, stages: 1 },
];

/** Relative distance from the f32 tile a variant may keep: f32's rounding, or f16's. */
const CHECK_BOUND: Readonly<Record<MmaPrecision, number>> = { split: 1e-4, f16: 3e-3 };

function tileName(t: MmaTile): string {
  return `r${t.rows}t${t.tokens}s${t.stages}`;
}

/**
 * The f32 tile, then the split tiles the device holds (* marks mmaTileFor's), then under "f16"
 * the single-product variant in the tile mmaTileFor gives it.
 */
function variantsOf(
  ctx: GpuContext,
  shape: TileShape,
  tokens: number,
  emulate: boolean,
  precisions: readonly MmaPrecision[],
): Variant[] {
  const id = !!shape.experts;
  const slots = id ? PREFILL_TT : tokens;
  const stageF32 = mmaStagesF32(ctx, emulate);
  const variants: Variant[] = [{ name: "f32*" }];
  if (precisions.includes("split")) {
    const chosen = mmaTileFor(ctx, shape.rows, slots, id, emulate);
    const tiles = [chosen, ...(id ? GATHERED_TILES : DENSE_TILES)].filter((t, i, all) =>
      all.findIndex((u) => tileName(u) === tileName(t)) === i &&
      mmaWorkgroupBytes(t, stageF32) <= ctx.limits.maxComputeWorkgroupStorageSize
    );
    variants.push(...tiles.map((tile, i) => ({
      name: `${tileName(tile)}${i === 0 ? "*" : ""}`,
      tile,
      precision: "split" as const,
    })));
  }
  if (precisions.includes("f16")) {
    const tile = mmaTileFor(ctx, shape.rows, slots, id, emulate, "f16");
    variants.push({ name: `f16 ${tileName(tile)}`, tile, precision: "f16" });
  }
  return variants;
}

/** The scratch of a shape's tensor-core products: a row a token, or a token's every rank. */
function scratchFor(mem: GpuMemory, shape: TileShape, tokens: number): GPUBuffer {
  const ranks = shape.experts && shape.swiglu ? (shape.nUsed ?? 1) : 1;
  return mem.storage("mma scratch", mmaScratchBytes(mem.ctx, tokens * ranks, shape.k));
}

function record(
  enc: StepEncoder,
  s: Setup,
  v: Variant,
  mmaX: GPUBuffer,
  emulate: boolean,
): void {
  const mma = v.tile
    ? { mma: true, mmaTile: v.tile, mmaPrecision: v.precision, mmaEmulate: emulate }
    : {};
  mulMat(enc, { w: s.w, x: s.x, y: s.y, ids: s.table, mmaX }, { ...s.options, ...mma });
}

/** Runs `recordAll` on y from its initial values and reads y back; throws a validation error. */
async function runY(
  ctx: GpuContext,
  arena: ParamArena,
  s: Setup,
  recordAll: (enc: StepEncoder) => void,
): Promise<Float32Array> {
  ctx.device.queue.writeBuffer(s.y, 0, s.yInit);
  const enc = new StepEncoder(ctx, arena);
  recordAll(enc);
  ctx.device.pushErrorScope("validation");
  enc.submit();
  const error = await ctx.device.popErrorScope();
  if (error) throw new Error(error.message);
  return new Float32Array(await readBuffer(ctx, s.y, 0, s.yInit.byteLength));
}

/** ‖(a − y0) − (b − y0)‖ / ‖b − y0‖: the products' difference, whatever y started from. */
function relError(a: Float32Array, b: Float32Array, y0: Float32Array): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < b.length; i++) {
    d += ((a[i] - y0[i]) - (b[i] - y0[i])) ** 2;
    n += (b[i] - y0[i]) ** 2;
  }
  return Math.sqrt(d / n);
}

/** The first value whose bits differ, as a verdict; "" when all agree. */
function firstDiff(a: Float32Array, b: Float32Array, from: number, to: number, what: string) {
  for (let i = from; i < to; i++) {
    if (!Object.is(a[i], b[i])) return `bits differ from ${what} at y[${i}]: ${a[i]}, ${b[i]}`;
  }
  return "";
}

/**
 * Tokens `checked`, each alone in a run of one (experts: over a gather table of its own slots),
 * against their outputs in the whole run `whole`.
 */
async function checkAlone(
  ctx: GpuContext,
  mem: GpuMemory,
  arena: ParamArena,
  s: Setup,
  v: Variant,
  mmaX: GPUBuffer,
  emulate: boolean,
  whole: Float32Array,
  checked: readonly number[],
): Promise<string> {
  const { gatherTiles: _, ...o } = s.options;
  const nUsed = o.nUsed ?? 1;
  const experts = s.w.experts;
  const alone = await runY(ctx, arena, s, (enc) => {
    for (const t of checked) {
      const at = { tokens: 1, xOffset: t * s.xStride, yOffset: t * s.yStride };
      const mma = { mma: true, mmaTile: v.tile, mmaPrecision: v.precision, mmaEmulate: emulate };
      let ids: GPUBuffer | undefined;
      let own: { gatherTiles: number } | undefined;
      if (s.table) {
        ids = mem.storage("table", 4 * gatherWords(nUsed, experts, PREFILL_TT));
        moeGather(enc, { ids: s.tokenIds[t], table: ids }, {
          slots: nUsed,
          experts,
          tt: PREFILL_TT,
        });
        own = { gatherTiles: gatherTiles(nUsed, experts, PREFILL_TT) };
      }
      mulMat(enc, { w: s.w, x: s.x, y: s.y, ids, mmaX }, { ...o, ...at, ...mma, ...own });
    }
  });
  for (const t of checked) {
    const diff = firstDiff(alone, whole, t * s.yStride, (t + 1) * s.yStride, "the whole run");
    if (diff) return `token ${t} alone: ${diff}`;
  }
  return "ok";
}

/** A variant's verdict ("ok" lets it be timed) and its distance from the f32 tile. */
interface Checked {
  readonly verdict: string;
  readonly err?: number;
}

/**
 * The variants' verdicts: the f32 tile runs; each tensor-core variant must stay within its
 * precision's CHECK_BOUND of it and give the first tile's bits of its precision, and (the first
 * of each precision) give a few tokens run alone their bits in the whole run.
 */
async function check(
  ctx: GpuContext,
  mem: GpuMemory,
  arena: ParamArena,
  s: Setup,
  variants: readonly Variant[],
  mmaX: GPUBuffer,
  emulate: boolean,
): Promise<Checked[]> {
  const checked: Checked[] = [];
  let f32: Float32Array | undefined;
  const first = new Map<MmaPrecision, { name: string; out: Float32Array }>();
  const alone = [...new Set([0, 1, Math.floor(s.tokens / 2), s.tokens - 1])];
  for (const v of variants) {
    try {
      const out = await runY(ctx, arena, s, (enc) => record(enc, s, v, mmaX, emulate));
      if (!v.tile || !v.precision) {
        f32 = out;
        checked.push({
          verdict: out.some((x, i) => x !== s.yInit[i]) ? "ok" : "wrong: nothing written",
        });
        continue;
      }
      if (!out.every(Number.isFinite)) {
        checked.push({ verdict: "wrong: values that are not finite" });
        continue;
      }
      const err = relError(out, f32!, s.yInit);
      if (!(err <= CHECK_BOUND[v.precision])) {
        checked.push({ verdict: `wrong: ${err.toExponential(2)} from the f32 tile`, err });
        continue;
      }
      const before = first.get(v.precision);
      if (before) {
        const diff = firstDiff(out, before.out, 0, out.length, before.name);
        checked.push({ verdict: diff || "ok", err });
        continue;
      }
      first.set(v.precision, { name: v.name, out });
      const verdict = await checkAlone(ctx, mem, arena, s, v, mmaX, emulate, out, alone);
      checked.push({ verdict, err });
    } catch (e) {
      checked.push({ verdict: `rejected: ${(e as Error).message}` });
    }
  }
  return checked;
}

interface Result {
  readonly shape: string;
  readonly tokens: number;
  readonly variant: string;
  /** The tensor-core variants' precision (none: the f32 tile). */
  readonly precision?: MmaPrecision;
  readonly us?: number;
  readonly tflops?: number;
  /** The slowest timed pass over the fastest. */
  readonly spread?: number;
  /** ‖out − f32 tile‖ / ‖f32 tile‖ (tensor-core variants). */
  readonly err?: number;
  readonly check: string;
}

function line(r: Result): string {
  const us = r.us === undefined
    ? ""
    : `${r.us.toFixed(1)} µs  ${r.tflops!.toFixed(1)} TFLOPS  ×${r.spread!.toFixed(2)}`;
  const err = r.err === undefined ? "" : `Δ ${r.err.toExponential(1)}`;
  return `${r.shape.padEnd(22)} T${String(r.tokens).padEnd(5)} ${r.variant.padEnd(15)} ${
    us.padEnd(36)
  } ${err.padEnd(10)} ${r.check}`;
}

/**
 * The model's products in a prefill: the shapes of benchProducts by name, times the layers that
 * run them (every fullAttentionInterval-th layer attention, the rest DeltaNet; the LM head runs
 * only the last position, so none).
 */
function layersRunning(): Map<string, number> {
  const p = benchProducts();
  const layers = BENCH_MODEL.nLayer;
  const attention = Math.floor(layers / BENCH_MODEL.fullAttentionInterval);
  const counts = new Map(Object.values(p).map((s) => [s.name, layers]));
  counts.set(p.qkvzba.name, layers - attention);
  counts.set(p.qkv.name, attention);
  counts.set(p.lmHead.name, 0);
  return counts;
}

/**
 * The closing table: each shape's f32 tile against its fastest split tile (and the f16 products,
 * where timed), per token count; with the full shapes, what the products of a prefill of each
 * --tokens length take each way.
 */
function summary(results: readonly Result[], tokensList: readonly number[], full: boolean) {
  const out = [
    "",
    `${"shape".padEnd(22)} ${"T".padEnd(5)} ${"f32 µs".padStart(9)} ${"TFLOPS".padStart(7)}  ${
      "best split".padEnd(11)
    } ${"µs".padStart(9)} ${"TFLOPS".padStart(7)} ${"×".padStart(6)} ${"f16 µs".padStart(9)}`,
  ];
  const counts = layersRunning();
  for (const tokens of [...new Set(results.map((r) => r.tokens))]) {
    const total = { f32: 0, split: 0, f16: 0 };
    let covered = true;
    let f16Covered = true;
    const rows = results.filter((r) => r.tokens === tokens);
    for (const shape of [...new Set(rows.map((r) => r.shape))]) {
      const of = rows.filter((r) => r.shape === shape && r.us !== undefined);
      const f32 = of.find((r) => !r.precision);
      const best = of.filter((r) => r.precision === "split").sort((a, b) => a.us! - b.us!)[0];
      const f16 = of.find((r) => r.precision === "f16");
      const n = counts.get(shape) ?? 0;
      if (!f32 || !best) {
        if (n) covered = false;
        out.push(`${shape.padEnd(22)} ${String(tokens).padEnd(5)} (not timed: see above)`);
        continue;
      }
      out.push(
        `${shape.padEnd(22)} ${String(tokens).padEnd(5)} ${f32.us!.toFixed(1).padStart(9)} ${
          f32.tflops!.toFixed(1).padStart(7)
        }  ${best.variant.padEnd(11)} ${best.us!.toFixed(1).padStart(9)} ${
          best.tflops!.toFixed(1).padStart(7)
        } ${(f32.us! / best.us!).toFixed(2).padStart(6)} ${
          (f16 ? f16.us!.toFixed(1) : "-").padStart(9)
        }`,
      );
      total.f32 += n * f32.us!;
      total.split += n * best.us!;
      if (f16) total.f16 += n * f16.us!;
      else if (n) f16Covered = false;
    }
    const every = [...counts].every(([name, n]) => !n || rows.some((r) => r.shape === name));
    if (full && covered && every && tokensList.includes(tokens)) {
      const way = (what: string, us: number) =>
        `${what} ${(us / 1000).toFixed(1)} ms (${(tokens / (us / 1e6)).toFixed(0)} tok/s)`;
      const ways = [way("f32", total.f32), way("split", total.split)];
      if (f16Covered) ways.push(way("f16", total.f16));
      out.push(
        `products of a ${tokens}-token prefill (${BENCH_MODEL.nLayer} layers): ${ways.join(", ")}`,
      );
    }
  }
  return out.join("\n");
}

const PREFILL_MMA = {
  name: "Prefill tensor-core bench",
  usage: "deno run -A bench/kernels/prefill_mma.ts",
  about:
    "Checks then times the tensor-core prefill products in each tile beside the f32 tiles, on the bench model's shapes.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
    shapes: flag(
      oneOf(["full", "tiny"] as const),
      "the bench model's shapes, or CPU-sized ones",
      "full",
    ),
    tokens: flag(listOf(whole(1)), "prefill lengths to run each shape at", [512, 2048]),
    dispatches: flag(whole(1), "back-to-back products a timed pass", 4),
    runs: flag(whole(1), "rounds of timed passes, one per variant each (the median is kept)", 5),
    only: flag(text("NAME,..."), "shapes whose name contains one of these"),
    uniform: switchFlag("route every expert equally often (default: log-normal popularity)"),
    emulate: switchFlag("emulate the matrix operations (any device; for checking, not timing)"),
    precision: flag(
      listOf(oneOf(["split", "f16"] as const)),
      "tensor-core precisions: split (the engine's, every tile) and f16 (one product, its tile)",
      ["split"],
    ),
    out: flag(text("FILE"), "write every result here as JSON"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof PREFILL_MMA.flags>): Promise<void> {
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });
  const emulate = values.emulate;
  console.log(
    `subgroup matrices: ${ctx.features.subgroupMatrix ? "yes" : "no"}${
      emulate ? " (emulated here)" : ""
    }; workgroup memory ${ctx.limits.maxComputeWorkgroupStorageSize} bytes`,
  );
  if (!ctx.features.subgroupMatrix && !emulate) {
    console.log("no tensor cores: the mma lines below run today's kernels (or use --emulate)");
  }
  const mem = new GpuMemory(ctx);
  const timer = createStepTimer(mem);
  if (!timer) console.log("no timestamp-query: times are wall clock per pass");
  const arena = new ParamArena(mem, 64);
  const results: Result[] = [];
  const full = values.shapes === "full";
  const all = full ? fullShapes() : tinyShapes();
  const only = values.only?.split(",");
  for (const shape of only ? all.filter((s) => only.some((o) => s.name.includes(o))) : all) {
    const weightMem = new GpuMemory(ctx);
    const w = await uploadShape(weightMem, shape);
    // A shape of its own length (the LM head's chunk) runs once.
    const lengths = shape.tokens ? [shape.tokens] : values.tokens;
    for (const tokens of lengths) {
      const runMem = new GpuMemory(ctx);
      const s = prepare(ctx, runMem, shape, tokens, w, !values.uniform);
      const mmaX = scratchFor(runMem, shape, tokens);
      const variants = variantsOf(ctx, shape, tokens, emulate, values.precision);
      const checked = await check(ctx, runMem, arena, s, variants, mmaX, emulate);
      const ok = variants.filter((_, i) => checked[i].verdict === "ok");
      const pass = (v: Variant, n: number) => (enc: StepEncoder) => {
        for (let i = 0; i < n; i++) record(enc, s, v, mmaX, emulate);
      };
      const us = new Map<Variant, number[]>(ok.map((v) => [v, []]));
      for (const v of ok) await timeDispatches(ctx, arena, timer, pass(v, 1));
      // Rounds of every variant once each, so drift falls on all alike (prefill_mul_mat.ts).
      for (let r = 0; r < values.runs; r++) {
        for (const v of ok) {
          const n = values.dispatches;
          us.get(v)!.push((await timeDispatches(ctx, arena, timer, pass(v, n))) / n);
        }
      }
      // The product's own flops (a split product runs three times as many on the tensor cores).
      const flops = 2 * shape.rows * shape.k * tokens * (shape.nUsed ?? 1);
      variants.forEach((v, i) => {
        const times = us.get(v);
        const timing = times
          ? {
            us: median(times),
            tflops: flops / median(times) / 1e6,
            spread: Math.max(...times) / Math.min(...times),
          }
          : {};
        const result: Result = {
          shape: shape.name,
          tokens,
          variant: v.name,
          precision: v.precision,
          check: checked[i].verdict,
          err: checked[i].err,
          ...timing,
        };
        results.push(result);
        console.log(line(result));
      });
      runMem.destroy();
    }
    weightMem.destroy();
  }
  console.log(summary(results, values.tokens, full));
  if (values.out) {
    await Deno.writeTextFile(
      values.out,
      JSON.stringify({ gpu: ctx.summary, emulate, results }, null, 2),
    );
  }
  mem.destroy();
  ctx.device.destroy();
}

if (import.meta.main) await runCommand(PREFILL_MMA, main);
