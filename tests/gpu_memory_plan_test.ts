// engine/gpu/memory_plan.ts against what a GPU stage really holds (GpuStage.memory, from the one
// owner of its buffers): weights by kind, slot state, snapshots and activations, byte for byte;
// and the LM-head chunk both size the logits by; a stage the device cannot back refuses to open.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import { activationShape, GpuOutOfMemoryError, openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { planStage } from "../engine/gpu/memory_plan.ts";
import { readHParams } from "../engine/hparams.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel, type TestModelSpec } from "./_models.ts";

const MODELS: TestModelSpec[] = [
  { arch: "qwen35moe", quant: "q4_k_m" },
  { arch: "qwen3next", layout: "legacy", quant: "q8_0" },
  { arch: "qwen35", quant: "mixed" },
  { arch: "qwen35moe", quant: "q8_0", tied: true },
  // Drafting with its MTP block, which only the last stage runs (with token_embd to embed).
  { arch: "qwen35moe", quant: "q4_k_m", mtp: true },
];
const SPANS = [{ first: 0, end: 4 }, { first: 0, end: 3 }, { first: 3, end: 4 }];
const OPTIONS = { ctx: 96, slots: 2, snapshots: 1, maxBatch: 8, maxRewind: 3 };

gpuTest("the memory plan equals what each GPU stage allocates, by kind", async (gpu) => {
  for (const spec of MODELS) {
    const model = await openGguf(await testModel(spec));
    try {
      const hp = readHParams(model.metadata);
      for (const span of SPANS) {
        const tags = [spec.arch, spec.layout, spec.quant, spec.tied && "tied", spec.mtp && "mtp"];
        const what = `${tags.join(" ")} ` +
          `${span.first}:${span.end}`;
        const mtp = !!spec.mtp;
        const plan = planStage(model, hp, span, {
          ...OPTIONS,
          tensorCores: gpu.features.subgroupMatrix,
          maxBindingBytes: gpu.limits.maxStorageBufferBindingSize,
          mtp,
        });
        const stage = await openGpuStage(model, gpu, { ...span, ...OPTIONS, mtp, log: () => {} });
        try {
          const held = stage.memory;
          assert.deepEqual(plan.weights, held.weights, what);
          assert.equal(plan.slotState, held.slotState, what);
          assert.equal(plan.snapshots, held.snapshots, what);
          assert.equal(plan.activations, held.activations, what);
          const { kv, recurrent, trail } = plan.perSlot;
          const recurrentLayers = hp.isDeltaNet.slice(span.first, span.end).some((d) => d);
          assert.equal(trail > 0, recurrentLayers, `${what}: trails for the DeltaNet layers`);
          const drafts = mtp && span.end === hp.nLayer;
          assert.equal(plan.perSlot.mtp > 0, drafts, `${what}: the MTP block where it drafts`);
          assert.equal(!!stage.draft, drafts, `${what}: drafts where the plan says`);
          assert.equal(kv + recurrent + trail + plan.perSlot.mtp, plan.slotState / OPTIONS.slots);
          if (drafts) assert.ok(plan.weights.get("mtp")! > 0, `${what}: the block's weights`);
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

/**
 * The tests' device, except that every out-of-memory error scope reports that a buffer could not
 * be backed, as a device without the memory does (WebGPU raises it nowhere else).
 */
function withoutMemory(gpu: GpuContext): GpuContext {
  const filters: GPUErrorFilter[] = [];
  const device = new Proxy(gpu.device, {
    get(target, key) {
      if (key === "pushErrorScope") {
        return (filter: GPUErrorFilter) => {
          filters.push(filter);
          target.pushErrorScope(filter);
        };
      }
      if (key === "popErrorScope") {
        return async () => {
          const error = await target.popErrorScope();
          return filters.pop() === "out-of-memory"
            ? new GPUOutOfMemoryError("vkAllocateMemory failed with VK_ERROR_OUT_OF_DEVICE_MEMORY")
            : error;
        };
      }
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { ...gpu, device };
}

gpuTest(
  "a stage the device cannot back refuses to open and says what to lower; the device runs on",
  async (gpu) => {
    const model = await openGguf(await testModel(MODELS[0]));
    try {
      const span = { first: 0, end: 4 };
      await assert.rejects(
        openGpuStage(model, withoutMemory(gpu), { ...span, ...OPTIONS, log: () => {} }),
        (e: Error) => {
          assert.ok(e instanceof GpuOutOfMemoryError, `${e.name}: ${e.message}`);
          assert.match(
            e.message,
            /ran out of memory placing .* 2 slots \+ 1 snapshots of 96 positions/,
          );
          assert.match(
            e.message,
            /VK_ERROR_OUT_OF_DEVICE_MEMORY\): give fewer --slots, a shorter --ctx/,
          );
          return true;
        },
      );
      // The device's error scopes are balanced again: a stage that fits opens and runs on it.
      const stage = await openGpuStage(model, gpu, { ...span, ...OPTIONS, log: () => {} });
      try {
        const out = await stage.run(0, { kind: "ids", ids: Uint32Array.of(1, 2, 3) }, 3, 0);
        assert.equal(out.kind, "ids");
      } finally {
        stage.close();
      }
    } finally {
      model.close();
    }
  },
);
