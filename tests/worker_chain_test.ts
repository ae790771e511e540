// 2-stage and 3-stage chains of real worker.ts processes (restricted permissions, loopback TCP),
// driven by the scheduler, give the ids and top-k of the single-process engine, for every arch.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { startWorker } from "./_workers.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { connectRemoteStage, type RemoteStage } from "../lib/wire/remote_stage.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel, type TestModelSpec } from "./_models.ts";

const CTX = 32;
const PROMPT = [3, 14, 15, 92, 65, 35];

/** Greedy through the scheduler, ignoring end-of-generation ids, with each token's top 5. */
const RUN = greedy(PROMPT, { maxTokens: 6, stopIds: new Set(), nProbs: 5 });

/** Ids, top-k logits and log-probabilities exactly: both sides return f32 logits. */
async function assertSameAsWhole(model: GgufModel, local: Stage, next: RemoteStage): Promise<void> {
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    const want = await completeOnce({ local: whole, tokenizer }, RUN);
    const got = await completeOnce({ local, next, tokenizer }, RUN);
    assert.equal(got.probs.length, 6);
    assert.deepEqual(got, want);
  } finally {
    whole.close();
  }
}

const MODELS: TestModelSpec[] = [
  { arch: "qwen35moe", quant: "q4_k_m" },
  { arch: "qwen3next", quant: "q4_k_m" },
  { arch: "qwen3next", layout: "legacy", quant: "q8_0" },
  { arch: "qwen35", quant: "q4_k_m" },
];

for (const spec of MODELS) {
  const name = [spec.arch, spec.layout, spec.quant].filter(Boolean).join(" ");
  Deno.test(`worker chains of 2 and 3 stages equal the whole model: ${name}`, async () => {
    const path = await testModel(spec);
    const model = await openGguf(path);
    // The last worker first serves the head directly (2 stages), then the middle worker (3).
    const last = await startWorker({ model: path, layers: "3:4", ctx: CTX, maxBatch: 4 });
    try {
      const head3 = await openReferenceStage(model, { first: 0, end: 3, slots: 1, ctx: CTX });
      const remote3 = await connectRemoteStage(last.address, { local: head3, model });
      await assertSameAsWhole(model, head3, remote3);
      remote3.close();
      head3.close();

      const middle = await startWorker({
        model: path,
        layers: "1:3",
        ctx: CTX,
        maxBatch: 4,
        next: last.address,
      });
      try {
        const head1 = await openReferenceStage(model, { first: 0, end: 1, slots: 1, ctx: CTX });
        const remote1 = await connectRemoteStage(middle.address, { local: head1, model });
        await assertSameAsWhole(model, head1, remote1);
        remote1.close();
        head1.close();
      } finally {
        await middle.stop();
      }
    } finally {
      await last.stop();
      model.close();
    }
  });
}

gpuTest(
  "a GPU worker under net and read permissions only extends a GPU head bit for bit",
  async (gpu) => {
    const path = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
    const model = await openGguf(path);
    const open = (first: number, end: number) =>
      openGpuStage(model, gpu, { first, end, slots: 1, ctx: CTX, log: () => {} });
    const worker = await startWorker({ model: path, layers: "2:4", ctx: CTX, backend: "gpu" });
    const whole = await open(0, 4);
    const head = await open(0, 2);
    try {
      const remote = await connectRemoteStage(worker.address, { local: head, model });
      const tokenizer = TextTokenizer.fromGguf(model.metadata);
      const want = await completeOnce({ local: whole, tokenizer }, RUN);
      const got = await completeOnce({ local: head, next: remote, tokenizer }, RUN);
      assert.equal(got.probs.length, 6);
      assert.deepEqual(got, want);
      remote.close();
    } finally {
      head.close();
      whole.close();
      await worker.stop();
      model.close();
    }
  },
);
