// engine/greedy_loop.ts on the GPU engine: the fused path (several greedy steps per submission)
// gives the same ids as the per-token path, and a stop id inside a fused batch ends the output.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { generateGreedy } from "../engine/greedy_loop.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";

gpuTest("fused GPU decoding equals token-by-token decoding and honours stop ids", async (gpu) => {
  const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
  const stage = await openGpuStage(model, gpu, {
    first: 0,
    end: 4,
    slots: 1,
    ctx: 128,
    log: () => {},
  });
  try {
    const prompt = [5, 81, 302, 17, 44, 9];
    // topk > 0 forces one step per submission; topk 0 lets the stage chain 16 steps at a time.
    const perToken = await generateGreedy([stage], prompt, { n: 40, topk: 1 });
    const fused = await generateGreedy([stage], prompt, { n: 40 });
    assert.deepEqual(fused.ids, perToken.ids);
    const stopAt = 20; // inside the second fused batch (positions 17..32)
    const stopId = perToken.ids[stopAt];
    const stopped = await generateGreedy([stage], prompt, { n: 40, stopIds: new Set([stopId]) });
    const first = perToken.ids.indexOf(stopId);
    assert.deepEqual(stopped.ids, perToken.ids.slice(0, first + 1));
  } finally {
    stage.close();
    model.close();
  }
});
