// The WebGPU engine against llama.cpp's recorded greedy runs on every model fixture: the same
// checks and bounds as the CPU reference (tests/_parity.ts), through the GPU stage.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { readHParams } from "../engine/hparams.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import { gpuTest } from "./_gpu.ts";
import {
  checkFixture,
  checkFreeRunning,
  F32_TOLERANCE,
  modelFixtureNames,
  type StageChainFactory,
  TWIN_LABEL,
} from "./_parity.ts";

function openWholeModel(gpu: GpuContext): StageChainFactory {
  return async (model, ctx) => [
    await openGpuStage(model, gpu, {
      first: 0,
      end: readHParams(model.metadata).nLayer,
      slots: 1,
      ctx,
      log: () => {},
    }),
  ];
}

for (const name of modelFixtureNames().filter((n) => n.includes("-f32"))) {
  gpuTest(
    `free-running greedy output of the GPU engine equals llama.cpp: ${name}`,
    (gpu) => checkFreeRunning(name, openWholeModel(gpu)),
  );
}

for (const name of modelFixtureNames()) {
  gpuTest(`llama.cpp parity of the GPU engine: ${name}`, async (gpu) => {
    // Prompt rows on tensor cores (or emulated: TANDEM_MMA=emulate) keep f32's accuracy: the
    // same bound as the f32 kernels.
    const { fixture, report } = await checkFixture(name, openWholeModel(gpu), F32_TOLERANCE);
    console.log(`${name}: ${JSON.stringify(report)}`);
    const exact = report[fixture.spec.quant === "f32" ? "llama.cpp" : TWIN_LABEL];
    assert.ok(exact.idPositions > 10 * exact.nearTies, JSON.stringify(exact));
  });
}
