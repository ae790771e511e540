// Models that carry the MTP ("nextn") block published qwen35/qwen35moe files hold after the main
// stack: both engines open the main stack alone and decode it as the same model without the block.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { readHParams } from "../engine/hparams.ts";
import { openLocalStage } from "../engine/open_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { completeOnce, type Completion, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";

const PROMPT = [5, 81, 302, 17, 44, 9, 120, 3];

/** 16 greedy tokens, with each token's 4 best candidates, from a stage of the whole model. */
async function decode(
  path: string,
  open: (model: Awaited<ReturnType<typeof openGguf>>) => Promise<Stage>,
): Promise<Completion> {
  const model = await openGguf(path);
  const local = await open(model);
  try {
    const tokenizer = TextTokenizer.fromGguf(model.metadata);
    return await completeOnce(
      { local, tokenizer },
      greedy(PROMPT, { maxTokens: 16, stopIds: new Set(), nProbs: 4 }),
    );
  } finally {
    local.close();
    model.close();
  }
}

gpuTest(
  "a model with an MTP block decodes as its twin without one, on both engines",
  async (gpu) => {
    const withMtp = await testModel({ arch: "qwen35moe", quant: "q4_k_m", mtp: true });
    const without = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
    const model = await openGguf(withMtp);
    assert.equal(model.metadata.get("qwen35moe.nextn_predict_layers"), 1);
    assert.ok(model.tensors.has("blk.4.nextn.eh_proj.weight"), "the MTP block is in the file");
    assert.equal(readHParams(model.metadata).nLayer, 4);
    model.close();
    const onGpu = (path: string) =>
      decode(
        path,
        (m) => openGpuStage(m, gpu, { first: 0, end: 4, slots: 1, ctx: 64, log: () => {} }),
      );
    const onReference = (path: string) =>
      decode(
        path,
        (m) => openLocalStage(m, { first: 0, slots: 1, ctx: 64, engine: { backend: "reference" } }),
      );
    for (const [engine, run] of [["GPU", onGpu], ["reference", onReference]] as const) {
      const [a, b] = [await run(withMtp), await run(without)];
      assert.equal(a.ids.length, 16, engine);
      assert.deepEqual(a.ids, b.ids, `${engine}: the same ids`);
      assert.deepEqual(a.probs, b.probs, `${engine}: the same candidates and probabilities`);
    }
  },
);
