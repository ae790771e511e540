// The scheduler's greedy decoding on the GPU engine: the fused path (several greedy steps per
// readback) gives the same ids as one step per readback, and a stop id inside a fused batch ends
// the output there.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { FUSED_STEPS } from "../lib/scheduler/scheduler.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";

gpuTest("fused GPU decoding equals token-by-token decoding and honours stop ids", async (gpu) => {
  const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const local = await openGpuStage(model, gpu, {
    first: 0,
    end: 4,
    slots: 1,
    ctx: 128,
    log: () => {},
  });
  try {
    const prompt = [5, 81, 302, 17, 44, 9];
    const none = new Set<number>();
    // Per-token probabilities need each step's top-k: one step per readback. Without them the
    // stage chains FUSED_STEPS greedy steps per readback.
    const perToken = await completeOnce(
      { local, tokenizer },
      greedy(prompt, { maxTokens: 40, stopIds: none, nProbs: 1 }),
    );
    const fused = await completeOnce(
      { local, tokenizer },
      greedy(prompt, { maxTokens: 40, stopIds: none }),
    );
    assert.equal(perToken.ids.length, 40);
    assert.deepEqual(fused.ids, perToken.ids);
    // Inside the third fused batch: the prefill gives token 0, batches give 1..8, 9..16, 17..24.
    const stopAt = 20;
    assert.ok(stopAt > 2 * FUSED_STEPS && stopAt % FUSED_STEPS !== 0);
    const stopId = perToken.ids[stopAt];
    const stopped = await completeOnce(
      { local, tokenizer },
      greedy(prompt, { maxTokens: 40, stopIds: new Set([stopId]) }),
    );
    const first = perToken.ids.indexOf(stopId);
    assert.deepEqual(stopped.ids, perToken.ids.slice(0, first + 1));
    assert.equal(stopped.reason, "end_turn");
  } finally {
    local.close();
    model.close();
  }
});
