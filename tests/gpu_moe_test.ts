// GPU MoE routing, prefill gather table and expert-output sum (engine/gpu/kernels/{moe_route,
// moe_gather,moe_sum}.ts) against engine/reference/ffn.ts moeRoute, a serial counting sort and the
// llama.cpp summation order.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import {
  gatherTableWords,
  gatherTiles,
  gatherWords,
  moeGather,
} from "../engine/gpu/kernels/moe_gather.ts";
import { moeRoute } from "../engine/gpu/kernels/moe_route.ts";
import { moeSum } from "../engine/gpu/kernels/moe_sum.ts";
import { moeRoute as refRoute } from "../engine/reference/ffn.ts";
import { sigmoid } from "../engine/reference/math.ts";
import { assertClose, gpuTest, randomF32, readF32, readU32, rng, submit, upload } from "./_gpu.ts";

gpuTest(
  "moeRoute() picks the reference's experts and weights, and the shared gate",
  async (ctx) => {
    for (const [E, k, T] of [[8, 2, 5], [100, 10, 3], [600, 8, 2]]) {
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

/** The gather table of moe_gather.wgsl's contract, built by one pass over the slots. */
function serialGather(ids: Uint32Array, experts: number, tt: number): Uint32Array {
  const maxTiles = gatherTiles(ids.length, experts, tt);
  const table = new Uint32Array(gatherTableWords(ids.length, experts, tt));
  const counts = new Array<number>(experts).fill(0);
  for (const e of ids) counts[e]++;
  const cursor: number[] = [];
  let first = 0;
  let tiles = 0;
  for (let e = 0; e < experts; e++) {
    cursor.push(first);
    for (let f = 0; f < counts[e]; f += tt) {
      table[1 + tiles++] = e | (Math.min(tt, counts[e] - f) << 10) | ((first + f) << 16);
    }
    first += counts[e];
  }
  table[0] = tiles;
  ids.forEach((e, s) => table[1 + maxTiles + cursor[e]++] = s);
  return table;
}

gpuTest(
  "moeGather() builds the serial counting sort's table, tiles and slot order",
  async (ctx) => {
    // Slots over several blocks of the kernel's 256 slots, the last one partial; 5 or 8 distinct
    // experts a token, skewed towards low ids so some experts take several tiles and some none;
    // 1000 experts: every thread's share of the scan. The buffer is sized for more slots than
    // the run has, as the engine's is for its longest run.
    const r = rng(77);
    for (const [T, k, E, tt] of [[130, 5, 40, 32], [301, 8, 1000, 16], [3, 2, 4, 63]]) {
      const ids = new Uint32Array(T * k);
      for (let t = 0; t < T; t++) {
        const chosen = new Set<number>();
        while (chosen.size < k) chosen.add(Math.floor(E * r() ** 2));
        ids.set([...chosen], t * k);
      }
      const want = serialGather(ids, E, tt);
      const table = createStorage(ctx, "table", 4 * gatherWords(2 * T * k, E, tt));
      await submit(
        ctx,
        (enc) => moeGather(enc, { ids: upload(ctx, ids), table }, { slots: T * k, experts: E, tt }),
      );
      const got = await readU32(ctx, table, want.length);
      assert.deepEqual([...got], [...want], `T=${T} k=${k} E=${E} tt=${tt}`);
    }
  },
);
