// Kernel bench of the decode matrix-vector products (engine/gpu/kernels/mul_mat_vec.ts): every
// layout on the bench model's real shapes, each first checked against the CPU dequantizer and,
// bit for bit, against the default layout, then timed back to back on the GPU, a shape's variants
// in interleaved rounds. Prints
// shape | variant | µs | GB/s | % of a copy's bandwidth measured in the same run (or --peak-gbs).
//
//   deno run -A bench/kernels/decode_matvec.ts --gpu dawn --shapes full [--out r.json]
//   deno run -A bench/kernels/decode_matvec.ts --gpu builtin --shapes tiny --allow-software-gpu

import { createStorage, GpuMemory, readBuffer } from "../../engine/gpu/buffers.ts";
import { type GpuContext, openGpu } from "../../engine/gpu/device.ts";
import { createStepTimer, ParamArena, StepEncoder } from "../../engine/gpu/encoder.ts";
import { compileKernel } from "../../engine/gpu/kernel.ts";
import { mulMat, type MulMatOptions, mulMatPair } from "../../engine/gpu/kernels/mul_mat.ts";
import { MOE_SUM, moeDownSum, moeSum } from "../../engine/gpu/kernels/moe_sum.ts";
import { ssmConv } from "../../engine/gpu/kernels/ssm_conv.ts";
import { moeRoute } from "../../engine/gpu/kernels/moe_route.ts";
import {
  decodeLayout,
  layoutName,
  type MatVecLayout,
  MUL_MAT_VEC,
  type MulMatVecKey,
  workgroupBytes,
} from "../../engine/gpu/kernels/mul_mat_vec.ts";
import { PROVIDER_CHOICES } from "../../engine/gpu/provider.ts";
import { type GpuTensor, uploadTensorBytes } from "../../engine/gpu/tensor.ts";
import { dequantize } from "../../engine/quant/dequant.ts";
import { GgmlType, rowBytes } from "../../engine/quant/ggml_types.ts";
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
import { rng } from "../../tests/_fuzz.ts";
import { randomBlocks } from "../../tools/synth/random_blocks.ts";
import { BENCH_MODEL, benchProducts, type ProductShape } from "./bench_shapes.ts";

/** One decode product: a product of the model, or a CPU-sized one with the same epilogues. */
export interface MatVecShape extends ProductShape {
  /** The experts' products summed by routing weight with a shared expert (moeDownSum). */
  readonly sum?: boolean;
}

/**
 * The decode products of one qwen35moe-35b layer and its LM head, the experts' down products
 * summed as a decode step sums them.
 */
function fullShapes(): MatVecShape[] {
  const m = benchProducts();
  return Object.values({
    ...m,
    expertsDown: { ...m.expertsDown, name: "experts down+sum", sum: true },
  });
}

/**
 * CPU-adapter sizes with the same epilogues: k = 2560 takes two windows and leaves classes of
 * unequal length; 70 rows end in a partial tile; k = 96 has fewer chunks than classes.
 */
function tinyShapes(): MatVecShape[] {
  return [
    { name: "q8 norm", type: GgmlType.Q8_0, rows: 70, k: 2560, norm: true },
    { name: "q8 add", type: GgmlType.Q8_0, rows: 70, k: 2560, add: true },
    { name: "f32 norm", type: GgmlType.F32, rows: 9, k: 256, norm: true },
    { name: "q8 swiglu", type: GgmlType.Q8_0, rows: 37, k: 96, swiglu: true },
    {
      name: "iq4 experts",
      type: GgmlType.IQ4_XS,
      rows: 70,
      k: 512,
      experts: 4,
      nUsed: 3,
      norm: true,
    },
    {
      name: "iq4 down+sum",
      type: GgmlType.IQ4_XS,
      rows: 70,
      k: 256,
      experts: 4,
      nUsed: 3,
      swiglu: true,
      sum: true,
    },
    { name: "q6 head", type: GgmlType.Q6_K, rows: 300, k: 256, norm: true },
  ];
}

/**
 * The layouts tried, likelier winners first (a shape's share of the deadline may end its list):
 * every combination, or a few that cover each code path.
 */
function layouts(set: "all" | "quick"): MatVecLayout[] {
  const out: MatVecLayout[] = [];
  for (const rpt of [1, 2, 4] as const) {
    for (const cu of [16, 32, 64] as const) {
      for (const wg of [128, 256] as const) {
        for (const xstage of [false, true]) out.push({ wg, cu, rpt, xstage });
      }
    }
  }
  if (set === "all") return out;
  return out.filter((l) =>
    (l.wg === 128 && l.cu === 16 && l.rpt === 1) || (l.wg === 256 && l.cu === 32 && l.rpt === 2) ||
    (l.wg === 128 && l.cu === 64 && l.rpt === 4)
  );
}

export function randomF32(n: number, r: () => number, scale = 1): Float32Array<ArrayBuffer> {
  return Float32Array.from({ length: n }, () => (2 * r() - 1) * scale);
}

/** `n` distinct experts below `e`, in random order. */
export function distinct(n: number, e: number, r: () => number): number[] {
  const picked = new Set<number>();
  while (picked.size < n) picked.add(Math.floor(r() * e));
  return [...picked];
}

/** Everything one shape's dispatches bind, and what its output should be. */
interface Setup {
  readonly shape: MatVecShape;
  /** Copies of W at distinct addresses, so back-to-back dispatches read memory, not the cache. */
  readonly copies: readonly GpuTensor[];
  /** Expert-id sets (one per dispatch in turn), each at its own 256-byte-aligned slice. */
  readonly idSets: readonly { buffer: GPUBuffer; offset: number; size: number }[];
  readonly x: GPUBuffer;
  readonly y: GPUBuffer;
  readonly yInit: Float32Array<ArrayBuffer>;
  /** Per-rank products of the expert sum, its routing weights and shared expert's output. */
  readonly scratch: GPUBuffer;
  readonly routing: GPUBuffer;
  readonly shared: GPUBuffer;
  readonly options: Omit<MulMatOptions, "decode">;
  /** Weight bytes one dispatch reads. */
  readonly bytes: number;
  /** Sampled outputs: index into y, float64 value and the size of its terms. */
  readonly checks: readonly { index: number; want: number; scale: number }[];
}

/** Bytes of weights resident at once across the copies: several times any GPU's L2. */
export const ROTATE_BYTES = 256 * 2 ** 20;
/** Rows checked against the CPU per shape. */
const CHECKED_ROWS = 24;

function silu(g: number): number {
  return g / (1 + Math.exp(-g));
}

/**
 * `bytes` as shape's weight tensor, and for a dense product copies of it at distinct addresses
 * (ROTATE_BYTES in all), so that back-to-back products read memory, not L2; an expert stack is
 * one copy, its experts rotating instead.
 */
export async function uploadRotated(
  ctx: GpuContext,
  mem: GpuMemory,
  shape: {
    readonly name: string;
    readonly type: GgmlType;
    readonly rows: number;
    readonly k: number;
    readonly experts?: number;
  },
  bytes: Uint8Array,
): Promise<GpuTensor[]> {
  const { type, rows, k } = shape;
  const experts = shape.experts ?? 1;
  const first = await uploadTensorBytes(mem, {
    name: shape.name,
    type,
    shape: experts > 1 ? [k, rows, experts] : [k, rows],
  }, bytes);
  const nCopies = shape.experts ? 1 : Math.max(1, Math.ceil(ROTATE_BYTES / bytes.length));
  const copies = [first];
  const enc = ctx.device.createCommandEncoder();
  for (let c = 1; c < nCopies; c++) {
    copies.push({
      ...first,
      parts: first.parts.map((p) => {
        const buffer = mem.storage(`${shape.name} copy ${c}`, p.buffer.size);
        enc.copyBufferToBuffer(p.buffer, 0, buffer, 0, p.buffer.size);
        return { ...p, buffer };
      }),
    });
  }
  ctx.device.queue.submit([enc.finish()]);
  return copies;
}

async function prepare(ctx: GpuContext, mem: GpuMemory, shape: MatVecShape): Promise<Setup> {
  const r = rng(shape.rows * 31 + shape.k);
  const { type, rows, k } = shape;
  const experts = shape.experts ?? 1;
  const nUsed = shape.nUsed ?? 1;
  const rb = rowBytes(type, k);
  const bytes = randomBlocks(type, k * rows * experts, 0.05, r);
  const read = nUsed * rows * rb;
  const copies = await uploadRotated(ctx, mem, shape, bytes);
  // Expert sets: enough distinct sets that the experts read in a row are not cached.
  const nSets = shape.experts ? Math.max(1, Math.min(64, Math.ceil((4 * ROTATE_BYTES) / read))) : 1;
  const sets = Array.from({ length: nSets }, () => distinct(nUsed, experts, r));
  const idWords = new Uint32Array(64 * nSets);
  sets.forEach((s, i) => idWords.set(s, 64 * i));
  const idBuffer = mem.upload("ids", idWords);
  const idSets = sets.map((_, i) => ({ buffer: idBuffer, offset: 256 * i, size: 256 }));

  // Inputs: x rows (one per rank of the sum, [gate | up] under SwiGLU), norm weights, routing.
  const width = shape.swiglu ? 2 * k : k;
  const xRows = shape.sum ? nUsed : 1;
  const xv = randomF32(xRows * width, r, shape.norm ? 3 : 1);
  const nwv = randomF32(k, r);
  const rwv = randomF32(nUsed + 1, r);
  const shv = randomF32(rows, r);
  const yRows = shape.experts && !shape.sum ? nUsed * rows : rows;
  const yInit = shape.add || shape.sum ? randomF32(yRows, r) : new Float32Array(yRows);
  const x = mem.upload("x", xv);
  const y = createStorage(ctx, "y", yRows * 4);
  const options: Omit<MulMatOptions, "decode"> = {
    tokens: 1,
    nUsed: shape.experts ? nUsed : undefined,
    norm: shape.norm ? { w: mem.upload("nw", nwv), eps: 1e-6 } : undefined,
    add: shape.add,
    swiglu: shape.swiglu,
    upOffset: shape.swiglu ? k : undefined,
    xStrideI: shape.sum ? width : shape.experts ? 0 : undefined,
  };

  // Float64 reference of sampled rows of the first expert set.
  const input = (rank: number): Float64Array => {
    const xo = shape.sum ? rank * width : 0;
    const v = new Float64Array(k);
    let ss = 0;
    for (let i = 0; i < k; i++) ss += xv[xo + i] * xv[xo + i];
    const scale = 1 / Math.sqrt(ss / k + 1e-6);
    for (let i = 0; i < k; i++) {
      v[i] = shape.swiglu
        ? silu(xv[xo + i]) * xv[xo + k + i]
        : shape.norm
        ? xv[xo + i] * scale * nwv[i]
        : xv[xo + i];
    }
    return v;
  };
  const inputs = Array.from({ length: xRows }, (_, i) => input(i));
  const checks: { index: number; want: number; scale: number }[] = [];
  const sampled = new Set([0, rows - 1]);
  while (sampled.size < Math.min(rows, CHECKED_ROWS)) sampled.add(Math.floor(r() * rows));
  const dot = (e: number, row: number, v: Float64Array) => {
    const at = (e * rows + row) * rb;
    const wr = dequantize(type, bytes.subarray(at, at + rb), k);
    let s = 0;
    let a = 0;
    for (let i = 0; i < k; i++) {
      s += wr[i] * v[i];
      a += Math.abs(wr[i] * v[i]);
    }
    return { s, a };
  };
  for (const row of sampled) {
    if (shape.sum) {
      let want = yInit[row] + rwv[nUsed] * shv[row];
      let scale = Math.abs(yInit[row]) + Math.abs(rwv[nUsed] * shv[row]);
      sets[0].forEach((e, i) => {
        const d = dot(e, row, inputs[i]);
        want += rwv[i] * d.s;
        scale += Math.abs(rwv[i]) * d.a;
      });
      checks.push({ index: row, want, scale });
    } else if (shape.experts) {
      sets[0].forEach((e, i) => {
        const d = dot(e, row, inputs[0]);
        checks.push({ index: i * rows + row, want: d.s, scale: d.a });
      });
    } else {
      const d = dot(0, row, inputs[0]);
      const y0 = yInit[row];
      checks.push({ index: row, want: y0 + d.s, scale: d.a + Math.abs(y0) });
    }
  }
  return {
    shape,
    copies,
    idSets,
    x,
    y,
    yInit,
    scratch: createStorage(ctx, "scratch", nUsed * rows * 4),
    routing: mem.upload("routing", rwv),
    shared: mem.upload("shared", shv),
    options,
    bytes: read,
    checks,
  };
}

/** Records `n` dispatches of the layout, each on the next copy of W and set of experts. */
function record(enc: StepEncoder, s: Setup, decode: MatVecLayout, n: number): void {
  for (let i = 0; i < n; i++) {
    const ids = s.shape.experts ? s.idSets[i % s.idSets.length] : undefined;
    const w = s.copies[i % s.copies.length];
    if (s.shape.sum && ids) {
      moeDownSum(enc, {
        w,
        x: s.x,
        ids,
        weights: s.routing,
        shared: s.shared,
        o: s.scratch,
        y: s.y,
      }, { ...s.options, decode });
    } else {
      mulMat(enc, { w, x: s.x, y: s.y, ids }, { ...s.options, decode });
    }
  }
}

/** GPU (or, without timestamps, wall-clock) microseconds of `n` back-to-back dispatches. */
export async function timeDispatches(
  ctx: GpuContext,
  arena: ParamArena,
  timer: ReturnType<typeof createStepTimer>,
  recordAll: (enc: StepEncoder) => void,
): Promise<number> {
  const enc = new StepEncoder(ctx, arena);
  recordAll(enc);
  const start = performance.now();
  enc.submit(timer);
  await ctx.device.queue.onSubmittedWorkDone();
  const wallUs = (performance.now() - start) * 1000;
  if (!timer) return wallUs;
  const ns = new BigUint64Array(await readBuffer(ctx, timer.resolve, 0, 16));
  return Number(ns[1] - ns[0]) / 1000;
}

export function median(v: number[]): number {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** How the products of a shape are timed: passes of about passUs, at most `most` dispatches. */
export interface RoundTiming {
  readonly passUs: number;
  readonly most: number;
  readonly runs: number;
}

/** A product to time: `recordN` records n of them, for `ctx` (whose features pick the kernels). */
export interface TimedProduct {
  readonly ctx: GpuContext;
  readonly recordN: (enc: StepEncoder, n: number) => void;
}

/**
 * GPU µs a product of each of `products`, timed in interleaved rounds: each round times every
 * product once, so a change of the GPU's clocks during the runs falls on all of them alike (timed
 * one after the other, the first of a shape measured up to 2.3× the same kernel timed later: the
 * LM head's layout at 1034-1186 µs first against 458 in the model, decode_matvec on the H100 at
 * 61e5a5f and 5bb97a3; decode_steps 1.5× at 7c67105). Each product's pass holds about `passUs`
 * of it, after a probe and an untimed pass; the median round is kept.
 */
export async function timeInRounds(
  arena: ParamArena,
  timer: ReturnType<typeof createStepTimer>,
  products: readonly TimedProduct[],
  o: RoundTiming,
): Promise<number[]> {
  const counts: number[] = [];
  for (const { ctx, recordN } of products) {
    const probe = await timeDispatches(ctx, arena, timer, (enc) => recordN(enc, 2)) / 2;
    const n = Math.max(2, Math.min(o.most, Math.round(o.passUs / probe)));
    await timeDispatches(ctx, arena, timer, (enc) => recordN(enc, n));
    counts.push(n);
  }
  const us: number[][] = products.map(() => []);
  for (let round = 0; round < o.runs; round++) {
    for (const [i, { ctx, recordN }] of products.entries()) {
      const n = counts[i];
      us[i].push(await timeDispatches(ctx, arena, timer, (enc) => recordN(enc, n)) / n);
    }
  }
  return us.map(median);
}

export interface VariantResult {
  readonly shape: string;
  readonly variant: string;
  readonly us?: number;
  readonly gbs?: number;
  /** GB/s as a percentage of --peak-gbs (or of the copy bandwidth measured). */
  readonly pctPeak?: number;
  /** "ok", or why the variant was not timed. */
  readonly check: string;
}

/**
 * Checks a layout's output: against the float64 samples, and bit for bit against `base` (the
 * default layout's).
 */
async function check(
  ctx: GpuContext,
  s: Setup,
  arena: ParamArena,
  decode: MatVecLayout,
  base: Float32Array | undefined,
): Promise<{ out: Float32Array; verdict: string }> {
  ctx.device.queue.writeBuffer(s.y, 0, s.yInit);
  const enc = new StepEncoder(ctx, arena);
  record(enc, s, decode, 1);
  ctx.device.pushErrorScope("validation");
  enc.submit();
  const error = await ctx.device.popErrorScope();
  if (error) return { out: new Float32Array(), verdict: `rejected: ${error.message}` };
  const out = new Float32Array(await readBuffer(ctx, s.y, 0, s.yInit.length * 4));
  // f32 sums in another order than float64 (and the GPU's exp under SwiGLU): 3e-5 of the terms.
  for (const c of s.checks) {
    const err = Math.abs(out[c.index] - c.want) / Math.max(c.scale, 1e-30);
    if (!(err <= 3e-5)) {
      return { out, verdict: `wrong: y[${c.index}] = ${out[c.index]}, expected ${c.want}` };
    }
  }
  if (base) {
    for (let i = 0; i < out.length; i++) {
      if (!Object.is(out[i], base[i])) {
        return { out, verdict: `bits differ from the default at y[${i}]: ${out[i]} vs ${base[i]}` };
      }
    }
  }
  return { out, verdict: "ok" };
}

/**
 * GB/s of device-to-device copies, bytes read plus bytes written (the bandwidth ceiling): the
 * wall time of 40 copies less that of 8, so a wait's fixed cost (~11 ms on builtin) cancels.
 */
async function copyBandwidth(ctx: GpuContext, mem: GpuMemory, bytes: number): Promise<number> {
  const a = mem.storage("copy from", bytes);
  const b = mem.storage("copy to", bytes);
  const wall = async (copies: number) => {
    const enc = ctx.device.createCommandEncoder();
    for (let i = 0; i < copies; i++) {
      enc.copyBufferToBuffer(i % 2 ? b : a, 0, i % 2 ? a : b, 0, bytes);
    }
    const start = performance.now();
    ctx.device.queue.submit([enc.finish()]);
    await ctx.device.queue.onSubmittedWorkDone();
    return (performance.now() - start) / 1000;
  };
  await wall(2);
  const few: number[] = [];
  const many: number[] = [];
  for (let run = 0; run < 3; run++) {
    few.push(await wall(8));
    many.push(await wall(40));
  }
  mem.free(a);
  mem.free(b);
  return (2 * 32 * bytes) / (median(many) - median(few)) / 1e9;
}

/**
 * Builds the layout's pipeline and waits for it: "ok", or why it cannot run here (too much
 * workgroup memory, or the compiler's message).
 */
async function compiles(ctx: GpuContext, key: MulMatVecKey, sum: boolean): Promise<string> {
  try {
    if (workgroupBytes(key) > ctx.limits.maxComputeWorkgroupStorageSize) {
      return "skipped: workgroup memory";
    }
    await compileKernel(ctx, MUL_MAT_VEC, key);
    if (sum) await compileKernel(ctx, MOE_SUM, undefined);
    return "ok";
  } catch (e) {
    return `rejected: ${(e as Error).message}`;
  }
}

/**
 * Per-dispatch times of tiny kernels back to back: a one-row product (the floor any dispatch
 * pays: launch and the barrier after it; and without the barrier, each into its own output)
 * the MoE router's softmax + top-k, the experts' weighted sum and the DeltaNet conv, at the bench
 * model's sizes (one token).
 */
async function smallKernels(
  ctx: GpuContext,
  arena: ParamArena,
  timer: ReturnType<typeof createStepTimer>,
): Promise<VariantResult[]> {
  const mem = new GpuMemory(ctx);
  const r = rng(5);
  const p = BENCH_MODEL;
  const one = await uploadTensorBytes(
    mem,
    { name: "one row", type: GgmlType.F32, shape: [32, 1] },
    new Uint8Array(randomF32(32, r).buffer),
  );
  const x = mem.upload("x", randomF32(32, r));
  const y = mem.storage("y", 16);
  const n = 500;
  const ys = Array.from({ length: n }, (_, i) => mem.storage(`y ${i}`, 16));
  const logits = mem.upload("logits", randomF32(p.E + 1, r, 4));
  const ids = mem.storage("ids", 4 * p.Ku);
  const weights = mem.storage("weights", 4 * (p.Ku + 1));
  const routing = mem.upload("routing", randomF32(p.Ku + 1, r));
  const experts = mem.upload("expert outputs", randomF32(p.Ku * p.D, r));
  const shared = mem.upload("shared output", randomF32(p.D, r));
  const residual = mem.upload("residual", randomF32(p.D, r));
  const { C } = p;
  const convX = mem.upload("conv x", randomF32(C, r));
  const convW = mem.upload("conv w", randomF32(C * p.Kc, r));
  const convState = mem.upload("conv state", randomF32(C * (p.Kc - 1), r));
  const convU = mem.storage("conv u", 4 * C);
  const jobs: [string, (enc: StepEncoder) => void][] = [
    ["one-row product", (enc) => {
      for (let i = 0; i < n; i++) mulMat(enc, { w: one, x, y }, { tokens: 1 });
    }],
    // Each into its own y: no dependency, so no barrier is needed between them.
    ["one-row product, independent", (enc) => {
      for (let i = 0; i < n; i++) mulMat(enc, { w: one, x, y: ys[i] }, { tokens: 1 });
    }],
    [`moe_route E=${p.E} k=${p.Ku}`, (enc) => {
      for (let i = 0; i < n; i++) {
        moeRoute(enc, { logits, ids, weights }, {
          experts: p.E,
          k: p.Ku,
          tokens: 1,
          logitsStride: p.E + 1,
          sharedGate: true,
        });
      }
    }],
    [`moe_sum d=${p.D} k=${p.Ku}`, (enc) => {
      for (let i = 0; i < n; i++) {
        moeSum(enc, { o: experts, s: shared, weights: routing, x: residual }, {
          d: p.D,
          k: p.Ku,
          tokens: 1,
          sharedExpert: true,
        });
      }
    }],
    [`ssm_conv channels=${C} kc=${p.Kc}`, (enc) => {
      for (let i = 0; i < n; i++) {
        ssmConv(enc, { x: convX, w: convW, state: convState, u: convU }, {
          channels: C,
          kc: p.Kc,
          tokens: 1,
          xStrideT: C,
          uStrideT: C,
        });
      }
    }],
  ];
  const out: VariantResult[] = [];
  for (const [name, job] of jobs) {
    const us: number[] = [];
    for (let i = 0; i < 4; i++) us.push((await timeDispatches(ctx, arena, timer, job)) / n);
    out.push({ shape: "small kernels", variant: name, us: median(us.slice(1)), check: "ok" });
  }
  mem.destroy();
  return out;
}

/**
 * The router and the shared expert's gate|up (the same normed input) as one mulMatPair dispatch
 * against their two mulMat dispatches: µs per pair, after checking the pair's bits.
 */
async function pairTimes(
  ctx: GpuContext,
  arena: ParamArena,
  timer: ReturnType<typeof createStepTimer>,
): Promise<VariantResult> {
  const mem = new GpuMemory(ctx);
  const full = fullShapes();
  const [router, shared] = await Promise.all(
    ["router", "shared gate|up"].map((n) => prepare(ctx, mem, full.find((s) => s.name === n)!)),
  );
  const n = 200;
  const separate = (enc: StepEncoder, i: number, y: GPUBuffer, y2: GPUBuffer) => {
    mulMat(enc, { w: shared.copies[i % shared.copies.length], x: shared.x, y }, shared.options);
    mulMat(enc, { w: router.copies[i % router.copies.length], x: shared.x, y: y2 }, shared.options);
  };
  const paired = (enc: StepEncoder, i: number, y: GPUBuffer, y2: GPUBuffer) => {
    const w = shared.copies[i % shared.copies.length];
    const w2 = router.copies[i % router.copies.length];
    if (!mulMatPair(enc, { w, w2, x: shared.x, y, y2 }, shared.options)) {
      throw new Error("Cannot pair the router with the shared gate|up here");
    }
  };
  // Bits: the pair's outputs against the two products'.
  const outs = [shared.y, router.y, mem.storage("y", shared.yInit.length * 4)];
  outs.push(mem.storage("y2", router.yInit.length * 4));
  const enc = new StepEncoder(ctx, arena);
  separate(enc, 0, outs[0], outs[1]);
  paired(enc, 0, outs[2], outs[3]);
  enc.submit();
  const got = await Promise.all(outs.map((b) => readBuffer(ctx, b, 0, b.size)));
  const same = [0, 1].every((j) => {
    const [a, b] = [new Uint32Array(got[j]), new Uint32Array(got[j + 2])];
    return a.every((v, i) => v === b[i]);
  });
  if (!same) return { shape: "pair", variant: "router + shared gate|up", check: "bits differ" };
  const time = async (job: typeof separate) => {
    const us: number[] = [];
    for (let run = 0; run < 4; run++) {
      us.push(
        await timeDispatches(ctx, arena, timer, (e) => {
          for (let i = 0; i < n; i++) job(e, i, outs[0], outs[1]);
        }) / n,
      );
    }
    return median(us.slice(1));
  };
  const [two, one] = [await time(separate), await time(paired)];
  mem.destroy();
  return {
    shape: "pair",
    variant: `router + shared gate|up: two dispatches ${two.toFixed(2)} µs, one`,
    us: one,
    check: "ok",
  };
}

const DECODE_MATVEC = {
  name: "Decode matvec bench",
  usage: "deno run -A bench/kernels/decode_matvec.ts",
  about: "Checks then times every decode matrix-vector layout on the bench model's shapes.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
    shapes: flag(
      oneOf(["full", "tiny"] as const),
      "the bench model's shapes, or CPU-sized ones",
      "full",
    ),
    layouts: flag(oneOf(["all", "quick"] as const), "every layout, or one per code path", "all"),
    only: flag(text("NAME,..."), "shapes whose name contains one of these"),
    "top-from": flag(text("FILE"), "time only the best --top layouts per shape of this JSON"),
    top: flag(whole(1), "layouts taken from --top-from", 6),
    dispatches: flag(whole(1), "back-to-back dispatches a timed pass at most", 200),
    "pass-us": flag(whole(1), "GPU microseconds a timed pass aims at (fewer dispatches)", 8000),
    runs: flag(whole(1), "timed rounds, each timing every variant once (the median is kept)", 5),
    "copy-mb": flag(whole(1), "size of the copy that measures bandwidth", 1024),
    "peak-gbs": flag(
      whole(1),
      "the bandwidth the % column is of (default: the copy measured here, which WebGPU's " +
        "copies may understate)",
    ),
    "deadline-s": flag(whole(1), "stop starting variants after this many seconds", 100000),
    out: flag(text("FILE"), "write every result here as JSON"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof DECODE_MATVEC.flags>): Promise<void> {
  const started = performance.now();
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });
  const mem = new GpuMemory(ctx);
  const copyGbs = await copyBandwidth(ctx, mem, values["copy-mb"] * 2 ** 20);
  console.log(`copy bandwidth (read + write): ${copyGbs.toFixed(0)} GB/s`);
  const peakGbs = values["peak-gbs"] ?? copyGbs;
  const timer = createStepTimer(mem);
  if (!timer) console.log("no timestamp-query: times are wall clock per pass");
  const arena = new ParamArena(mem, 16);
  const timing: RoundTiming = {
    passUs: values["pass-us"],
    most: values.dispatches,
    runs: values.runs,
  };
  const top = values["top-from"]
    ? JSON.parse(await Deno.readTextFile(values["top-from"])) as { results: VariantResult[] }
    : undefined;
  const all = values.shapes === "full" ? fullShapes() : tinyShapes();
  const only = values.only?.split(",");
  const shapes = only ? all.filter((s) => only.some((o) => s.name.includes(o))) : all;
  const results: VariantResult[] = await smallKernels(ctx, arena, timer);
  if (shapes.some((s) => s.name === "router")) results.push(await pairTimes(ctx, arena, timer));
  for (const r of results) console.log(line(r));
  const noSubgroups = { ...ctx, features: { ...ctx.features, subgroups: false } };
  for (const [at, shape] of shapes.entries()) {
    // Each shape gets an equal share of the time left before the deadline.
    const elapsed = () => (performance.now() - started) / 1000;
    const shapeEnd = elapsed() + (values["deadline-s"] - elapsed()) / (shapes.length - at);
    const shapeMem = new GpuMemory(ctx);
    const s = await prepare(ctx, shapeMem, shape);
    const id = shape.experts !== undefined;
    const chosen = decodeLayout(shape.rows, id);
    // The default layout first: the others are checked bit for bit against it.
    let decodes = [chosen, ...layouts(values.layouts).filter((l) => !sameLayout(l, chosen))];
    if (top) {
      const ranked = top.results
        .filter((r) => r.shape === shape.name && r.us !== undefined)
        .sort((a, b) => a.us! - b.us!)
        .slice(0, values.top)
        .map((r) => r.variant.split(" ")[0]);
      decodes = decodes.filter((l) => l === chosen || ranked.includes(layoutName(l)));
    }
    // With subgroups, the 16-lane layouts are timed with and without them.
    const runs: { decode: MatVecLayout; target: GpuContext; name: string }[] = [];
    for (const decode of decodes) {
      const name = `${layoutName(decode)}${decode === chosen ? " (default)" : ""}`;
      runs.push({ decode, target: ctx, name });
      if (decode.cu === 16 && ctx.features.subgroups) {
        runs.push({ decode, target: noSubgroups, name: `${layoutName(decode)} nosg` });
      }
    }
    // Every variant checked first, then the ones that passed timed in interleaved rounds.
    let base: Float32Array | undefined;
    const checked: { run: (typeof runs)[number]; result: VariantResult }[] = [];
    for (const run of runs) {
      let result: VariantResult;
      if (elapsed() > shapeEnd) {
        result = { shape: shape.name, variant: run.name, check: "skipped: deadline" };
      } else {
        const key: MulMatVecKey = {
          type: shape.type,
          layout: run.decode,
          id,
          swiglu: shape.swiglu,
          add: shape.add,
          norm: shape.norm,
        };
        let verdict = await compiles(run.target, key, shape.sum === true);
        if (verdict === "ok") {
          const checkedOut = await check(run.target, s, arena, run.decode, base);
          verdict = checkedOut.verdict;
          if (run.decode === chosen && verdict === "ok") base ??= checkedOut.out;
        }
        result = { shape: shape.name, variant: run.name, check: verdict };
      }
      checked.push({ run, result });
    }
    const timed = checked.filter((c) => c.result.check === "ok");
    const us = await timeInRounds(
      arena,
      timer,
      timed.map(({ run }) => ({
        ctx: run.target,
        recordN: (enc: StepEncoder, n: number) => record(enc, s, run.decode, n),
      })),
      timing,
    );
    const timedUs = new Map(timed.map((c, i) => [c, us[i]]));
    for (const c of checked) {
      const t = timedUs.get(c);
      const gbs = t === undefined ? undefined : s.bytes / t / 1e3;
      const result: VariantResult = t === undefined
        ? c.result
        : { ...c.result, us: t, gbs, pctPeak: (100 * gbs!) / peakGbs };
      results.push(result);
      console.log(line(result));
    }
    shapeMem.destroy();
  }
  console.log(`\n${ctx.summary}; copy ${copyGbs.toFixed(0)} GB/s, % of ${peakGbs.toFixed(0)} GB/s`);
  console.log(table(results));
  if (values.out) {
    await Deno.writeTextFile(
      values.out,
      JSON.stringify(
        { device: ctx.summary, provider: ctx.provider, copyGbs, peakGbs, results },
        null,
        1,
      ),
    );
  }
  mem.destroy();
  ctx.device.destroy();
}

export function sameLayout(a: MatVecLayout, b: MatVecLayout): boolean {
  return a.wg === b.wg && a.cu === b.cu && a.rpt === b.rpt && a.xstage === b.xstage;
}

function line(r: VariantResult): string {
  if (r.us === undefined) return `${r.shape} | ${r.variant} | ${r.check.slice(0, 300)}`;
  if (r.gbs === undefined) return `${r.shape} | ${r.variant} | ${r.us.toFixed(2)} µs`;
  return `${r.shape} | ${r.variant} | ${r.us.toFixed(2)} µs | ${r.gbs!.toPrecision(3)} GB/s | ${
    r.pctPeak!.toFixed(1)
  }%`;
}

/** Per shape: the default layout, the best three, and any that failed its check. */
function table(results: VariantResult[]): string {
  const rows = ["shape | variant | µs | GB/s | % of peak"];
  for (const shape of new Set(results.map((r) => r.shape))) {
    const mine = results.filter((r) => r.shape === shape);
    const timed = mine.filter((r) => r.us !== undefined && !r.variant.endsWith("(default)"));
    timed.sort((a, b) => a.us! - b.us!);
    const base = mine.filter((r) => r.variant.endsWith("(default)"));
    const failed = mine.filter((r) => !r.check.startsWith("ok") && !r.check.startsWith("skipped"));
    for (const r of [...base, ...timed.slice(0, 3), ...failed]) rows.push(line(r));
  }
  return rows.join("\n");
}

if (import.meta.main) await runCommand(DECODE_MATVEC, main);
