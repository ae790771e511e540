// The generator's predictable model (ModelSpec.predictable): greedy decoding continues every token
// with the next id and the MTP head drafts exactly those, on both engines, so drafted decoding
// keeps every draft: speculative decoding's best case, which the bench measures on it.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { planModel } from "../tools/synth/generate_model.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";
import { decodeDrafted, type DraftedRun } from "./_drafting.ts";

const model = await openGguf(
  await testModel({ arch: "qwen35moe", quant: "q8_0", mtp: true, predictable: true }),
);
const tokenizer = TextTokenizer.fromGguf(model.metadata);
const V = tokenizer.vocabSize;
const PROMPT = [300, 17, 512];
const OPEN = { first: 0, end: 4, slots: 1, ctx: 64, maxRewind: 4, mtp: true };
/** The ids after the prompt: each the one before plus one. */
const counting = (from: number, n: number) => Array.from({ length: n }, (_, i) => (from + i) % V);

/** 16 tokens drafted three at a time through the scheduler. */
function drafted(local: Stage): Promise<DraftedRun> {
  const request = greedy(PROMPT, { maxTokens: 16, stopIds: new Set() });
  return decodeDrafted({ local, tokenizer, draft: 3 }, request);
}

function checkAllKept(got: DraftedRun, what: string): void {
  assert.deepEqual(got.ids, counting(513, 16), `${what}: the model counts up from its last token`);
  assert.ok(got.verifies > 0, `${what}: drafts were verified`);
  assert.equal(got.accepted, got.drafted, `${what}: every draft kept`);
}

Deno.test("a predictable model counts up, and its MTP head drafts what it will say (reference)", async () => {
  const stage = await openReferenceStage(model, OPEN);
  try {
    await stage.run(0, { kind: "ids", ids: Uint32Array.from(PROMPT) }, PROMPT.length, 0);
    assert.deepEqual([...await stage.draft!(0, 513, 3)], counting(514, 3));
    checkAllKept(await drafted(stage), "reference");
  } finally {
    stage.close();
  }
  assert.throws(
    () => planModel({ preset: "tiny", arch: "qwen35moe", predictable: true, tied: true }),
    /tied head.*leave out --tied/,
  );
});

gpuTest("a predictable model's drafts are all kept on the GPU", async (gpu) => {
  const stage = await openGpuStage(model, gpu, { ...OPEN, log: () => {} });
  try {
    checkAllKept(await drafted(stage), "GPU");
  } finally {
    stage.close();
    model.close();
  }
});
