// engine/gpu/memory_plan.ts against what a GPU stage really holds (GpuStage.memory, from the one
// owner of its buffers): weights by kind, slot state, snapshots and activations, byte for byte;
// and the LM-head chunk both size the logits by.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { activationShape, openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { planStage } from "../engine/gpu/memory_plan.ts";
import { readHParams } from "../engine/hparams.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel, type TestModelSpec } from "./_models.ts";

const MODELS: TestModelSpec[] = [
  { arch: "qwen35moe", quant: "q4_k_m" },
  { arch: "qwen3next", layout: "legacy", quant: "q8_0" },
  { arch: "qwen35", quant: "mixed" },
  { arch: "qwen35moe", quant: "q8_0", tied: true },
];
const SPANS = [{ first: 0, end: 4 }, { first: 0, end: 3 }, { first: 3, end: 4 }];
const OPTIONS = { ctx: 96, slots: 2, snapshots: 1, maxBatch: 8 };

gpuTest("the memory plan equals what each GPU stage allocates, by kind", async (gpu) => {
  for (const spec of MODELS) {
    const model = await openGguf(await testModel(spec));
    try {
      const hp = readHParams(model.metadata);
      for (const span of SPANS) {
        const what = `${[spec.arch, spec.layout, spec.quant, spec.tied && "tied"].join(" ")} ` +
          `${span.first}:${span.end}`;
        const plan = planStage(model, hp, span, {
          ...OPTIONS,
          tensorCores: gpu.features.subgroupMatrix,
        });
        const stage = await openGpuStage(model, gpu, { ...span, ...OPTIONS, log: () => {} });
        try {
          const held = stage.memory;
          assert.deepEqual(plan.weights, held.weights, what);
          assert.equal(plan.slotState, held.slotState, what);
          assert.equal(plan.snapshots, held.snapshots, what);
          assert.equal(plan.activations, held.activations, what);
          assert.equal(plan.perSlot.kv + plan.perSlot.recurrent, plan.slotState / OPTIONS.slots);
          // Beyond the plan: only readbacks, the params arena and timers.
          const rest = held.total - plan.total;
          assert.ok(rest >= 0 && rest < 2 * 1024 * 1024, `${what}: ${rest} bytes unplanned`);
        } finally {
          stage.close();
        }
      }
    } finally {
      model.close();
    }
  }
});

Deno.test("LM-head chunks are whole 64-position tiles where the logits budget splits a run", async () => {
  const model = await openGguf(await testModel(MODELS[0]));
  try {
    const hp = readHParams(model.metadata);
    const span = { first: 0, end: hp.nLayer };
    // A 248 320-token vocabulary: 67 positions fit the 64 MiB of logits; 64 are taken.
    assert.equal(activationShape({ ...hp, V: 248320 }, span, 96, 512).lmChunk, 64);
    // Below a tile, or when the whole run fits, the budget's own figure.
    assert.equal(activationShape({ ...hp, V: 400000 }, span, 96, 512).lmChunk, 41);
    assert.equal(activationShape(hp, span, 96, 100).lmChunk, 100);
  } finally {
    model.close();
  }
});
