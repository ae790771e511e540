// Kernel bench of steps of several sequences, a row each (engine/gpu/kernels/mul_mat.ts for T
// tokens): every product of one bench-model layer and its LM head at T = 1, 2, 4, ... 64 rows, in
// each way the engine can run it (prefill tiles; decode products taking 1, 2, 4 or 8 tokens a
// workgroup; the experts a (token, rank) slot a workgroup or gathered by expert; with --layouts
// more, every cu 16 layout too), each first checked bit for bit against the same rows multiplied
// one token at a time, then timed back to back on the GPU, a step size's variants in interleaved
// rounds. Inputs are normed rows (decode_matvec.ts times the folded norm); each token's experts
// are 8 distinct of 256, uniform, as a load-balanced router spreads them. Prints shape | T |
// variant | µs | GB/s (the weights each product needs, read once), then per product and T the old
// path (decode products to DECODE_MAX_TOKENS, tiles beyond) against the engine's choice and the
// best, and last one step's products over the model's 40 layers.
//
//   deno run -A bench/kernels/decode_steps.ts --gpu dawn [--tokens 1,2,4,8,16,32,64] [--out r.json]
//   deno run -A bench/kernels/decode_steps.ts --gpu builtin --shapes tiny --allow-software-gpu

import { GpuMemory, readBuffer } from "../../engine/gpu/buffers.ts";
import { type GpuContext, openGpu } from "../../engine/gpu/device.ts";
import { createStepTimer, ParamArena, StepEncoder } from "../../engine/gpu/encoder.ts";
import { gatherTiles, gatherWords, moeGather } from "../../engine/gpu/kernels/moe_gather.ts";
import {
  DECODE_MAX_TOKENS,
  decodeTokens,
  expertsPerSlot,
  matVecTakes,
  mulMat,
  type MulMatOptions,
  PREFILL_TT,
  tileFor,
} from "../../engine/gpu/kernels/mul_mat.ts";
import {
  decodeLayout,
  layoutName,
  type MatVecLayout,
  type MatVecTokens,
  PREFETCH_TYPES,
} from "../../engine/gpu/kernels/mul_mat_vec.ts";
import { PROVIDER_CHOICES } from "../../engine/gpu/provider.ts";
import type { GpuTensor } from "../../engine/gpu/tensor.ts";
import { GgmlType, rowBytes } from "../../engine/quant/ggml_types.ts";
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
import { rng } from "../../tests/_fuzz.ts";
import { randomBlocks } from "../../tools/synth/random_blocks.ts";
import { BENCH_MODEL, benchProducts, type ProductShape } from "./bench_shapes.ts";
import {
  distinct,
  median,
  randomF32,
  ROTATE_BYTES,
  type RoundTiming,
  sameLayout,
  timeInRounds,
  uploadRotated,
} from "./decode_matvec.ts";

/** A product of the model and how many times one step runs it. */
interface StepShape extends ProductShape {
  readonly perStep: number;
}

/** The bench model's products, each as often as a step of its 40 layers runs it. */
function fullShapes(): StepShape[] {
  const m = benchProducts();
  const p = BENCH_MODEL;
  const attention = p.nLayer / p.fullAttentionInterval;
  const perStep: Record<keyof typeof m, number> = {
    qkvzba: p.nLayer - attention,
    qkv: attention,
    outProj: p.nLayer,
    router: p.nLayer,
    sharedGateUp: p.nLayer,
    sharedDown: p.nLayer,
    expertsGateUp: p.nLayer,
    expertsDown: p.nLayer,
    lmHead: 1,
  };
  return (Object.keys(m) as (keyof typeof m)[]).map((k) => ({ ...m[k], perStep: perStep[k] }));
}

/**
 * CPU-adapter sizes: k = 2304 ends every window size in a partial one, 70 rows a partial row
 * tile; 16 experts of which a step of 8 tokens shares some.
 */
function tinyShapes(): StepShape[] {
  return [
    { name: "q8", type: GgmlType.Q8_0, rows: 70, k: 2304, perStep: 1 },
    { name: "q8 add", type: GgmlType.Q8_0, rows: 70, k: 256, add: true, perStep: 1 },
    {
      name: "iq4 experts",
      type: GgmlType.IQ4_XS,
      rows: 70,
      k: 512,
      experts: 16,
      nUsed: 4,
      perStep: 1,
    },
    {
      name: "iq4 down",
      type: GgmlType.IQ4_XS,
      rows: 70,
      k: 256,
      experts: 16,
      nUsed: 4,
      swiglu: true,
      perStep: 1,
    },
    { name: "q6 head", type: GgmlType.Q6_K, rows: 300, k: 256, perStep: 1 },
  ];
}

/** A shape's weights: copies of W at distinct addresses, so back-to-back products read memory. */
interface Weights {
  readonly shape: StepShape;
  readonly copies: readonly GpuTensor[];
  /** Bytes of one row (of one expert). */
  readonly rowBytes: number;
}

async function prepareWeights(ctx: GpuContext, mem: GpuMemory, shape: StepShape): Promise<Weights> {
  const { type, rows, k } = shape;
  const experts = shape.experts ?? 1;
  const bytes = randomBlocks(type, k * rows * experts, 0.05, rng(rows * 31 + k));
  const copies = await uploadRotated(ctx, mem, shape, bytes);
  return { shape, copies, rowBytes: rowBytes(type, k) };
}

/** One routing of a step's tokens: their expert ids, its gather table and what it reads. */
interface Routing {
  readonly ids: GPUBuffer;
  /** Each token's ids alone (the reference multiplies one token at a time). */
  readonly tokenIds: readonly GPUBuffer[];
  readonly table: GPUBuffer;
  readonly tiles: number;
  readonly distinct: number;
}

/** A step of T tokens of one shape: inputs, outputs, routings, and the product's options. */
interface Step {
  readonly T: number;
  readonly x: GPUBuffer;
  readonly y: GPUBuffer;
  readonly yInit: Float32Array<ArrayBuffer>;
  /** Expert products only: routings used in turn, so consecutive products read other experts. */
  readonly routings: readonly Routing[];
  readonly options: MulMatOptions;
  /** Weight bytes one product needs (every expert it uses once). */
  readonly bytes: number;
}

/**
 * A step of T tokens of `w`'s product: random inputs; for experts, routings of each token to
 * nUsed distinct experts, with their gather tables.
 */
function prepareStep(ctx: GpuContext, mem: GpuMemory, w: Weights, T: number): Step {
  const { shape } = w;
  const r = rng(T * 977 + shape.rows);
  const nUsed = shape.nUsed ?? 1;
  const E = shape.experts ?? 1;
  const id = shape.experts !== undefined;
  // Inputs: a row a token, or a row a (token, rank) slot for the experts' down; [gate | up]
  // under SwiGLU.
  const width = shape.swiglu ? 2 * shape.k : shape.k;
  const perSlot = id && shape.swiglu;
  const xStrideT = perSlot ? nUsed * width : width;
  const x = mem.upload("x", randomF32(T * xStrideT, r));
  const yStrideT = nUsed * shape.rows;
  const yInit = shape.add ? randomF32(T * yStrideT, r) : new Float32Array(T * yStrideT);
  const options: MulMatOptions = {
    tokens: T,
    nUsed: id ? nUsed : undefined,
    xStrideT,
    xStrideI: id ? (perSlot ? width : 0) : undefined,
    yStrideT,
    swiglu: shape.swiglu,
    upOffset: shape.swiglu ? shape.k : undefined,
    add: shape.add,
  };
  const routings: Routing[] = [];
  if (id) {
    // Enough routings that the experts of consecutive products are not still in L2.
    const once = Math.min(E, T * nUsed) * shape.rows * w.rowBytes;
    const count = Math.max(1, Math.min(32, Math.ceil((4 * ROTATE_BYTES) / once)));
    const enc = new StepEncoder(ctx, new ParamArena(mem, 4));
    for (let i = 0; i < count; i++) {
      const sets = Array.from({ length: T }, () => distinct(nUsed, E, r));
      const words = Uint32Array.from(sets.flat());
      const ids = mem.upload("ids", words);
      const table = mem.storage("gather table", 4 * gatherWords(T * nUsed, E, PREFILL_TT));
      moeGather(enc, { ids, table }, { slots: T * nUsed, experts: E, tt: PREFILL_TT });
      const tokenIds = i > 0 ? [] : sets.map((s) => mem.upload("token ids", Uint32Array.from(s)));
      routings.push({
        ids,
        tokenIds,
        table,
        tiles: gatherTiles(T * nUsed, E, PREFILL_TT),
        distinct: new Set(words).size,
      });
    }
    enc.submit();
  }
  const used = id ? median(routings.map((g) => g.distinct)) : 1;
  return {
    T,
    x,
    y: mem.storage("y", yInit.length * 4),
    yInit,
    routings,
    options,
    bytes: used * shape.rows * w.rowBytes,
  };
}

/** A way to run a product: its options, how the experts' slots reach it, what path it is. */
interface Variant {
  readonly name: string;
  readonly options: Pick<MulMatOptions, "tile" | "decode" | "decodeTokens">;
  /** Expert products: a slot a workgroup, or over the routing's gather table. */
  readonly gathered?: boolean;
  /** What mulMat picks for this step (and the forward pass for its experts). */
  readonly engine: boolean;
  /** What main ran before the multi-token decode products: decode to 4 tokens, tiles beyond. */
  readonly old: boolean;
}

/** Every cu 16 layout a multi-token variant is also timed in with --layouts more. */
const MORE_LAYOUTS: readonly MatVecLayout[] = [
  { wg: 128, cu: 16, rpt: 1, xstage: true },
  { wg: 128, cu: 16, rpt: 2, xstage: true },
  { wg: 256, cu: 16, rpt: 2, xstage: true },
  { wg: 256, cu: 16, rpt: 4, xstage: true },
];

/** The variants of a product of T tokens: the tiles, and decode products of each size. */
function variants(ctx: GpuContext, shape: StepShape, T: number, more: boolean): Variant[] {
  const id = shape.experts !== undefined;
  const decodeStep = T <= DECODE_MAX_TOKENS;
  // The forward pass runs the experts a slot a workgroup while its shared down is a decode product.
  const matvec = id ? expertsPerSlot(T, BENCH_MODEL.D) : matVecTakes(T, shape.rows);
  const out: Variant[] = [];
  // A layout's twins loading 2 and 4 chunks at a time, where the type and token count allow it.
  const burst = (l: MatVecLayout, n: MatVecTokens): MatVecLayout[] =>
    l.cu === 16 && n <= 2 && PREFETCH_TYPES.includes(shape.type)
      ? [{ ...l, burst: 2 }, { ...l, burst: 4 }]
      : [];
  if (id) {
    out.push({ name: "per slot", options: {}, engine: matvec, old: decodeStep });
    // A slot a workgroup in other layouts: more rows a workgroup share its staged input.
    const base = decodeLayout(shape.rows, true);
    const others = more ? MORE_LAYOUTS.filter((l) => !sameLayout(l, base)) : [];
    for (const layout of [...burst(base, 1), ...others.flatMap((l) => [l, ...burst(l, 1)])]) {
      out.push({
        name: `per slot ${layoutName(layout)}`,
        options: { decode: layout },
        engine: false,
        old: false,
      });
    }
  }
  if (T === 1) {
    if (!id) {
      out.push({ name: "t1", options: {}, engine: true, old: true });
      for (const layout of burst(decodeLayout(shape.rows, false), 1)) {
        out.push({
          name: `t1 ${layoutName(layout)}`,
          options: { decode: layout },
          engine: false,
          old: false,
        });
      }
    }
    return out;
  }
  const tile = tileFor(ctx, shape.rows, id);
  out.push({
    name: `${id ? "gathered " : ""}tiles ${tile.rows}x${tile.tokens}`,
    options: { tile },
    gathered: id,
    engine: !matvec,
    old: !decodeStep,
  });
  // A layout of 32 or 64 lanes a row takes one token a workgroup whatever it is asked.
  const named = (n: MatVecTokens, layout: MatVecLayout) =>
    `${id ? "gathered " : ""}t${layout.cu === 16 ? n : 1} ${layoutName(layout)}`;
  const chosen = decodeTokens(T, { gathered: id, rows: shape.rows });
  const engineName = named(chosen, decodeLayout(shape.rows, id, chosen));
  const engine = matvec && !id;
  const sizes: MatVecTokens[] = T === 2 ? [1, 2] : T <= 4 ? [1, 2, 4] : [2, 4, 8];
  const seen = new Set<string>();
  for (const n of sizes) {
    const base = decodeLayout(shape.rows, id, n);
    const layouts = more && n >= 4
      ? [base, ...MORE_LAYOUTS.filter((l) => !sameLayout(l, base))]
      : [base, ...burst(base, n)];
    for (const layout of layouts) {
      const name = named(n, layout);
      if (seen.has(name)) continue;
      seen.add(name);
      const chosenHere = engine && name === engineName;
      out.push({
        name,
        options: { decodeTokens: n, decode: layout },
        gathered: id,
        engine: chosenHere,
        old: chosenHere && decodeStep,
      });
    }
  }
  return out;
}

/** Records `n` products of the variant, each on the next copy of W and the next routing. */
function record(enc: StepEncoder, w: Weights, s: Step, v: Variant, n: number): void {
  for (let i = 0; i < n; i++) {
    const copy = w.copies[i % w.copies.length];
    const routing = s.routings[i % Math.max(1, s.routings.length)];
    const o = { ...s.options, ...v.options };
    if (!routing) mulMat(enc, { w: copy, x: s.x, y: s.y }, o);
    else if (v.gathered) {
      mulMat(enc, { w: copy, x: s.x, y: s.y, ids: routing.table }, {
        ...o,
        gatherTiles: routing.tiles,
      });
    } else mulMat(enc, { w: copy, x: s.x, y: s.y, ids: routing.ids }, o);
  }
}

/** y after `recordAll`, from its initial values; undefined and the GPU's message if refused. */
async function run(
  ctx: GpuContext,
  arena: ParamArena,
  s: Step,
  recordAll: (enc: StepEncoder) => void,
): Promise<Float32Array | string> {
  ctx.device.queue.writeBuffer(s.y, 0, s.yInit);
  const enc = new StepEncoder(ctx, arena);
  ctx.device.pushErrorScope("validation");
  try {
    recordAll(enc);
  } catch (e) {
    await ctx.device.popErrorScope();
    return `rejected: ${(e as Error).message}`;
  }
  enc.submit();
  const error = await ctx.device.popErrorScope();
  if (error) return `rejected: ${error.message}`;
  return new Float32Array(await readBuffer(ctx, s.y, 0, s.yInit.length * 4));
}

/** The step's outputs one token at a time (each token's own call, its own ids). */
function reference(ctx: GpuContext, arena: ParamArena, w: Weights, s: Step) {
  const o = s.options;
  return run(ctx, arena, s, (enc) => {
    for (let t = 0; t < s.T; t++) {
      const ids = s.routings[0]?.tokenIds[t];
      mulMat(enc, { w: w.copies[0], x: s.x, y: s.y, ids }, {
        ...o,
        tokens: 1,
        xOffset: t * o.xStrideT!,
        yOffset: t * o.yStrideT!,
      });
    }
  });
}

/** "ok", or where the variant's bits first differ from the reference's. */
function compare(got: Float32Array, want: Float32Array, init: Float32Array): string {
  if (!want.some((v, i) => v !== init[i])) return "wrong: the reference changed nothing";
  for (let i = 0; i < want.length; i++) {
    if (!Object.is(got[i], want[i])) {
      return `bits differ at y[${i}]: ${got[i]} against ${want[i]} a token at a time`;
    }
  }
  return "ok";
}

interface Result {
  readonly shape: string;
  readonly T: number;
  readonly variant: string;
  readonly engine: boolean;
  readonly old: boolean;
  readonly gathered: boolean;
  readonly us?: number;
  readonly gbs?: number;
  /** "ok", or why it was not timed. */
  readonly check: string;
}

/** GPU µs a product of `recordN`, back to back, passes of about `passUs`. */
function timeProduct(
  ctx: GpuContext,
  arena: ParamArena,
  timer: ReturnType<typeof createStepTimer>,
  recordN: (enc: StepEncoder, n: number) => void,
  o: RoundTiming,
): Promise<number> {
  return timeInRounds(arena, timer, [{ ctx, recordN }], o).then(([us]) => us);
}

const DECODE_STEPS = {
  name: "Decode steps bench",
  usage: "deno run -A bench/kernels/decode_steps.ts",
  about:
    "Checks then times the products of steps of 1 to 64 rows in every way the engine can run them.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
    shapes: flag(
      oneOf(["full", "tiny"] as const),
      "the bench model's shapes, or CPU-sized ones",
      "full",
    ),
    tokens: flag(listOf(whole(1, 512)), "the step sizes (rows)", [1, 2, 4, 8, 16, 32, 64]),
    layouts: flag(
      oneOf(["engine", "more"] as const),
      "each token count in its default layout, or also in every cu 16 layout",
      "engine",
    ),
    only: flag(text("NAME,..."), "shapes whose name contains one of these"),
    "pass-us": flag(whole(1), "GPU microseconds a timed pass aims at", 4000),
    dispatches: flag(whole(2), "products a timed pass at most", 100),
    runs: flag(whole(1), "timed rounds, each timing every variant once (the median is kept)", 3),
    "deadline-s": flag(whole(1), "stop starting variants after this many seconds", 100000),
    out: flag(text("FILE"), "write every result here as JSON"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof DECODE_STEPS.flags>): Promise<void> {
  const started = performance.now();
  const elapsed = () => (performance.now() - started) / 1000;
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });
  const mem = new GpuMemory(ctx);
  const timer = createStepTimer(mem);
  if (!timer) console.log("no timestamp-query: times are wall clock per pass");
  const arena = new ParamArena(mem, 16);
  const all = values.shapes === "full" ? fullShapes() : tinyShapes();
  const only = values.only?.split(",");
  const shapes = only ? all.filter((s) => only.some((o) => s.name.includes(o))) : all;
  const timing: RoundTiming = {
    passUs: values["pass-us"],
    most: values.dispatches,
    runs: values.runs,
  };
  const results: Result[] = [];
  /** µs of moe_gather by T: every gathered product of a layer shares one. */
  const gatherUs = new Map<number, number>();
  for (const shape of shapes) {
    const shapeMem = new GpuMemory(ctx);
    const w = await prepareWeights(ctx, shapeMem, shape);
    for (const T of values.tokens) {
      const stepMem = new GpuMemory(ctx);
      const s = prepareStep(ctx, stepMem, w, T);
      const want = await reference(ctx, arena, w, s);
      if (shape.experts && T > 1 && !gatherUs.has(T)) {
        const slots = T * shape.nUsed!;
        const g = s.routings[0];
        const us = await timeProduct(ctx, arena, timer, (enc, n) => {
          for (let i = 0; i < n; i++) {
            moeGather(enc, { ids: g.ids, table: g.table }, {
              slots,
              experts: shape.experts!,
              tt: PREFILL_TT,
            });
          }
        }, timing);
        gatherUs.set(T, us);
        console.log(`moe_gather | ${T} | ${slots} slots | ${us.toFixed(2)} µs`);
      }
      // Every variant checked first, then the ones that passed timed in interleaved rounds.
      const checked: { v: Variant; result: Result }[] = [];
      for (const v of variants(ctx, shape, T, values.layouts === "more")) {
        const base = {
          shape: shape.name,
          T,
          variant: v.name,
          engine: v.engine,
          old: v.old,
          gathered: !!v.gathered,
        };
        let check: string;
        if (elapsed() > values["deadline-s"]) check = "skipped: deadline";
        else if (typeof want === "string") check = `reference ${want}`;
        else {
          const got = await run(ctx, arena, s, (enc) => record(enc, w, s, v, 1));
          check = typeof got === "string" ? got : compare(got, want, s.yInit);
        }
        checked.push({ v, result: { ...base, check } });
      }
      const timed = checked.filter((c) => c.result.check === "ok");
      const us = await timeInRounds(
        arena,
        timer,
        timed.map(({ v }) => ({
          ctx,
          recordN: (enc: StepEncoder, n: number) => record(enc, w, s, v, n),
        })),
        timing,
      );
      const timedUs = new Map(timed.map((c, i) => [c, us[i]]));
      for (const c of checked) {
        const u = timedUs.get(c);
        const result = u === undefined ? c.result : { ...c.result, us: u, gbs: s.bytes / u / 1e3 };
        results.push(result);
        console.log(line(result));
      }
      stepMem.destroy();
    }
    shapeMem.destroy();
  }
  console.log(`\n${ctx.summary}`);
  console.log(productTable(results, gatherUs));
  console.log(stepTable(results, shapes, gatherUs));
  if (values.out) {
    await Deno.writeTextFile(
      values.out,
      JSON.stringify(
        { device: ctx.summary, provider: ctx.provider, results, gather: [...gatherUs] },
        null,
        1,
      ),
    );
  }
  mem.destroy();
  ctx.device.destroy();
}

function line(r: Result): string {
  const tag = `${r.engine ? " (engine)" : ""}${r.old ? " (old)" : ""}`;
  if (r.us === undefined) {
    return `${r.shape} | ${r.T} | ${r.variant}${tag} | ${r.check.slice(0, 300)}`;
  }
  return `${r.shape} | ${r.T} | ${r.variant}${tag} | ${r.us.toFixed(2)} µs | ${
    r.gbs!.toPrecision(3)
  } GB/s`;
}

/** A product's cost in a step: its µs, and half a moe_gather where it reads a gather table. */
function cost(r: Result, gatherUs: Map<number, number>): number {
  return r.us! + (r.gathered ? (gatherUs.get(r.T) ?? 0) / 2 : 0);
}

/** The old path's, the engine's and the best timed variant of one product at one T. */
function picks(mine: Result[], gatherUs: Map<number, number>) {
  const timed = mine.filter((r) => r.us !== undefined);
  const best = timed.reduce<Result | undefined>(
    (b, r) => (b === undefined || cost(r, gatherUs) < cost(b, gatherUs) ? r : b),
    undefined,
  );
  return { old: timed.find((r) => r.old), engine: timed.find((r) => r.engine), best };
}

/** Per product and T: old µs, the engine's µs and GB/s, the best variant; failures after. */
function productTable(results: Result[], gatherUs: Map<number, number>): string {
  const rows = [
    "product | T | old µs | engine µs | engine GB/s | best µs (variant) | old / engine (gathered: + ½ moe_gather)",
  ];
  const fmt = (r: Result | undefined) => r ? cost(r, gatherUs).toFixed(1) : "-";
  for (const shape of new Set(results.map((r) => r.shape))) {
    for (const T of new Set(results.filter((r) => r.shape === shape).map((r) => r.T))) {
      const { old, engine, best } = picks(
        results.filter((r) => r.shape === shape && r.T === T),
        gatherUs,
      );
      const ratio = old && engine ? (cost(old, gatherUs) / cost(engine, gatherUs)).toFixed(2) : "-";
      rows.push(
        `${shape} | ${T} | ${fmt(old)} | ${fmt(engine)} ${engine?.variant ?? ""} | ${
          engine?.gbs?.toPrecision(3) ?? "-"
        } | ${fmt(best)} ${best?.variant ?? ""} | ${ratio}`,
      );
    }
  }
  const failed = results.filter((r) => r.check !== "ok" && !r.check.startsWith("skipped"));
  for (const r of failed) rows.push(line(r));
  return rows.join("\n");
}

/** One step's products (each × its count in a step): old, engine and best ms by T. */
function stepTable(
  results: Result[],
  shapes: readonly StepShape[],
  gatherUs: Map<number, number>,
): string {
  const rows = [
    "\nstep of T rows: the products summed over the layers | old ms | engine ms | best ms",
  ];
  for (const T of new Set(results.map((r) => r.T))) {
    const sums = { old: 0, engine: 0, best: 0 };
    let complete = true;
    for (const shape of shapes) {
      const mine = results.filter((r) => r.shape === shape.name && r.T === T);
      const p = picks(mine, gatherUs);
      for (const k of ["old", "engine", "best"] as const) {
        const r = p[k];
        if (r) sums[k] += (shape.perStep * cost(r, gatherUs)) / 1000;
        else complete = false;
      }
    }
    rows.push(
      `T = ${T}${complete ? "" : " (some products missing)"} | ${sums.old.toFixed(2)} | ${
        sums.engine.toFixed(2)
      } | ${sums.best.toFixed(2)}`,
    );
  }
  return rows.join("\n");
}

if (import.meta.main) await runCommand(DECODE_STEPS, main);
