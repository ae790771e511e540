// GPU MoE routing and expert-output sum (engine/gpu/kernels/{moe_route,moe_sum}.ts) against
// engine/reference/ffn.ts moeRoute and the llama.cpp summation order.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import { moeRoute } from "../engine/gpu/kernels/moe_route.ts";
import { moeSum } from "../engine/gpu/kernels/moe_sum.ts";
import { moeRoute as refRoute } from "../engine/reference/ffn.ts";
import { sigmoid } from "../engine/reference/math.ts";
import { assertClose, gpuTest, randomF32, readF32, readU32, rng, submit, upload } from "./_gpu.ts";

gpuTest(
  "moeRoute() picks the reference's experts and weights, and the shared gate",
  async (ctx) => {
    for (const [E, k, T] of [[8, 2, 5], [100, 10, 3]]) {
      const stride = E + 1;
      const logits = randomF32(T * stride, rng(E), 3);
      // A tie in the top two of token 0: the lower id goes first.
      logits[1] = logits[6] = 9;
      const ids = createStorage(ctx, "ids", T * k * 4);
      const weights = createStorage(ctx, "weights", T * (k + 1) * 4);
      await submit(ctx, (enc) =>
        moeRoute(enc, { logits: upload(ctx, logits), ids, weights }, {
          experts: E,
          k,
          tokens: T,
          logitsStride: stride,
          sharedGate: true,
        }));
      const gotIds = await readU32(ctx, ids, T * k);
      const gotW = await readF32(ctx, weights, T * (k + 1));
      for (let t = 0; t < T; t++) {
        const ref = refRoute(logits.subarray(t * stride, t * stride + E), k);
        assert.deepEqual(
          [...gotIds.subarray(t * k, t * k + k)],
          [...ref.ids],
          `token ${t} experts`,
        );
        const want = [...ref.weights, sigmoid(logits[t * stride + E])];
        // Renormalised probabilities in f32 (exp, sum, divide): 1e-6 of 1.
        assertClose(
          gotW.subarray(t * (k + 1), (t + 1) * (k + 1)),
          want,
          1,
          1e-6,
          `token ${t} weights`,
        );
      }
      assert.deepEqual([...gotIds.subarray(0, 2)], [1, 6]);
    }
  },
);

gpuTest("moeSum() adds the weighted experts and the gated shared expert to x", async (ctx) => {
  const [D, k, T] = [70, 3, 2];
  const r = rng(5);
  const o = randomF32(T * k * D, r);
  const s = randomF32(T * D, r);
  const w = randomF32(T * (k + 1), r);
  const x0 = randomF32(T * D, r);
  const x = upload(ctx, x0);
  await submit(
    ctx,
    (enc) =>
      moeSum(enc, { o: upload(ctx, o), s: upload(ctx, s), weights: upload(ctx, w), x }, {
        d: D,
        k,
        tokens: T,
        sharedExpert: true,
      }),
  );
  const want = new Float64Array(T * D);
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < D; c++) {
      let acc = 0;
      for (let i = 0; i < k; i++) acc += o[(t * k + i) * D + c] * w[t * (k + 1) + i];
      want[t * D + c] = x0[t * D + c] + acc + s[t * D + c] * w[t * (k + 1) + k];
    }
  }
  // Five f32 products and sums of O(1) values.
  assertClose(await readF32(ctx, x, T * D), want, 4, 1e-6, "x + moe");
});
