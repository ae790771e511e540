// GPU greedy ids and top-k (engine/gpu/kernels/{argmax,topk}.ts) against engine/reference/logits.ts,
// including ties, which must break toward the lower id exactly as the reference does.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import { argmax } from "../engine/gpu/kernels/argmax.ts";
import { topK, topKScratchWords } from "../engine/gpu/kernels/topk.ts";
import { argmaxTopK } from "../engine/reference/logits.ts";
import { gpuTest, randomF32, readU32, rng, submit, upload } from "./_gpu.ts";

gpuTest("argmax() and topK() equal the reference, ties to the lower id", async (ctx) => {
  for (const [V, rows, k] of [[1000, 3, 5], [257, 2, 40], [5000, 1, 1]]) {
    const r = rng(V);
    const logits = randomF32(V * rows, r, 4);
    // Ties: equal maxima in row 0, and a run of equal values straddling top-k groups.
    logits[10] = logits[900 % V] = 50;
    for (let i = 0; i < 6; i++) logits[(i * 97) % V] = 20;
    const src = upload(ctx, logits);
    const ids = createStorage(ctx, "ids", rows * 4);
    const scratch = createStorage(ctx, "scratch", topKScratchWords(k) * 4);
    const top = createStorage(ctx, "top", 2 * k * 4);
    const last = (rows - 1) * V;
    await submit(ctx, (enc) => {
      argmax(enc, { src, out: ids }, { n: V, rows });
      topK(enc, { src, scratch, out: top }, { n: V, k, offset: last });
    });
    const gotIds = await readU32(ctx, ids, rows);
    for (let row = 0; row < rows; row++) {
      const ref = argmaxTopK(logits.subarray(row * V, row * V + V), 0);
      assert.equal(gotIds[row], ref.argmax, `V ${V} row ${row} argmax`);
    }
    const pairs = await readU32(ctx, top, 2 * k);
    const got = Array.from({ length: k }, (_, i) => ({
      id: pairs[2 * i + 1],
      logit: new Float32Array(new Uint32Array([pairs[2 * i]]).buffer)[0],
    }));
    const ref = argmaxTopK(logits.subarray(last, last + V), k).top;
    assert.deepEqual(got, ref, `V ${V} top ${k}`);
  }
});
