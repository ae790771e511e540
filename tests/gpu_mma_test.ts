// Tensor-core prefill products (`mma` on mulMat and moeDownSum, engine/gpu/kernels/mul_mat_mma.ts):
// every weight type and weights of every size f16 holds to f32's accuracy against the float64
// reference, inputs beyond f16's range, a token's bits independent of its run, tile and slot, the
// single-product variant the kernel bench compares, and the refusals; on every device with the
// matrix operations emulated (mmaEmulate), and where the device has subgroup matrices on the
// tensor cores, else (Mesa in CI, the builtin provider) that `mma` gives today's kernels' bits.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import {
  type GpuContext,
  openGpu,
  SUBGROUP_MATRIX_FEATURE,
  subgroupMatrixUsable,
} from "../engine/gpu/device.ts";
import type { StepEncoder } from "../engine/gpu/encoder.ts";
import { gatherTiles, gatherWords, moeGather } from "../engine/gpu/kernels/moe_gather.ts";
import { moeDownSum } from "../engine/gpu/kernels/moe_sum.ts";
import {
  MUL_MAT_TYPES,
  mulMat,
  type MulMatOptions,
  PREFILL_TT,
} from "../engine/gpu/kernels/mul_mat.ts";
import {
  mmaScratchBytes,
  mmaStagesF32,
  mmaTakes,
  type MmaTile,
  mmaWorkgroupBytes,
} from "../engine/gpu/kernels/mul_mat_mma.ts";
import type { ProviderChoice } from "../engine/gpu/provider.ts";
import { dequantize } from "../engine/quant/dequant.ts";
import { GgmlType, typeName } from "../engine/quant/ggml_types.ts";
import { randomBlocks } from "../tools/synth/quantize.ts";
import { gpuTest, randomF32, readF32, rng, submit, upload, uploadWeights } from "./_gpu.ts";

/**
 * ‖out − ref‖/‖ref‖ a tensor-core product may reach: weights held exactly by their two f16 (or
 * within 2^−22), inputs within 2^−22, and f32 sums of three products a value, as the f32 kernels'
 * one (which measure ~1e-7 here); a single f16 product measures ~4e-4.
 */
const REL = 2e-6;

/** ‖got − want‖ / ‖want‖ over all values. */
function relError(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < want.length; i++) {
    d += (got[i] - want[i]) ** 2;
    n += want[i] ** 2;
  }
  return Math.sqrt(d / n);
}

function silu(g: number): number {
  return g / (1 + Math.exp(-g));
}

/** Input row `row` of x as a product reads it: plain, or silu(gate)·up with up `up` further. */
function inputRow(x: Float32Array, at: number, k: number, up?: number): Float64Array {
  return Float64Array.from(
    { length: k },
    (_, c) => up === undefined ? x[at + c] : silu(x[at + c]) * x[at + up + c],
  );
}

/** Float64 W_row · v for every row of the matrix starting at row `first` of w. */
function products(w: Float32Array, first: number, rows: number, v: Float64Array): Float64Array {
  const k = v.length;
  return Float64Array.from({ length: rows }, (_, r) => {
    let s = 0;
    for (let c = 0; c < k; c++) s += w[(first + r) * k + c] * v[c];
    return s;
  });
}

/** Throws at the first value whose bits differ. */
function assertSameBits(got: Float32Array, want: Float32Array, what: string): void {
  assert.ok(want.some((v) => v !== 0), `${what}: the products are not all zero`);
  for (let i = 0; i < want.length; i++) {
    if (!Object.is(got[i], want[i])) {
      throw new Error(`${what}: value ${i} is ${got[i]}, expected ${want[i]} bit for bit`);
    }
  }
}

/** A scratch for tensor-core products of up to `rows` input rows of `k` values. */
function scratch(ctx: GpuContext, rows: number, k: number): GPUBuffer {
  return createStorage(ctx, "mma scratch", mmaScratchBytes(ctx, rows, k));
}

/**
 * Every tensor-core tile of these slot counts the device's workgroup memory holds for the path
 * (any tile gives the same bits).
 */
function tilesOf(
  ctx: GpuContext,
  tokens: readonly (32 | 64 | 128)[],
  emulate = false,
): MmaTile[] {
  const stageF32 = mmaStagesF32(ctx, emulate);
  return ([64, 128] as const).flatMap((rows) =>
    tokens.flatMap((t) => ([1, 2] as const).map((stages) => ({ rows, tokens: t, stages })))
  ).filter((t) => mmaWorkgroupBytes(t, stageF32) <= ctx.limits.maxComputeWorkgroupStorageSize);
}

Deno.test("subgroupMatrixUsable() wants f16, subgroups of 32 and an f16 → f32 16×16×16 config", () => {
  const config = (componentType: string, resultComponentType: string, M: number, K = M) => ({
    componentType,
    resultComponentType,
    M,
    N: M,
    K,
  });
  const features = new Set(["shader-f16", "subgroups", SUBGROUP_MATRIX_FEATURE]);
  const nvidia = {
    subgroupMinSize: 32,
    subgroupMaxSize: 32,
    subgroupMatrixConfigs: [config("f16", "f16", 16), config("f16", "f32", 16)],
  };
  assert.ok(subgroupMatrixUsable(features, nvidia));
  for (const missing of features) {
    const fewer = new Set([...features].filter((f) => f !== missing));
    assert.ok(!subgroupMatrixUsable(fewer, nvidia), `without ${missing}`);
  }
  assert.ok(!subgroupMatrixUsable(features, { ...nvidia, subgroupMaxSize: 64 }), "subgroups of 64");
  assert.ok(!subgroupMatrixUsable(features, { ...nvidia, subgroupMinSize: 16 }), "subgroups of 16");
  const only = (c: ReturnType<typeof config>) => ({ ...nvidia, subgroupMatrixConfigs: [c] });
  assert.ok(!subgroupMatrixUsable(features, only(config("f16", "f16", 16))), "f16 results only");
  assert.ok(!subgroupMatrixUsable(features, only(config("f16", "f32", 8))), "8 × 8 only");
  assert.ok(!subgroupMatrixUsable(features, only(config("f16", "f32", 16, 8))), "k of 8 only");
  assert.ok(!subgroupMatrixUsable(features, { subgroupMinSize: 32, subgroupMaxSize: 32 }));
});

gpuTest(
  "the device has subgroup matrices exactly where usable, and they can be turned off",
  async (ctx) => {
    assert.equal(ctx.features.subgroupMatrix, subgroupMatrixUsable(ctx.device.features, ctx.info));
    if (ctx.software) {
      assert.equal(
        ctx.features.subgroupMatrix,
        false,
        "no software adapter has them",
      );
    }
    const gpu = (Deno.env.get("TANDEM_GPU") ?? "builtin") as ProviderChoice;
    const off = await openGpu({ gpu, allowSoftware: true, log: () => {}, subgroupMatrix: false });
    try {
      assert.equal(off.features.subgroupMatrix, false);
      assert.ok(!off.device.features.has(SUBGROUP_MATRIX_FEATURE), "the feature is not requested");
    } finally {
      off.device.destroy();
    }
  },
);

/** One product three ways: emulated tensor-core path, `mma` (tensor cores or today's), today's. */
interface Results {
  readonly emu: Float32Array;
  readonly mma: Float32Array;
  readonly plain: Float32Array;
}

/**
 * The tile the every-type tests emulate in, the smallest: a CPU adapter compiles a variant a
 * weight type, and this one in about half the time of the 64 × 64 tile mmaTileFor gives these
 * products (the invariance test runs every tile). Staged twice where that fits: not where the
 * emulation stages f32 (a device without f16, e.g. Dawn without TANDEM_MMA=1) in 48 KB.
 */
function emulatedTile(ctx: GpuContext): MmaTile {
  return tilesOf(ctx, [32], true).filter((t) => t.rows === 64).at(-1)!;
}

/**
 * Records `record` into three y buffers (from yInit) with the three option sets (the emulation in
 * `emulatedTile` where given); reads them.
 */
async function threeWays(
  ctx: GpuContext,
  yInit: Float32Array,
  record: (enc: StepEncoder, y: GPUBuffer, o: Partial<MulMatOptions>) => void,
  emulatedTile?: MmaTile,
): Promise<Results> {
  const ys = [0, 1, 2].map(() => upload(ctx, yInit));
  const emulated = { mma: true, mmaEmulate: true, mmaTile: emulatedTile };
  const ways: Partial<MulMatOptions>[] = [emulated, { mma: true }, {}];
  await submit(ctx, (enc) => ways.forEach((o, i) => record(enc, ys[i], o)));
  const [emu, mma, plain] = await Promise.all(ys.map((y) => readF32(ctx, y, yInit.length)));
  return { emu, mma, plain };
}

/**
 * Asserts one product's results but its accuracy: the tensor-core path ran (not today's bits),
 * emulated, and on a device with subgroup matrices on the tensor cores; on one without, `mma`
 * gave today's bits. F32 and BF16 weights: today's bits either way. Returns each path's
 * ‖got − want‖/‖want‖, for Errors.
 */
function assertResults(
  ctx: GpuContext,
  r: Results,
  want: ArrayLike<number>,
  what: string,
  type?: GgmlType,
): Map<string, number> {
  const errors = new Map<string, number>();
  if (type !== undefined && !mmaTakes(type)) {
    // F32 and BF16 weights keep their exact products under `mma`, emulated or not.
    assertSameBits(r.emu, r.plain, `${what}: emulated: today's kernels`);
    assertSameBits(r.mma, r.plain, `${what}: today's kernels`);
    return errors;
  }
  const paths: [string, Float32Array][] = [["emulated", r.emu]];
  if (ctx.features.subgroupMatrix) paths.push(["tensor cores", r.mma]);
  else assertSameBits(r.mma, r.plain, `${what}, no subgroup matrices: today's kernels`);
  for (const [path, got] of paths) {
    errors.set(path, relError(got, want));
    assert.ok(got.some((v, i) => v !== r.plain[i]), `${what}, ${path}: tensor-core path ran`);
  }
  return errors;
}

/**
 * A test's products' errors: each path's largest, printed, then every one over REL at once (so
 * one run on the GPU box shows them all).
 */
class Errors {
  readonly #largest = new Map<string, number>();
  readonly #over: string[] = [];

  add(what: string, errors: Map<string, number>): void {
    for (const [path, e] of errors) {
      this.#largest.set(path, Math.max(e, this.#largest.get(path) ?? 0));
      if (!(e <= REL)) this.#over.push(`${what}, ${path}: ${e.toExponential(2)}`);
    }
  }

  check(test: string): void {
    const parts = [...this.#largest].map(([path, e]) => `${path} ${e.toExponential(2)}`);
    console.log(`${test}: largest relative error ${parts.join(", ")} (bound ${REL})`);
    assert.deepEqual(this.#over, [], `relative errors over ${REL}`);
  }
}

gpuTest("mma products match the float64 product for every weight type (dense)", async (ctx) => {
  // 70 rows and 37 tokens: partial row and token tiles; K = 512: 16 chunks.
  const [K, M, T] = [512, 70, 37];
  const mmaX = scratch(ctx, T, K);
  const errors = new Errors();
  for (const type of MUL_MAT_TYPES) {
    const r = rng(3000 + type);
    const bytes = randomBlocks(type, K * M, 0.5, r);
    const x = randomF32(T * K, r, 2);
    const w = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
    const xb = upload(ctx, x);
    const got = await threeWays(ctx, new Float32Array(T * M), (enc, y, o) => {
      mulMat(enc, { w, x: xb, y, mmaX }, { ...o, tokens: T });
    }, emulatedTile(ctx));
    const wf = dequantize(type, bytes, K * M);
    const want = new Float64Array(T * M);
    for (let t = 0; t < T; t++) want.set(products(wf, 0, M, inputRow(x, t * K, K)), t * M);
    const what = `${typeName(type)} dense`;
    errors.add(what, assertResults(ctx, got, want, what, type));
  }
  errors.check("every weight type, dense");
});

gpuTest(
  "mma products hold weights of every size f16 holds, subnormal scales included",
  async (ctx) => {
    // Weights around 1e-4 (block scales and many weights below f16's normal range, 6.1e-5), 1e-3,
    // 0.02 (a model's), 1, 100 and 2000 (largest values to ~2e4, below f16's 65504), in the types
    // with the most bits.
    const [K, M, T] = [256, 24, 5];
    const stds = [1e-4, 1e-3, 0.02, 1, 100, 2000];
    const types = [GgmlType.Q8_0, GgmlType.Q4_K, GgmlType.Q6_K, GgmlType.IQ4_XS, GgmlType.F16];
    const r = rng(41);
    const x = randomF32(T * K, r, 3);
    const xb = upload(ctx, x);
    const mmaX = scratch(ctx, T, K);
    const errors = new Errors();
    for (const type of types) {
      for (const std of stds) {
        const bytes = randomBlocks(type, K * M, std, r);
        const wf = dequantize(type, bytes, K * M);
        const largest = wf.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
        const what = `${typeName(type)}, weights of std ${std} (largest ${
          largest.toExponential(2)
        })`;
        assert.ok(largest < 65504 && largest > std, `${what}: in f16's range`);
        if (std === stds[0]) {
          const subnormal = wf.filter((v) => v !== 0 && Math.abs(v) < 2 ** -14).length;
          assert.ok(subnormal > wf.length / 10, `${what}: ${subnormal} weights below 2^-14`);
        }
        const w = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
        const got = await threeWays(ctx, new Float32Array(T * M), (enc, y, o) => {
          mulMat(enc, { w, x: xb, y, mmaX }, { ...o, tokens: T });
        }, emulatedTile(ctx));
        const want = new Float64Array(T * M);
        for (let t = 0; t < T; t++) want.set(products(wf, 0, M, inputRow(x, t * K, K)), t * M);
        errors.add(what, assertResults(ctx, got, want, what, type));
      }
    }
    errors.check("weights of every size");
  },
);

gpuTest(
  "the single-product precision (the kernel bench's comparison) is f16's rounding",
  async (ctx) => {
    const [K, M, T] = [512, 70, 37];
    const r = rng(43);
    const type = GgmlType.Q8_0;
    const bytes = randomBlocks(type, K * M, 0.5, r);
    const w = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
    const x = randomF32(T * K, r, 2);
    const xb = upload(ctx, x);
    const mmaX = scratch(ctx, T, K);
    const got = await threeWays(ctx, new Float32Array(T * M), (enc, y, o) => {
      mulMat(enc, { w, x: xb, y, mmaX }, { ...o, tokens: T, mmaPrecision: "f16" });
    });
    const wf = dequantize(type, bytes, K * M);
    const want = new Float64Array(T * M);
    for (let t = 0; t < T; t++) want.set(products(wf, 0, M, inputRow(x, t * K, K)), t * M);
    const paths: [string, Float32Array][] = [["emulated", got.emu]];
    if (ctx.features.subgroupMatrix) paths.push(["tensor cores", got.mma]);
    for (const [path, y] of paths) {
      // Weights and inputs rounded to f16 (2^−11 relative each, random signs): ~4e-4.
      const err = relError(y, want);
      assert.ok(err > 20 * REL && err <= 3e-3, `${path}: relative error ${err.toExponential(2)}`);
    }
  },
);

/** Per (token, rank): distinct experts, expert 1 taking more than one tile of slots. */
function routing(T: number, nUsed: number, E: number, r: () => number): Uint32Array {
  const ids = new Uint32Array(T * nUsed);
  for (let t = 0; t < T; t++) {
    const picked = new Set<number>([1]);
    while (picked.size < nUsed) picked.add(Math.floor(r() * E));
    ids.set([...picked], t * nUsed);
  }
  return ids;
}

/** Records a gather table of `ids` (slots of one run) into a new buffer. */
function gather(
  ctx: GpuContext,
  enc: StepEncoder,
  ids: GPUBuffer,
  slots: number,
  E: number,
): GPUBuffer {
  const table = createStorage(ctx, "table", 4 * gatherWords(slots, E, PREFILL_TT));
  moeGather(enc, { ids, table }, { slots, experts: E, tt: PREFILL_TT });
  return table;
}

gpuTest(
  "mma expert products over a gather table match the float64 product for every weight type",
  async (ctx) => {
    // Each (token, rank) has its own [gate | up] row (the experts' down): SwiGLU inputs per rank.
    const [K, M, E, T, nUsed] = [256, 40, 4, 37, 2];
    const mmaX = scratch(ctx, T * nUsed, K);
    const errors = new Errors();
    for (const type of MUL_MAT_TYPES) {
      const r = rng(4000 + type);
      const bytes = randomBlocks(type, K * M * E, 0.5, r);
      const x = randomF32(T * nUsed * 2 * K, r, 2);
      const ids = routing(T, nUsed, E, r);
      assert.ok(ids.filter((e) => e === 1).length > PREFILL_TT, "expert 1 takes two tiles");
      const w = await uploadWeights(ctx, { name: "exps", type, shape: [K, M, E] }, bytes);
      const [xb, idsb] = [upload(ctx, x), upload(ctx, ids)];
      const layout: MulMatOptions = {
        tokens: T,
        nUsed,
        xStrideT: nUsed * 2 * K,
        xStrideI: 2 * K,
        upOffset: K,
        swiglu: true,
        gatherTiles: gatherTiles(T * nUsed, E, PREFILL_TT),
      };
      const got = await threeWays(ctx, new Float32Array(T * nUsed * M), (enc, y, o) => {
        const table = gather(ctx, enc, idsb, T * nUsed, E);
        mulMat(enc, { w, x: xb, y, ids: table, mmaX }, { ...layout, ...o });
      });
      const wf = dequantize(type, bytes, K * M * E);
      const want = new Float64Array(T * nUsed * M);
      for (let s = 0; s < T * nUsed; s++) {
        want.set(products(wf, ids[s] * M, M, inputRow(x, s * 2 * K, K, K)), s * M);
      }
      const what = `${typeName(type)} experts`;
      errors.add(what, assertResults(ctx, got, want, what, type));
    }
    errors.check("every weight type, experts");
  },
);

gpuTest("mma products take inputs beyond f16's range: a power-of-two scale a row", async (ctx) => {
  // Rows of a few units, past 65504 (f16's largest) up to 3e6, tiny, and zero; SwiGLU rows whose
  // silu(gate)·up reach 1e9; the add epilogue onto a residual.
  const [K, M] = [256, 40];
  const scales = [1, 7e4, 1e5, 3e6, 1e-3, 0];
  const T = scales.length;
  const r = rng(51);
  const type = GgmlType.Q8_0;
  const bytes = randomBlocks(type, K * M, 0.5, r);
  const w = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
  const wf = dequantize(type, bytes, K * M);
  const plainX = new Float32Array(T * K);
  scales.forEach((s, t) => plainX.set(randomF32(K, r, s), t * K));
  // One value just above what f16 rounds to 65504, in a row of small ones.
  plainX[7] = 65520;
  const gateUp = new Float32Array(T * 2 * K);
  scales.forEach((s, t) => {
    gateUp.set(randomF32(K, r, 30 * Math.min(1, s)), t * 2 * K);
    gateUp.set(randomF32(K, r, 40 * s), t * 2 * K + K);
  });
  // A residual of each row's products' size: a larger one would round their bits away in the add.
  const residual = new Float32Array(T * M);
  scales.forEach((_, t) => {
    const p = products(wf, 0, M, inputRow(gateUp, t * 2 * K, K, K));
    const rms = Math.sqrt(p.reduce((a, v) => a + v * v, 0) / M);
    residual.set(randomF32(M, r, rms), t * M);
  });
  const mmaX = scratch(ctx, T, K);
  const cases: { what: string; x: Float32Array; o: MulMatOptions; y0: Float32Array }[] = [
    { what: "plain", x: plainX, o: { tokens: T }, y0: new Float32Array(T * M) },
    {
      what: "SwiGLU, add",
      x: gateUp,
      o: { tokens: T, xStrideT: 2 * K, upOffset: K, swiglu: true, add: true },
      y0: residual,
    },
  ];
  for (const { what, x, o, y0 } of cases) {
    const xb = upload(ctx, x);
    const got = await threeWays(ctx, y0, (enc, y, way) => {
      mulMat(enc, { w, x: xb, y, mmaX }, { ...o, ...way });
    });
    if (!ctx.features.subgroupMatrix) {
      assertSameBits(got.mma, got.plain, `${what}, no subgroup matrices: today's kernels`);
    }
    const paths: [string, Float32Array][] = [["emulated", got.emu]];
    if (ctx.features.subgroupMatrix) paths.push(["tensor cores", got.mma]);
    const width = o.swiglu ? 2 * K : K;
    for (let t = 0; t < T; t++) {
      const p = products(wf, 0, M, inputRow(x, t * width, K, o.swiglu ? K : undefined));
      const y0t = o.add ? y0.subarray(t * M, (t + 1) * M) : new Float32Array(M);
      for (const [path, all] of paths) {
        const row = all.subarray(t * M, (t + 1) * M);
        const where = `${what}, ${path}, row ${t} (inputs to ${scales[t]})`;
        if (scales[t] === 0) {
          assert.ok(row.every((g, i) => g === y0t[i]), `${where}: adds exactly 0`);
          continue;
        }
        // The product's own error, measured against the product (not against the residual).
        const err = relError(row.map((g, i) => g - y0t[i]), p);
        assert.ok(err <= REL, `${where}: relative error ${err.toExponential(2)}`);
        assert.ok(row.every(Number.isFinite), `${where}: finite`);
      }
    }
  }
});

/**
 * Checks a token's bits in runs of `way`'s path (emulated, or the tensor cores): dense SwiGLU
 * inputs with add, K = 256 (8 chunks: both staging buffers in turn), 133 rows (partial tiles of
 * 64 and 128), 37 tokens: the whole run, tokens alone, 5 tokens from token 10, and every tile;
 * then experts over gather tables: the whole run's, tokens' own, and every 32-slot tile. (Tokens
 * alone: four of them, each a whole tile's work, which the emulation on a CPU adapter pays.)
 */
async function assertInvariance(
  ctx: GpuContext,
  path: string,
  way: Partial<MulMatOptions>,
): Promise<void> {
  const [K, M, T] = [256, 133, 37];
  const lone = [0, 1, 17, 36];
  const r = rng(61);
  const type = GgmlType.Q8_0;
  const w = await uploadWeights(
    ctx,
    { name: "w", type, shape: [K, M] },
    randomBlocks(type, K * M, 0.5, r),
  );
  const x = upload(ctx, randomF32(T * 2 * K, r, 3));
  const y0 = randomF32(T * M, r);
  const o = { ...way, xStrideT: 2 * K, upOffset: K, swiglu: true, add: true };
  const mmaX = scratch(ctx, T, K);
  const tiles = tilesOf(ctx, [32, 64, 128], way.mmaEmulate);
  // Five on Mesa's 32 KB of workgroup memory, nine on the GPU box's 48 KB, three there where the
  // emulation stages f32 (Dawn without f16).
  assert.ok(tiles.length >= 3, `${path}: ${tiles.length} tiles fit the device`);
  const [whole, alone, run5] = [0, 1, 2].map(() => upload(ctx, y0));
  const tiled = tiles.map(() => upload(ctx, y0));
  await submit(ctx, (enc) => {
    mulMat(enc, { w, x, y: whole, mmaX }, { ...o, tokens: T });
    for (const t of lone) {
      const at = { xOffset: t * 2 * K, yOffset: t * M };
      mulMat(enc, { w, x, y: alone, mmaX }, { ...o, ...at, tokens: 1 });
    }
    mulMat(enc, { w, x, y: run5, mmaX }, { ...o, tokens: 5, xOffset: 20 * K, yOffset: 10 * M });
    tiles.forEach((mmaTile, i) => {
      mulMat(enc, { w, x, y: tiled[i], mmaX }, { ...o, tokens: T, mmaTile });
    });
  });
  const want = await readF32(ctx, whole, T * M);
  for (const t of lone) {
    assertSameBits(
      await readF32(ctx, alone, M, t * M),
      want.subarray(t * M, (t + 1) * M),
      `${path}, dense, token ${t} alone`,
    );
  }
  assertSameBits(
    await readF32(ctx, run5, 5 * M, 10 * M),
    want.subarray(10 * M, 15 * M),
    `${path}, dense, 5 tokens from token 10`,
  );
  for (const [i, t] of tiles.entries()) {
    const got = await readF32(ctx, tiled[i], T * M);
    assertSameBits(got, want, `${path}, dense, tile ${JSON.stringify(t)}`);
  }

  const [Ke, Me, E, nUsed] = [256, 70, 4, 3];
  const exps = await uploadWeights(
    ctx,
    { name: "exps", type: GgmlType.IQ4_XS, shape: [Ke, Me, E] },
    randomBlocks(GgmlType.IQ4_XS, Ke * Me * E, 0.5, r),
  );
  const ids = routing(T, nUsed, E, r);
  const xe = upload(ctx, randomF32(T * nUsed * 2 * Ke, r, 3));
  const idsb = upload(ctx, ids);
  const tokenIds = new Map(
    lone.map((t) => [t, upload(ctx, ids.slice(t * nUsed, (t + 1) * nUsed))]),
  );
  const layout = {
    ...way,
    nUsed,
    xStrideT: nUsed * 2 * Ke,
    xStrideI: 2 * Ke,
    upOffset: Ke,
    swiglu: true,
  };
  const scratchE = scratch(ctx, T * nUsed, Ke);
  const slotTiles = tilesOf(ctx, [32], way.mmaEmulate);
  const ey = () => createStorage(ctx, "y", T * nUsed * Me * 4);
  const [eWhole, eAlone] = [ey(), ey()];
  const eTiled = slotTiles.map(ey);
  await submit(ctx, (enc) => {
    const table = gather(ctx, enc, idsb, T * nUsed, E);
    const all = { ...layout, tokens: T, gatherTiles: gatherTiles(T * nUsed, E, PREFILL_TT) };
    mulMat(enc, { w: exps, x: xe, y: eWhole, ids: table, mmaX: scratchE }, all);
    slotTiles.forEach((mmaTile, i) => {
      const b = { w: exps, x: xe, y: eTiled[i], ids: table, mmaX: scratchE };
      mulMat(enc, b, { ...all, mmaTile });
    });
    for (const t of lone) {
      const own = gather(ctx, enc, tokenIds.get(t)!, nUsed, E);
      mulMat(enc, { w: exps, x: xe, y: eAlone, ids: own, mmaX: scratchE }, {
        ...layout,
        tokens: 1,
        xOffset: t * nUsed * 2 * Ke,
        yOffset: t * nUsed * Me,
        gatherTiles: gatherTiles(nUsed, E, PREFILL_TT),
      });
    }
  });
  const n = T * nUsed * Me;
  const eWant = await readF32(ctx, eWhole, n);
  const perToken = nUsed * Me;
  for (const t of lone) {
    assertSameBits(
      await readF32(ctx, eAlone, perToken, t * perToken),
      eWant.subarray(t * perToken, (t + 1) * perToken),
      `${path}, experts, token ${t} alone`,
    );
  }
  for (const [i, t] of slotTiles.entries()) {
    const got = await readF32(ctx, eTiled[i], n);
    assertSameBits(got, eWant, `${path}, experts, tile ${JSON.stringify(t)}`);
  }
}

gpuTest("an mma product gives a token the same bits in any run, tile and slot", async (ctx) => {
  await assertInvariance(ctx, "emulated", { mma: true, mmaEmulate: true });
  if (ctx.features.subgroupMatrix) {
    await assertInvariance(ctx, "tensor cores", { mma: true });
    return;
  }
  // Without subgroup matrices, `mma` is today's path: a lone token runs the decode kernel,
  // whose bits the tiles share (tests/gpu_mul_mat_test.ts), so the runs agree as above.
  const [K, M, T] = [256, 24, 9];
  const r = rng(62);
  const w = await uploadWeights(
    ctx,
    { name: "w", type: GgmlType.Q6_K, shape: [K, M] },
    randomBlocks(GgmlType.Q6_K, K * M, 0.5, r),
  );
  const x = upload(ctx, randomF32(T * K, r));
  const mmaX = scratch(ctx, 1, K);
  const got = await threeWays(ctx, new Float32Array(T * M), (enc, y, o) => {
    for (let t = 0; t < T; t++) {
      mulMat(enc, { w, x, y, mmaX }, { ...o, tokens: 1, xOffset: t * K, yOffset: t * M });
    }
  });
  assertSameBits(got.mma, got.plain, "one token at a time, no subgroup matrices");
});

gpuTest(
  "moeDownSum() with mma adds the experts' tensor-core products to the residual",
  async (ctx) => {
    // 9 tokens × 2 of 3 experts (SwiGLU per rank), a shared expert's output and the residual.
    const [Fe, D, E, T, k] = [64, 96, 3, 9, 2];
    const r = rng(71);
    const type = GgmlType.Q4_0;
    const bytes = randomBlocks(type, Fe * D * E, 0.5, r);
    const w = await uploadWeights(ctx, { name: "down", type, shape: [Fe, D, E] }, bytes);
    const gateUp = randomF32(T * k * 2 * Fe, r, 2);
    const ids = routing(T, k, E, r);
    const weights = randomF32(T * (k + 1), r);
    const shared = randomF32(T * D, r);
    const residual = randomF32(T * D, r);
    const x = upload(ctx, gateUp);
    const idsb = upload(ctx, ids);
    const wb = upload(ctx, weights);
    const sb = upload(ctx, shared);
    const mmaX = scratch(ctx, T * k, Fe);
    const o = {
      tokens: T,
      nUsed: k,
      xStrideT: k * 2 * Fe,
      xStrideI: 2 * Fe,
      upOffset: Fe,
      swiglu: true,
      gatherTiles: gatherTiles(T * k, E, PREFILL_TT),
    };
    const got = await threeWays(ctx, residual, (enc, y, way) => {
      const table = gather(ctx, enc, idsb, T * k, E);
      const out = createStorage(ctx, "o", T * k * D * 4);
      const b = { w, x, ids: table, weights: wb, shared: sb, o: out, y, mmaX };
      moeDownSum(enc, b, { ...o, ...way });
    });
    const wf = dequantize(type, bytes, Fe * D * E);
    const want = Float64Array.from(residual);
    for (let t = 0; t < T; t++) {
      for (let i = 0; i < k; i++) {
        const s = t * k + i;
        const p = products(wf, ids[s] * D, D, inputRow(gateUp, s * 2 * Fe, Fe, Fe));
        p.forEach((v, c) => want[t * D + c] += weights[t * (k + 1) + i] * v);
      }
      for (let c = 0; c < D; c++) want[t * D + c] += weights[t * (k + 1) + k] * shared[t * D + c];
    }
    // Against the sum alone: the residual's own size would hide its error.
    const sum = want.map((v, i) => v - residual[i]);
    const minus = (a: Float32Array) => a.map((v, i) => v - residual[i]);
    const errors = new Errors();
    const results = { emu: minus(got.emu), mma: minus(got.mma), plain: minus(got.plain) };
    errors.add("moeDownSum", assertResults(ctx, results, sum, "moeDownSum"));
    errors.check("moeDownSum");
  },
);

gpuTest("mma refuses what the tensor-core path cannot do, where it runs", async (ctx) => {
  const [K, M] = [256, 8];
  const r = rng(81);
  const w = await uploadWeights(
    ctx,
    { name: "w", type: GgmlType.Q8_0, shape: [K, M] },
    randomBlocks(GgmlType.Q8_0, K * M, 0.5, r),
  );
  const exps = await uploadWeights(
    ctx,
    { name: "exps", type: GgmlType.Q8_0, shape: [K, M, 2] },
    randomBlocks(GgmlType.Q8_0, K * M * 2, 0.5, r),
  );
  const x = upload(ctx, randomF32(2 * K, r));
  const ids = upload(ctx, Uint32Array.from([0, 1]));
  const norm = { w: upload(ctx, randomF32(K, r)), eps: 1e-6 };
  const y = () => createStorage(ctx, "y", 2 * M * 4);
  const refusals = async (way: Partial<MulMatOptions>, path: string) => {
    const o = { ...way, tokens: 2 };
    const mmaX = scratch(ctx, 2, K);
    const cases: [string, (enc: StepEncoder) => void, RegExp][] = [
      ["norm", (enc) => mulMat(enc, { w, x, y: y(), mmaX }, { ...o, norm }), /folded RMSNorm/],
      ["no scratch", (enc) => mulMat(enc, { w, x, y: y() }, o), /scratch buffer/],
      [
        "f32 tile",
        (enc) => mulMat(enc, { w, x, y: y(), mmaX }, { ...o, tile: { rows: 64, tokens: 64 } }),
        /layout options/,
      ],
      ["ids", (enc) => mulMat(enc, { w: exps, x, y: y(), ids, mmaX }, o), /gather table/],
      [
        "small scratch",
        (enc) => mulMat(enc, { w, x, y: y(), mmaX: scratch(ctx, 1, K) }, o),
        /its scratch holds/,
      ],
    ];
    for (const [what, record, why] of cases) {
      await assert.rejects(() => submit(ctx, record), why, `${path}: ${what}`);
    }
  };
  await refusals({ mma: true, mmaEmulate: true }, "emulated");
  if (ctx.features.subgroupMatrix) {
    await refusals({ mma: true }, "tensor cores");
    return;
  }
  // Today's kernels take all of it: a folded norm over two tokens, no scratch.
  const [ym, yp] = [y(), y()];
  await submit(ctx, (enc) => {
    mulMat(enc, { w, x, y: ym }, { tokens: 2, norm, mma: true });
    mulMat(enc, { w, x, y: yp }, { tokens: 2, norm });
  });
  assertSameBits(
    await readF32(ctx, ym, 2 * M),
    await readF32(ctx, yp, 2 * M),
    "a folded norm, no subgroup matrices: today's kernels",
  );
});
