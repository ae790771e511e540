// GPU RMSNorm, embedding lookup and q/k norm + RoPE (engine/gpu/kernels/{rms_norm,get_rows,
// qk_norm_rope}.ts) against engine/reference and engine/quant on random inputs.

import { createStorage } from "../engine/gpu/buffers.ts";
import { getRows } from "../engine/gpu/kernels/get_rows.ts";
import { MUL_MAT_TYPES } from "../engine/gpu/kernels/mul_mat.ts";
import { qkNormRope } from "../engine/gpu/kernels/qk_norm_rope.ts";
import { rmsNorm } from "../engine/gpu/kernels/rms_norm.ts";
import { dequantize } from "../engine/quant/dequant.ts";
import { f16ToF32 } from "../engine/quant/f16.ts";
import { randomBlocks } from "../tools/synth/quantize.ts";
import { rowBytes, typeName } from "../engine/quant/ggml_types.ts";
import { rmsNorm as refRmsNorm } from "../engine/reference/norms.ts";
import { ropeImrope, ropeNeox, ropeThetaScale } from "../engine/reference/rope.ts";
import {
  assertClose,
  gpuTest,
  randomF32,
  readF32,
  readU32,
  rng,
  submit,
  upload,
  uploadWeights,
} from "./_gpu.ts";

gpuTest("rmsNorm() matches the reference on rows longer than the workgroup", async (ctx) => {
  const [n, rows, stride] = [300, 3, 310];
  const r = rng(1);
  const x = randomF32(rows * stride, r, 3);
  const w = randomF32(n, r);
  const y = createStorage(ctx, "y", rows * n * 4);
  await submit(ctx, (enc) =>
    rmsNorm(enc, { x: upload(ctx, x), w: upload(ctx, w), y }, {
      n,
      rows,
      eps: 1e-6,
      xOffset: 7,
      xStride: stride,
    }));
  const got = await readF32(ctx, y, rows * n);
  const want = new Float64Array(rows * n);
  for (let row = 0; row < rows; row++) {
    want.set(refRmsNorm(x.subarray(7 + row * stride, 7 + row * stride + n), w, 1e-6), row * n);
  }
  // f32 sum of squares and rsqrt (a few ulp) against float64: 1e-5 of each value's size.
  assertClose(got, want, Array.from(want, (v) => Math.abs(v) + 1e-3), 1e-5, "rms_norm");
});

gpuTest(
  "getRows() gathers exactly the dequantized rows, for every type, across table parts",
  async (ctx) => {
    const [cols, rows] = [512, 13];
    const ids = Uint32Array.from([12, 0, 5, 5, 3]);
    for (const type of MUL_MAT_TYPES) {
      const bytes = randomBlocks(type, cols * rows, 1, rng(2 + type));
      const table = await uploadWeights(ctx, { name: "embd", type, shape: [cols, rows] }, bytes, {
        maxPartBytes: 4 * rowBytes(type, cols),
      });
      const y = createStorage(ctx, "y", ids.length * cols * 4);
      await submit(
        ctx,
        (enc) => getRows(enc, { w: table, ids: upload(ctx, ids), y }, { tokens: ids.length }),
      );
      const got = await readF32(ctx, y, ids.length * cols);
      const all = dequantize(type, bytes, cols * rows);
      const want = new Float32Array(ids.length * cols);
      ids.forEach((id, t) => want.set(all.subarray(id * cols, id * cols + cols), t * cols));
      // A lookup is exact: dequantization has no rounding beyond llama.cpp's own.
      assertClose(got, want, 1, 0, `${typeName(type)} embedding rows`);
    }
  },
);

interface RopeCase {
  readonly name: string;
  readonly sections: readonly number[];
  readonly pos0: number;
}

const CASES: readonly RopeCase[] = [
  { name: "NEOX", sections: [], pos0: 5 },
  { name: "IMROPE", sections: [3, 3, 2, 0], pos0: 5 },
  // Sections summing to fewer than nRot/2 pairs send some pairs to the 4th (zero) stream.
  { name: "IMROPE, short sections", sections: [2, 2, 1, 0], pos0: 40 },
  { name: "NEOX at a large position", sections: [], pos0: 200000 },
];

function refRope(x: Float64Array, c: RopeCase, dh: number, nRot: number, pos: number) {
  const base = 1e7;
  return c.sections.length
    ? ropeImrope(x, {
      headDim: dh,
      nRot,
      base,
      positions: [pos, pos, pos, 0],
      sections: c.sections,
    })
    : ropeNeox(x, { headDim: dh, nRot, base, pos });
}

gpuTest("qkNormRope() matches RMSNorm then NEOX/IMROPE of every q head", async (ctx) => {
  const [T, H, dh, nRot] = [3, 4, 80, 16];
  // q heads interleaved with gate halves, as attn_q produces them: stride 2·dh per head.
  for (const c of CASES) {
    const r = rng(3);
    const x = randomF32(T * H * 2 * dh, r, 2);
    const w = randomF32(dh, r);
    const buf = upload(ctx, x);
    await submit(ctx, (enc) =>
      qkNormRope(enc, { x: buf, wq: upload(ctx, w) }, {
        tokens: T,
        dh,
        nRot,
        thetaScale: ropeThetaScale(1e7, nRot),
        sections: c.sections,
        eps: 1e-6,
        pos0: c.pos0,
        xStrideT: H * 2 * dh,
        q: { heads: H, strideH: 2 * dh },
      }));
    const got = await readF32(ctx, buf, x.length);
    const want = Float64Array.from(x);
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < H; h++) {
        const o = (t * H + h) * 2 * dh;
        const normed = refRmsNorm(x.subarray(o, o + dh), w, 1e-6);
        want.set(refRope(normed, c, dh, nRot, c.pos0 + t), o);
      }
    }
    // f32 norm plus GPU sin/cos after angle reduction: within 2e-5 of the row's scale (the
    // large-position case carries the f32 angle chain's own rounding, as ggml does).
    assertClose(got, want, 4, 2e-5, `q heads, ${c.name}`);
  }
});

gpuTest("qkNormRope() writes rotated k and raw v as f16 into the cache", async (ctx) => {
  const [T, H, dh, nRot, pos0, ctxLen] = [2, 2, 64, 16, 3, 8];
  const r = rng(4);
  // The k/v projection: per token [k (H·dh) | v (H·dh)].
  const kv = randomF32(T * 2 * H * dh, r, 2);
  const w = randomF32(dh, r);
  const kc = createStorage(ctx, "kc", ctxLen * H * dh * 2);
  const vc = createStorage(ctx, "vc", ctxLen * H * dh * 2);
  await submit(
    ctx,
    (enc) =>
      qkNormRope(enc, { x: upload(ctx, kv), wk: upload(ctx, w), kc, vc }, {
        tokens: T,
        dh,
        nRot,
        thetaScale: ropeThetaScale(1e7, nRot),
        sections: [],
        eps: 1e-6,
        pos0,
        xStrideT: 2 * H * dh,
        k: { heads: H, offset: 0, strideH: dh, vOffset: H * dh },
      }),
  );
  const words = T * H * dh / 2;
  const at = pos0 * H * dh / 2;
  const unpack = (u: Uint32Array) =>
    Float32Array.from(
      { length: 2 * u.length },
      (_, i) => f16ToF32((u[i >> 1] >>> (16 * (i & 1))) & 0xffff),
    );
  const gotK = unpack(await readU32(ctx, kc, words, at));
  const gotV = unpack(await readU32(ctx, vc, words, at));
  const wantK = new Float64Array(T * H * dh);
  const wantV = new Float64Array(T * H * dh);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const o = t * 2 * H * dh + h * dh;
      const normed = refRmsNorm(kv.subarray(o, o + dh), w, 1e-6);
      wantK.set(refRope(normed, CASES[0], dh, nRot, pos0 + t), (t * H + h) * dh);
      wantV.set(kv.subarray(o + H * dh, o + H * dh + dh), (t * H + h) * dh);
    }
  }
  // f16 storage: half an f16 ulp (2^-11 relative) plus the f32 error above.
  assertClose(gotK, wantK, Array.from(wantK, (v) => Math.abs(v) + 1e-2), 1e-3, "k cache");
  assertClose(gotV, wantV, Array.from(wantV, (v) => Math.abs(v) + 1e-2), 1e-3, "v cache");
});
