// GPU matrix products (engine/gpu/kernels/mul_mat.ts) against the CPU dequantizer and float64 dots.
// Covers every weight type, decode products (a token or several a workgroup) and prefill tiles,
// split parts, expert ids (per slot and gathered), SwiGLU input, add, and the decode epilogues
// (pair, conv, MoE sum) against the kernels they replace, bit for bit.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import { gatherTiles, gatherWords, moeGather } from "../engine/gpu/kernels/moe_gather.ts";
import {
  MATVEC_MAX_TOKENS,
  MATVEC_WIDE_MAX_TOKENS,
  MUL_MAT_TYPES,
  mulMat,
  mulMatPair,
  PREFILL_TT,
  tileFor,
  type TileShape,
} from "../engine/gpu/kernels/mul_mat.ts";
import {
  type MatVecLayout,
  type MatVecTokens,
  PREFETCH_TYPES,
  slotLayout,
  WIDE_ROWS,
} from "../engine/gpu/kernels/mul_mat_vec.ts";
import type { GpuTensor } from "../engine/gpu/tensor.ts";
import { moeSum } from "../engine/gpu/kernels/moe_sum.ts";
import { rmsNorm } from "../engine/gpu/kernels/rms_norm.ts";
import { ssmConv } from "../engine/gpu/kernels/ssm_conv.ts";
import { dequantize } from "../engine/quant/dequant.ts";
import { randomBlocks } from "../tools/synth/quantize.ts";
import { GgmlType, rowBytes, typeName } from "../engine/quant/ggml_types.ts";
import {
  assertClose,
  gpuTest,
  randomF32,
  readF32,
  rng,
  submit,
  upload,
  uploadWeights,
} from "./_gpu.ts";

// f32 products summed in a different order than the float64 reference: each output is off by
// at most ~(chunk length 32 + log2 K)·2^-24 of Σ|w·x|; 1e-5 leaves a wide margin.
const TOL = 1e-5;

/** Float64 y[t][r] = Σ w[r][i]·x[t][i] and the scale Σ|w·x| of each. */
function reference(w: Float32Array, x: Float32Array, K: number, M: number, T: number) {
  const y = new Float64Array(T * M);
  const scale = new Float64Array(T * M);
  for (let t = 0; t < T; t++) {
    for (let r = 0; r < M; r++) {
      let s = 0;
      let a = 0;
      for (let i = 0; i < K; i++) {
        const p = w[r * K + i] * x[t * K + i];
        s += p;
        a += Math.abs(p);
      }
      y[t * M + r] = s;
      scale[t * M + r] = a;
    }
  }
  return { y, scale };
}

async function runPlain(
  ctx: GpuContext,
  type: GgmlType,
  K: number,
  M: number,
  T: number,
  maxPartBytes?: number,
): Promise<void> {
  const r = rng(1000 + type * 31 + T);
  const bytes = randomBlocks(type, K * M, 0.5, r);
  const w = dequantize(type, bytes, K * M);
  const x = randomF32(T * K, r);
  const tensor = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes, {
    maxPartBytes,
  });
  if (maxPartBytes) assert.ok(tensor.parts.length > 1, "the tensor is split into parts");
  const y = createStorage(ctx, "y", T * M * 4);
  await submit(ctx, (enc) => mulMat(enc, { w: tensor, x: upload(ctx, x), y }, { tokens: T }));
  const got = await readF32(ctx, y, T * M);
  const ref = reference(w, x, K, M, T);
  assertClose(got, ref.y, ref.scale, TOL, `${typeName(type)} K=${K} M=${M} T=${T}`);
}

gpuTest("mulMat() matches the dequantized float64 product for every weight type", async (ctx) => {
  for (const type of MUL_MAT_TYPES) {
    await runPlain(ctx, type, 512, 37, 1);
    await runPlain(ctx, type, 512, 37, 11);
  }
});

gpuTest("mulMat() works on a tensor split into several parts", async (ctx) => {
  // 37 rows of Q4_0 (K=96: 3 blocks, 54 bytes a row: rows start at unaligned bytes) in 10-row parts.
  await runPlain(ctx, GgmlType.Q4_0, 96, 37, 3, 10 * rowBytes(GgmlType.Q4_0, 96));
  // Q8_0 rows of 102 bytes: rows and blocks at both word alignments, decode and prefill.
  await runPlain(ctx, GgmlType.Q8_0, 96, 37, 1, 10 * rowBytes(GgmlType.Q8_0, 96));
  await runPlain(ctx, GgmlType.Q8_0, 96, 37, 7, 10 * rowBytes(GgmlType.Q8_0, 96));
  await runPlain(ctx, GgmlType.Q6_K, 256, 37, 1, 7 * rowBytes(GgmlType.Q6_K, 256));
});

gpuTest(
  "mulMat() with ids multiplies each token by its experts, over split stacks",
  async (ctx) => {
    const type = GgmlType.Q4_K;
    const [K, M, E, T, nUsed] = [256, 21, 5, 3, 2];
    const r = rng(7);
    const bytes = randomBlocks(type, K * M * E, 0.5, r);
    const w = dequantize(type, bytes, K * M * E);
    // Per (t, i): an input row of [gate (K) | up (K)] halves: the SwiGLU input of a down projection.
    const x = randomF32(T * nUsed * 2 * K, r);
    const ids = Uint32Array.from([4, 0, 2, 2, 1, 3]);
    // Two experts per part: parts hold experts {0,1}, {2,3}, {4}.
    const tensor = await uploadWeights(ctx, { name: "exps", type, shape: [K, M, E] }, bytes, {
      maxPartBytes: 2 * M * rowBytes(type, K),
    });
    assert.equal(tensor.parts.length, 3);
    const y = createStorage(ctx, "y", T * nUsed * M * 4);
    await submit(
      ctx,
      (enc) =>
        mulMat(enc, { w: tensor, x: upload(ctx, x), y, ids: upload(ctx, ids) }, {
          tokens: T,
          nUsed,
          xStrideT: nUsed * 2 * K,
          xStrideI: 2 * K,
          upOffset: K,
          swiglu: true,
        }),
    );
    const got = await readF32(ctx, y, T * nUsed * M);
    const want = new Float64Array(T * nUsed * M);
    const scale = new Float64Array(T * nUsed * M);
    for (let t = 0; t < T; t++) {
      for (let i = 0; i < nUsed; i++) {
        const e = ids[t * nUsed + i];
        const xo = (t * nUsed + i) * 2 * K;
        for (let row = 0; row < M; row++) {
          let s = 0;
          let a = 0;
          for (let c = 0; c < K; c++) {
            const g = x[xo + c];
            const act = (g / (1 + Math.exp(-g))) * x[xo + K + c];
            const p = w[(e * M + row) * K + c] * act;
            s += p;
            a += Math.abs(p);
          }
          want[(t * nUsed + i) * M + row] = s;
          scale[(t * nUsed + i) * M + row] = a;
        }
      }
    }
    // silu uses the GPU's exp (a few ulp) on top of the f32 sums.
    assertClose(got, want, scale, 3e-5, "expert products");
  },
);

gpuTest("mulMat() with add accumulates into y at an offset and stride", async (ctx) => {
  const type = GgmlType.Q8_0;
  const [K, M, T] = [64, 9, 2];
  const r = rng(9);
  const bytes = randomBlocks(type, K * M, 0.5, r);
  const w = dequantize(type, bytes, K * M);
  const x = randomF32(T * K, r);
  const stride = M + 5;
  const y0 = randomF32(T * stride, r);
  const tensor = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
  const y = upload(ctx, y0);
  await submit(ctx, (enc) =>
    mulMat(enc, { w: tensor, x: upload(ctx, x), y }, {
      tokens: T,
      yOffset: 3,
      yStrideT: stride,
      add: true,
    }));
  const got = await readF32(ctx, y, T * stride);
  const ref = reference(w, x, K, M, T);
  const want = Float64Array.from(y0);
  const scale = new Float64Array(T * stride).fill(1e-30);
  for (let t = 0; t < T; t++) {
    for (let row = 0; row < M; row++) {
      want[t * stride + 3 + row] += ref.y[t * M + row];
      scale[t * stride + 3 + row] = ref.scale[t * M + row] + Math.abs(y0[t * stride + 3 + row]);
    }
  }
  assertClose(got, want, scale, TOL, "y + W·x");
});

gpuTest(
  "mulMat() over a gather table, as tiles or decode products, equals the per-slot products bit for bit",
  async (ctx) => {
    // Q5_K and IQ4_XS: slots of a 13-row step in the wide slot layout, without and with bursts.
    for (const type of [GgmlType.Q5_K, GgmlType.IQ4_XS]) await gatheredEqualsPerSlot(ctx, type);
  },
);

/** Expert products of one type: per slot (two layouts) against gathered tiles and decodes. */
async function gatheredEqualsPerSlot(ctx: GpuContext, type: GgmlType): Promise<void> {
  const [K, M, E, T, nUsed] = [256, 13, 5, 13, 3];
  const r = rng(8 + type);
  const bytes = randomBlocks(type, K * M * E, 0.5, r);
  const x = randomF32(T * K, r);
  // Expert 4 gets 19 slots (several groups of every decode workgroup's size), expert 1 none.
  const ids = Uint32Array.from({ length: T * nUsed }, (_, s) => [4, 0, 2, 4, 3, 4][s % 6]);
  const tensor = await uploadWeights(ctx, { name: "exps", type, shape: [K, M, E] }, bytes, {
    maxPartBytes: 2 * M * rowBytes(type, K),
  });
  const xb = upload(ctx, x);
  const idsb = upload(ctx, ids);
  const table = createStorage(ctx, "table", 4 * gatherWords(T * nUsed, E, PREFILL_TT));
  const perSlot = createStorage(ctx, "per slot", T * nUsed * M * 4);
  // The tiles, then decode workgroups of 1, 2, 4 and 8 slots.
  const runs = [
    { tile: tileFor(ctx, M, true) },
    ...([1, 2, 4, 8] as const).map((n) => ({
      decodeTokens: n,
    })),
  ];
  const gathered = runs.map(() => createStorage(ctx, "gathered", T * nUsed * M * 4));
  // The layout a step of fewer rows gives its slots.
  const narrow = createStorage(ctx, "per slot, narrow", T * nUsed * M * 4);
  await submit(ctx, (enc) => {
    mulMat(enc, { w: tensor, x: xb, y: perSlot, ids: idsb }, { tokens: T, nUsed });
    mulMat(enc, { w: tensor, x: xb, y: narrow, ids: idsb }, {
      tokens: T,
      nUsed,
      decode: slotLayout(type, 1),
    });
    moeGather(enc, { ids: idsb, table }, { slots: T * nUsed, experts: E, tt: PREFILL_TT });
    runs.forEach((run, j) =>
      mulMat(enc, { w: tensor, x: xb, y: gathered[j], ids: table }, {
        ...run,
        tokens: T,
        nUsed,
        gatherTiles: gatherTiles(T * nUsed, E, PREFILL_TT),
      })
    );
  });
  const a = await readF32(ctx, perSlot, T * nUsed * M);
  assertSameBits(a, await readF32(ctx, narrow, T * nUsed * M), M, `${typeName(type)} narrow`);
  for (const [j, run] of runs.entries()) {
    assertSameBits(a, await readF32(ctx, gathered[j], T * nUsed * M), M, JSON.stringify(run));
  }
  const b = await readF32(ctx, gathered[0], T * nUsed * M);
  const w = dequantize(type, bytes, K * M * E);
  const want = new Float64Array(T * nUsed * M);
  const scale = new Float64Array(T * nUsed * M);
  for (let s = 0; s < T * nUsed; s++) {
    const t = Math.floor(s / nUsed);
    for (let row = 0; row < M; row++) {
      for (let c = 0; c < K; c++) {
        const p = w[(ids[s] * M + row) * K + c] * x[t * K + c];
        want[s * M + row] += p;
        scale[s * M + row] += Math.abs(p);
      }
    }
  }
  assertClose(b, want, scale, TOL, "gathered expert products");
}

/**
 * y of `tokens` tokens, each token in its own call, then all in one call (the engine's choice:
 * decode products up to MATVEC_MAX_TOKENS, else prefill tiles; or the tile given).
 */
async function singleAndBatched(
  ctx: GpuContext,
  type: GgmlType,
  K: number,
  M: number,
  T: number,
  o: { readonly swiglu?: boolean; readonly add?: boolean; readonly tile?: TileShape },
): Promise<{ single: Float32Array; batched: Float32Array }> {
  const r = rng(2000 + type * 17 + T);
  const bytes = randomBlocks(type, K * M, 0.5, r);
  const xWidth = o.swiglu ? 2 * K : K;
  const x = upload(ctx, randomF32(T * xWidth, r));
  const y0 = randomF32(T * M, r);
  const w = await uploadWeights(ctx, { name: "w", type, shape: [K, M] }, bytes);
  const single = upload(ctx, y0);
  const batched = upload(ctx, y0);
  const common = { swiglu: o.swiglu, add: o.add, upOffset: o.swiglu ? K : 0 };
  await submit(ctx, (enc) => {
    for (let t = 0; t < T; t++) {
      mulMat(enc, { w, x, y: single }, {
        ...common,
        tokens: 1,
        xOffset: t * xWidth,
        yOffset: t * M,
      });
    }
    mulMat(enc, { w, x, y: batched }, { ...common, tokens: T, xStrideT: xWidth, tile: o.tile });
  });
  return { single: await readF32(ctx, single, T * M), batched: await readF32(ctx, batched, T * M) };
}

/** Throws at the first output whose bits differ between a token alone and the batch. */
function assertSameBits(single: Float32Array, batched: Float32Array, M: number, what: string) {
  assert.ok(single.some((v) => v !== 0), "the products are not all zero");
  for (let i = 0; i < single.length; i++) {
    if (!Object.is(single[i], batched[i])) {
      throw new Error(
        `${what}: token ${Math.floor(i / M)} row ${i % M} is ${batched[i]} in a batch but ${
          single[i]
        } alone`,
      );
    }
  }
}

gpuTest(
  "mulMat() gives every token the same bits alone as inside a batch (batch invariance)",
  async (ctx) => {
    // K = 1280: 40 chunks, so classes 0..7 sum three chunks, 8..15 two; M = 70 rows: two row
    // tiles, the second partial; 13 and 37 tokens: decode products in a partial last group; 6
    // past the decode products' most: prefill tiles, the last partial.
    const cases: [GgmlType, number, { swiglu?: boolean; add?: boolean }][] = [
      [GgmlType.Q8_0, 13, {}],
      [GgmlType.Q8_0, MATVEC_MAX_TOKENS + 6, { add: true }],
      [GgmlType.IQ4_XS, 37, {}],
      [GgmlType.Q4_K, 13, { swiglu: true }],
      [GgmlType.Q6_K, MATVEC_MAX_TOKENS + 6, {}],
      [GgmlType.F32, 37, { swiglu: true, add: true }],
    ];
    for (const [type, T, o] of cases) {
      const { single, batched } = await singleAndBatched(ctx, type, 1280, 70, T, o);
      assertSameBits(single, batched, 70, `${typeName(type)} T=${T} ${JSON.stringify(o)}`);
    }
    // A joined projection's rows: past MATVEC_WIDE_MAX_TOKENS the tiles, below it four tokens a
    // workgroup in 256 threads.
    for (const T of [MATVEC_WIDE_MAX_TOKENS - 3, MATVEC_WIDE_MAX_TOKENS + 3]) {
      const { single, batched } = await singleAndBatched(ctx, GgmlType.Q8_0, 256, WIDE_ROWS, T, {});
      assertSameBits(single, batched, WIDE_ROWS, `Q8_0 ${WIDE_ROWS} rows T=${T}`);
    }
  },
);

gpuTest("every prefill tile shape gives each token its bits alone", async (ctx) => {
  // M = 133 rows: a partial last tile of 64 and of 128 rows; 37 tokens: partial tiles of 32 and
  // 64; F32 and Q8_0 prefetch, IQ4_XS's dense tiles of 32 slots hold its table, Q6_K does neither.
  const tiles: TileShape[] = [
    { rows: 64, tokens: 64 },
    { rows: 128, tokens: 64 },
    { rows: 64, tokens: 32 },
    { rows: 128, tokens: 32 },
  ];
  const types: [GgmlType, { swiglu?: boolean; add?: boolean }][] = [
    [GgmlType.F32, { add: true }],
    [GgmlType.Q8_0, { swiglu: true }],
    [GgmlType.IQ4_XS, {}],
    [GgmlType.Q6_K, {}],
  ];
  for (const [type, o] of types) {
    for (const tile of tiles) {
      const { single, batched } = await singleAndBatched(ctx, type, 1280, 133, 37, { ...o, tile });
      assertSameBits(single, batched, 133, `${typeName(type)} ${tile.rows}×${tile.tokens}`);
    }
  }
  // The engine's choice: 32-token tiles for a router's few rows, 128 rows from 2048 and for the
  // experts, 64 × 64 where a device has only the 16 KB WebGPU guarantees.
  const shape = (rows: number, id: boolean, target = ctx) => {
    const t = tileFor(target, rows, id);
    return `${t.rows}x${t.tokens}`;
  };
  const small = { ...ctx, limits: { ...ctx.limits, maxComputeWorkgroupStorageSize: 16384 } };
  assert.deepEqual(
    [shape(257, false), shape(1024, false), shape(2048, false), shape(1024, true)],
    ctx.limits.maxComputeWorkgroupStorageSize >= 24576 + 64
      ? ["64x32", "64x64", "128x64", "128x32"]
      : ["64x32", "64x64", "64x64", "64x32"],
  );
  assert.deepEqual([shape(2048, false, small), shape(1024, true, small)], ["64x64", "64x32"]);
});

gpuTest("every decode layout gives each token the bits of the prefill tile", async (ctx) => {
  // K = 2304: 72 chunks, two windows (64 + 8), classes 0..7 of five chunks and 8..15 of four;
  // M = 70 rows: a partial last tile in every layout; 5 tokens, run as a tile.
  const [K, M, T] = [2304, 70, 5];
  const allLayouts: MatVecLayout[] = [
    { wg: 128, cu: 16, rpt: 1, xstage: true },
    { wg: 256, cu: 16, rpt: 4, xstage: false },
    { wg: 128, cu: 64, rpt: 2, xstage: true },
    { wg: 256, cu: 32, rpt: 2, xstage: false },
    { wg: 128, cu: 16, rpt: 2, xstage: true, burst: 2 },
    { wg: 256, cu: 16, rpt: 4, xstage: false, burst: 4 },
  ];
  for (const type of [GgmlType.F32, GgmlType.Q8_0, GgmlType.Q6_K, GgmlType.IQ4_XS]) {
    // Bursts of two chunks only where the dequantizer splits its loads off.
    const layouts = allLayouts.filter((l) => !l.burst || PREFETCH_TYPES.includes(type));
    const r = rng(77 + type);
    const w = await uploadWeights(
      ctx,
      { name: "w", type, shape: [K, M] },
      randomBlocks(type, K * M, 0.5, r),
    );
    const x = upload(ctx, randomF32(T * K, r));
    const tiled = createStorage(ctx, "tiled", T * M * 4);
    const alone = layouts.map(() => createStorage(ctx, "alone", T * M * 4));
    await submit(ctx, (enc) => {
      mulMat(enc, { w, x, y: tiled }, { tokens: T, tile: tileFor(ctx, M, false) });
      layouts.forEach((decode, j) => {
        for (let t = 0; t < T; t++) {
          mulMat(enc, { w, x, y: alone[j] }, { tokens: 1, xOffset: t * K, yOffset: t * M, decode });
        }
      });
    });
    const want = await readF32(ctx, tiled, T * M);
    assert.ok(want.some((v) => v !== 0), "the products are not all zero");
    for (const [j, decode] of layouts.entries()) {
      const got = await readF32(ctx, alone[j], T * M);
      for (let i = 0; i < want.length; i++) {
        if (!Object.is(got[i], want[i])) {
          throw new Error(
            `${typeName(type)} ${JSON.stringify(decode)}: output ${i} is ${got[i]} alone, ${
              want[i]
            } in the tile`,
          );
        }
      }
    }
  }
});

gpuTest(
  "decode workgroups of 2, 4 and 8 tokens give each token its bits alone, as does the engine's choice",
  async (ctx) => {
    // K = 2304: 72 chunks, so windows of 64, 32 and 16 chunks each end in a partial one; M = 70:
    // a partial last row tile; 19 tokens: a partial last group of every size; inputs staged and
    // not, accumulated and SwiGLU.
    const [K, M, T] = [2304, 70, 19];
    const w128r1 = { wg: 128, cu: 16, rpt: 1, xstage: true } as const;
    const allRuns: { decode?: MatVecLayout; decodeTokens?: MatVecTokens }[] = [
      {},
      { decode: w128r1, decodeTokens: 2 },
      { decode: w128r1, decodeTokens: 4 },
      { decode: w128r1, decodeTokens: 8 },
      { decode: { wg: 256, cu: 16, rpt: 2, xstage: true }, decodeTokens: 4 },
      { decode: { wg: 256, cu: 16, rpt: 4, xstage: false }, decodeTokens: 8 },
      { decode: { ...w128r1, burst: 2 }, decodeTokens: 2 },
    ];
    const cases: [GgmlType, { swiglu?: boolean; add?: boolean }][] = [
      [GgmlType.F32, { add: true }],
      [GgmlType.Q8_0, {}],
      [GgmlType.Q6_K, { swiglu: true }],
      [GgmlType.IQ4_XS, { add: true }],
    ];
    for (const [type, o] of cases) {
      // Bursts of two chunks only where the dequantizer splits its loads off.
      const runs = allRuns.filter((run) => !run.decode?.burst || PREFETCH_TYPES.includes(type));
      const r = rng(91 + type);
      const w = await uploadWeights(
        ctx,
        { name: "w", type, shape: [K, M] },
        randomBlocks(type, K * M, 0.5, r),
      );
      const xWidth = o.swiglu ? 2 * K : K;
      const x = upload(ctx, randomF32(T * xWidth, r));
      const y0 = randomF32(T * M, r);
      const common = { ...o, upOffset: o.swiglu ? K : 0, xStrideT: xWidth };
      const alone = upload(ctx, y0);
      const together = runs.map(() => upload(ctx, y0));
      await submit(ctx, (enc) => {
        for (let t = 0; t < T; t++) {
          mulMat(enc, { w, x, y: alone }, {
            ...common,
            tokens: 1,
            xOffset: t * xWidth,
            yOffset: t * M,
          });
        }
        runs.forEach((run, j) =>
          mulMat(enc, { w, x, y: together[j] }, { ...common, ...run, tokens: T })
        );
      });
      const want = await readF32(ctx, alone, T * M);
      for (const [j, run] of runs.entries()) {
        const what = `${typeName(type)} ${JSON.stringify(run)}`;
        assertSameBits(want, await readF32(ctx, together[j], T * M), M, what);
      }
    }
  },
);

gpuTest(
  "mulMat() with a folded RMSNorm gives the bits of rmsNorm() then the product",
  async (ctx) => {
    // K = 1280 (a partial last round of 256 partials in the norm; x fits one staging window)
    // and 2304 (two windows: x normed as it is staged), 5 tokens: the unfolded product runs as
    // a prefill tile, the folded one token by token and all five at once (two a workgroup);
    // experts: 3 of 4, decode.
    const [M, T, E, nUsed, eps] = [70, 5, 4, 3, 1e-6];
    const r = rng(31);
    const ids = upload(ctx, Uint32Array.from([3, 0, 2]));
    const cases = [[GgmlType.Q8_0, 1280], [GgmlType.F32, 1280], [GgmlType.IQ4_XS, 2304]] as const;
    for (const [type, K] of cases) {
      const xs = upload(ctx, randomF32(T * K, r, 3));
      const nw = upload(ctx, randomF32(K, r));
      const h = createStorage(ctx, "h", T * K * 4);
      const bytes = randomBlocks(type, K * M * E, 0.5, r);
      const w = await uploadWeights(
        ctx,
        { name: "w", type, shape: [K, M] },
        bytes.subarray(0, rowBytes(type, K) * M),
      );
      const exps = await uploadWeights(ctx, { name: "exps", type, shape: [K, M, E] }, bytes);
      const [folded, unfolded, together] = [0, 1, 2].map(() => createStorage(ctx, "y", T * M * 4));
      const [foldedIds, unfoldedIds] = [0, 1].map(() => createStorage(ctx, "y", nUsed * M * 4));
      const norm = { w: nw, eps };
      await submit(ctx, (enc) => {
        rmsNorm(enc, { x: xs, w: nw, y: h }, { n: K, rows: T, eps });
        mulMat(enc, { w, x: h, y: unfolded }, { tokens: T, tile: tileFor(ctx, M, false) });
        mulMat(enc, { w: exps, x: h, y: unfoldedIds, ids }, { tokens: 1, nUsed, xStrideI: 0 });
        for (let t = 0; t < T; t++) {
          mulMat(enc, { w, x: xs, y: folded }, { tokens: 1, norm, xOffset: t * K, yOffset: t * M });
        }
        mulMat(enc, { w, x: xs, y: together }, { tokens: T, norm });
        mulMat(enc, { w: exps, x: xs, y: foldedIds, ids }, { tokens: 1, nUsed, xStrideI: 0, norm });
      });
      const pairs = [
        [folded, unfolded, "plain"],
        [together, unfolded, "plain, all tokens at once"],
        [foldedIds, unfoldedIds, "experts"],
      ] as const;
      for (const [a, b, what] of pairs) {
        const n = what === "experts" ? nUsed * M : T * M;
        const got = await readF32(ctx, a, n);
        const want = await readF32(ctx, b, n);
        assert.ok(want.some((v) => v !== 0), "the products are not all zero");
        for (let i = 0; i < n; i++) {
          if (!Object.is(got[i], want[i])) {
            throw new Error(
              `${typeName(type)} ${what}: output ${i} is ${got[i]} folded, ${
                want[i]
              } after rmsNorm()`,
            );
          }
        }
      }
    }
  },
);

gpuTest(
  "mulMat() over a gather table of full tiles gives SwiGLU expert products bit for bit",
  async (ctx) => {
    // 37 tokens × 3 ranks, expert 2 taking more than one tile of PREFILL_TT slots; as tiles and
    // as the engine's decode products (a step of 37 tokens).
    const type = GgmlType.IQ4_XS;
    const [K, M, E, T, nUsed] = [512, 70, 4, 37, 3];
    const r = rng(11);
    const bytes = randomBlocks(type, K * M * E, 0.5, r);
    const x = upload(ctx, randomF32(T * nUsed * 2 * K, r));
    const ids = Uint32Array.from(
      { length: T * nUsed },
      (_, s) => s % 3 === 0 ? 2 : [0, 1, 3][s % 4 % 3],
    );
    assert.ok(ids.filter((e) => e === 2).length > PREFILL_TT, "expert 2 needs two tiles");
    const o = { swiglu: true };
    const w = await uploadWeights(ctx, { name: "exps", type, shape: [K, M, E] }, bytes);
    const idsb = upload(ctx, ids);
    // A decode call reads the ids of its one token from the start of the buffer.
    const tokenIds = Array.from(
      { length: T },
      (_, t) => upload(ctx, ids.slice(t * nUsed, (t + 1) * nUsed)),
    );
    const table = createStorage(ctx, "table", 4 * gatherWords(T * nUsed, E, PREFILL_TT));
    const perSlot = createStorage(ctx, "per slot", T * nUsed * M * 4);
    const [tiled, decoded] = [0, 1].map(() => createStorage(ctx, "gathered", T * nUsed * M * 4));
    const layout = { nUsed, xStrideT: nUsed * 2 * K, xStrideI: 2 * K, upOffset: K, ...o };
    await submit(ctx, (enc) => {
      for (let t = 0; t < T; t++) {
        mulMat(enc, { w, x, y: perSlot, ids: tokenIds[t] }, {
          ...layout,
          tokens: 1,
          xOffset: t * nUsed * 2 * K,
          yOffset: t * nUsed * M,
        });
      }
      moeGather(enc, { ids: idsb, table }, { slots: T * nUsed, experts: E, tt: PREFILL_TT });
      const gathered = { ...layout, tokens: T, gatherTiles: gatherTiles(T * nUsed, E, PREFILL_TT) };
      mulMat(enc, { w, x, y: tiled, ids: table }, { ...gathered, tile: tileFor(ctx, M, true) });
      mulMat(enc, { w, x, y: decoded, ids: table }, gathered);
    });
    const a = await readF32(ctx, perSlot, T * nUsed * M);
    assertSameBits(a, await readF32(ctx, tiled, T * nUsed * M), M, "tiles");
    assertSameBits(a, await readF32(ctx, decoded, T * nUsed * M), M, "decode products");
  },
);

gpuTest("mulMatPair() gives both products the bits mulMat gives each alone", async (ctx) => {
  // The shared expert's gate|up (Q8_0, 70 rows) and the router (F32, 37 rows) on one normed
  // input, 3 tokens, each into a wider row at an offset: the layouts the engine uses for one row
  // and (undefined: its choice) for several, two tokens a workgroup, the last group half full;
  // against each product alone in the one-row layout, a token a workgroup.
  const [K, M, M2, T, eps] = [1280, 70, 37, 3, 1e-6];
  const r = rng(41);
  const x = upload(ctx, randomF32(T * K, r, 3));
  const norm = { w: upload(ctx, randomF32(K, r)), eps };
  const w = await uploadWeights(
    ctx,
    { name: "gate|up", type: GgmlType.Q8_0, shape: [K, M] },
    randomBlocks(GgmlType.Q8_0, K * M, 0.5, r),
  );
  const w2 = await uploadWeights(
    ctx,
    { name: "router", type: GgmlType.F32, shape: [K, M2] },
    randomBlocks(GgmlType.F32, K * M2, 0.5, r),
  );
  const [yo, ys, y2o, y2s] = [3, M + 5, 1, M2 + 2];
  const oneRow: MatVecLayout = { wg: 128, cu: 64, rpt: 2, xstage: true };
  const layouts: (MatVecLayout | undefined)[] = [
    oneRow,
    { wg: 128, cu: 64, rpt: 1, xstage: true },
    undefined,
    { wg: 256, cu: 16, rpt: 2, xstage: true },
  ];
  const [alone, alone2] = [ys, y2s].map((n) => createStorage(ctx, "y", T * n * 4));
  await submit(ctx, (enc) => {
    const o = { tokens: T, norm, decode: oneRow };
    mulMat(enc, { w, x, y: alone }, { ...o, yOffset: yo, yStrideT: ys });
    mulMat(enc, { w: w2, x, y: alone2 }, { ...o, yOffset: y2o, yStrideT: y2s });
  });
  for (const decode of layouts) {
    const [y, y2] = [ys, y2s].map((n) => createStorage(ctx, "y", T * n * 4));
    let paired = false;
    await submit(ctx, (enc) => {
      paired = mulMatPair(enc, { w, w2, x, y, y2 }, {
        tokens: T,
        norm,
        yOffset: yo,
        yStrideT: ys,
        y2Offset: y2o,
        y2StrideT: y2s,
        decode,
      });
    });
    assert.ok(paired, "the pair applies to one-part Q8_0 and F32 matrices");
    for (const [a, b, n, what] of [[y, alone, ys, "Q8_0"], [y2, alone2, y2s, "F32"]] as const) {
      const got = await readF32(ctx, a, T * n);
      const want = await readF32(ctx, b, T * n);
      assert.ok(want.some((v) => v !== 0), "the products are not all zero");
      for (let i = 0; i < T * n; i++) {
        if (!Object.is(got[i], want[i])) {
          throw new Error(
            `${what} ${JSON.stringify(decode)}: output ${i} is ${got[i]} paired, ${want[i]} alone`,
          );
        }
      }
    }
  }
});

/** Random Q8_0 weights of M rows of K values, uploaded in parts of `rowsAPart` rows. */
function splitQ8Weights(
  ctx: GpuContext,
  name: string,
  K: number,
  M: number,
  rowsAPart: number,
  r: () => number,
): Promise<GpuTensor> {
  return uploadWeights(
    ctx,
    { name, type: GgmlType.Q8_0, shape: [K, M] },
    randomBlocks(GgmlType.Q8_0, K * M, 0.5, r),
    { maxPartBytes: rowsAPart * rowBytes(GgmlType.Q8_0, K) },
  );
}

gpuTest(
  "mulMat()'s conv epilogue gives u, the conv state and y the bits of mulMat then ssmConv",
  async (ctx) => {
    // A DeltaNet projection of 70 rows whose first 40 are conv channels, written at column 0 of
    // a 75-wide row, a normed input, three tokens in a row so the state carries; maxPartBytes
    // splits W so a part's rows start past the channels' end and inside them.
    const [K, M, C, Kc, width, eps] = [256, 70, 40, 4, 75, 1e-6];
    const r = rng(43);
    const norm = { w: upload(ctx, randomF32(K, r)), eps };
    const cw = upload(ctx, randomF32(C * Kc, r));
    const state0 = randomF32((Kc - 1) * C, r);
    const w = await splitQ8Weights(ctx, "qkvz", K, M, 24, r);
    assert.ok(w.parts.length > 2, "the weights are split into parts");
    const [fusedState, apartState] = [upload(ctx, state0), upload(ctx, state0)];
    for (let t = 0; t < 3; t++) {
      const x = upload(ctx, randomF32(K, r, 3));
      const [y, yApart] = [0, 1].map(() => createStorage(ctx, "y", width * 4));
      const [u, uApart] = [0, 1].map(() => createStorage(ctx, "u", C * 4));
      await submit(ctx, (enc) => {
        mulMat(enc, { w, x, y }, {
          tokens: 1,
          norm,
          yStrideT: width,
          conv: { w: cw, state: fusedState, u, channels: C, kc: Kc },
        });
        mulMat(enc, { w, x, y: yApart }, { tokens: 1, norm, yStrideT: width });
        ssmConv(enc, { x: yApart, w: cw, state: apartState, u: uApart }, {
          channels: C,
          kc: Kc,
          tokens: 1,
          xStrideT: width,
          uStrideT: C,
        });
      });
      // (assertSameBits names "in a batch" the fused outputs, "alone" the kernels apart.)
      assertSameBits(await readF32(ctx, yApart, M), await readF32(ctx, y, M), M, `token ${t} y`);
      assertSameBits(await readF32(ctx, uApart, C), await readF32(ctx, u, C), C, `token ${t} u`);
      assertSameBits(
        await readF32(ctx, apartState, (Kc - 1) * C),
        await readF32(ctx, fusedState, (Kc - 1) * C),
        C,
        `token ${t} state`,
      );
    }
  },
);

gpuTest(
  "mulMat()'s MoE-sum epilogue adds to x the bits of the shared expert's down then moeSum",
  async (ctx) => {
    // The shared expert's down (Q8_0, 96 rows, SwiGLU over 2·64 inputs) of 2 tokens (a decode
    // step: a pair a workgroup) and of 9 (groups of eight), 3 routed experts' outputs and their
    // weights, into a residual; W split so parts start mid-way.
    for (const T of [2, 9]) await moeSumEpilogue(ctx, T);
  },
);

/** The MoE-sum epilogue of a step of T tokens against the product, then moeSum. */
async function moeSumEpilogue(ctx: GpuContext, T: number): Promise<void> {
  const [Fs, D, k] = [64, 96, 3];
  const r = rng(47 + T);
  const w = await splitQ8Weights(ctx, "shared down", Fs, D, 40, r);
  assert.ok(w.parts.length > 1, "the weights are split into parts");
  const gateUp = upload(ctx, randomF32(T * 2 * Fs, r, 2));
  const experts = upload(ctx, randomF32(T * k * D, r));
  const weights = upload(ctx, randomF32(T * (k + 1), r));
  const residual = randomF32(T * D, r);
  const [x, xApart] = [upload(ctx, residual), upload(ctx, residual)];
  const shared = createStorage(ctx, "shared", T * D * 4);
  const down = { tokens: T, xStrideT: 2 * Fs, upOffset: Fs, swiglu: true };
  await submit(ctx, (enc) => {
    mulMat(enc, { w, x: gateUp, y: x }, { ...down, moeSum: { experts, weights, k } });
    mulMat(enc, { w, x: gateUp, y: shared }, down);
    moeSum(enc, { o: experts, s: shared, weights, x: xApart }, {
      d: D,
      k,
      tokens: T,
      sharedExpert: true,
    });
  });
  const got = await readF32(ctx, x, T * D);
  assert.ok(got.some((v, i) => v !== residual[i]), "the sum changed x");
  assertSameBits(
    await readF32(ctx, xApart, T * D),
    got,
    D,
    `x of ${T} tokens, fused (batch) or apart (alone)`,
  );
}
