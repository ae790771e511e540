// GPU causal GQA attention with the sigmoid gate (engine/kernels/attention.ts) against
// engine/reference/attention.ts, over f16 caches longer than one 64-position tile.

import { createStorage } from "../engine/gpu/buffers.ts";
import { attention, prepareAttention } from "../engine/kernels/attention.ts";
import { f16ToF32, f32ToF16 } from "../engine/quant/f16.ts";
import { attention as refAttention } from "../engine/reference/attention.ts";
import { assertClose, gpuTest, randomF32, readF32, rng, submit, upload } from "./_gpu.ts";

/** Random f16 cache values: the packed u32 words and the exact f32 values they hold. */
function f16Cache(n: number, r: () => number): { words: Uint32Array; values: Float32Array } {
  const words = new Uint32Array(n / 2);
  const values = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const h = f32ToF16((2 * r() - 1) * 2);
    values[i] = f16ToF32(h);
    words[i >> 1] |= h << (16 * (i & 1));
  }
  return { words, values };
}

gpuTest(
  "attention() matches the reference for every query over tiles of positions",
  async (ctx) => {
    await prepareAttention(ctx);
    for (
      const [Hq, Hkv, dh, pos0, T] of [[4, 2, 64, 60, 7], [6, 3, 96, 0, 2], [2, 1, 32, 130, 1]]
    ) {
      const r = rng(pos0 + dh);
      const npos = pos0 + T;
      const kvRow = Hkv * dh;
      const k = f16Cache(npos * kvRow, r);
      const v = f16Cache(npos * kvRow, r);
      // Query rows as attn_q leaves them: per head [q (dh) | gate (dh)].
      const qg = randomF32(T * Hq * 2 * dh, r);
      const o = createStorage(ctx, "o", T * Hq * dh * 4);
      await submit(ctx, (enc) =>
        attention(enc, {
          q: upload(ctx, qg),
          kc: upload(ctx, k.words),
          vc: upload(ctx, v.words),
          o,
        }, {
          tokens: T,
          hq: Hq,
          hkv: Hkv,
          dh,
          pos0,
          qStrideT: Hq * 2 * dh,
          qStrideH: 2 * dh,
          gateOffset: dh,
          oStrideT: Hq * dh,
        }));
      const got = await readF32(ctx, o, T * Hq * dh);
      const want = new Float64Array(T * Hq * dh);
      for (let t = 0; t < T; t++) {
        const q = new Float32Array(Hq * dh);
        const gate = new Float32Array(Hq * dh);
        for (let h = 0; h < Hq; h++) {
          const at = (t * Hq + h) * 2 * dh;
          q.set(qg.subarray(at, at + dh), h * dh);
          gate.set(qg.subarray(at + dh, at + 2 * dh), h * dh);
        }
        want.set(
          refAttention({ q, gate, k: k.values, v: v.values }, {
            Hq,
            Hkv,
            Dh: dh,
            nPos: pos0 + t + 1,
          }),
          t * Hq * dh,
        );
      }
      // Outputs are convex combinations of V (|v| ≤ 2): f32 scores, exp and sums give ~1e-6.
      assertClose(got, want, 2, 1e-5, `attention Hq ${Hq} Hkv ${Hkv} dh ${dh} pos0 ${pos0}`);
    }
  },
);
