// Gates of compiling kernels while a stage's weights load (engine/gpu/kernel.ts compileAhead,
// the describe-only loader pass of engine/gpu/gpu_weights.ts, openGpuStage's open path).
// Each test takes a device of its own, so its kernel cache starts empty.

import assert from "node:assert/strict";
import type { GpuContext } from "../engine/gpu/device.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { builtKernel, compileAhead, kernelFor } from "../engine/gpu/kernel.ts";
import { ARGMAX } from "../engine/gpu/kernels/argmax.ts";
import { MOE_SUM } from "../engine/gpu/kernels/moe_sum.ts";
import { readHParams } from "../engine/hparams.ts";
import { ignore, openTestGpu } from "./_gpu.ts";
import type { TestModelSpec } from "./_models.ts";
import { withModel } from "./_stage_gates.ts";

function freshGpuTest(name: string, fn: (gpu: GpuContext) => Promise<void>): void {
  Deno.test({
    name,
    ignore,
    fn: async () => {
      const gpu = await openTestGpu();
      assert.ok(gpu, "a second device opens where the first did");
      try {
        await fn(gpu);
      } finally {
        gpu.device.destroy();
      }
    },
  });
}

/** Opens and closes a whole-model stage of `spec`; its start-up log. */
async function openLog(gpu: GpuContext, spec: TestModelSpec, maxPartBytes?: number) {
  const lines: string[] = [];
  await withModel(spec, async (model) => {
    const stage = await openGpuStage(model, gpu, {
      first: 0,
      end: readHParams(model.metadata).nLayer,
      slots: 1,
      ctx: 32,
      maxBatch: 8,
      maxPartBytes,
      log: (line) => lines.push(line),
    });
    stage.close();
  });
  return lines;
}

const SPECS: readonly [TestModelSpec, number?][] = [
  [{ arch: "qwen35moe", quant: "q4_k_m" }, 96 * 1024],
  [{ arch: "qwen3next", quant: "iq4_xs", layout: "legacy" }],
  [{ arch: "qwen35", quant: "mixed" }],
];

for (const [spec, maxPartBytes] of SPECS) {
  freshGpuTest(
    `a ${spec.arch} ${spec.quant} stage compiles, from its weights' shapes alone, exactly the variants its steps use`,
    async (gpu) => {
      const lines = await openLog(gpu, spec, maxPartBytes);
      const line = lines.find((l) => l.startsWith("Kernels:"));
      assert.ok(line, `no Kernels line in ${lines.join(" | ")}`);
      // On an empty cache every variant the real recording uses was compiled ahead, and the plan
      // named no variant besides them (the stage compares the two sets by name).
      const [, used, ahead] = /^Kernels: (\d+) variants, (\d+) compiled while/.exec(line)!;
      assert.ok(Number(used) > 10, line);
      assert.equal(ahead, used, line);
      assert.doesNotMatch(line, /missing from the plan|planned but unused|synchronously/);
      // The describe pass logs nothing of its own: one weights report, one state report.
      assert.equal(lines.filter((l) => l.startsWith("GPU weights")).length, 1);
    },
  );
}

freshGpuTest("a kernel whose async compile fails fails the open, naming it", async (gpu) => {
  const device = gpu.device;
  const original = device.createComputePipelineAsync.bind(device);
  let failed: string | undefined;
  device.createComputePipelineAsync = (desc) => {
    if (failed !== undefined) return original(desc);
    failed = desc.label;
    return Promise.reject(new Error("the driver refused it"));
  };
  await assert.rejects(
    () => openLog(gpu, { arch: "qwen35moe" }),
    (e: Error) => {
      assert.ok(failed, "an async compile ran");
      assert.match(
        e.message,
        new RegExp(`^Cannot compile kernel ${failed} \\(\\w+\\.wgsl\\): the driver refused it$`),
      );
      return true;
    },
  );
});

freshGpuTest(
  "a variant still compiling at the deadline is built synchronously, once",
  async (gpu) => {
    const device = gpu.device;
    const original = device.createComputePipelineAsync.bind(device);
    let release: () => void = () => {};
    device.createComputePipelineAsync = (desc) => {
      if (desc.label !== "argmax") return original(desc);
      // A compile the provider never reports until the test lets it.
      const landed = original(desc);
      return new Promise((resolve) => release = () => resolve(landed));
    };
    const ahead = compileAhead(gpu, () => {
      const planned = kernelFor(gpu, ARGMAX, undefined);
      assert.throws(() => planned.pipeline, /Cannot encode kernel argmax: it is compiling ahead/);
      kernelFor(gpu, MOE_SUM, undefined);
    });
    assert.deepEqual([...ahead.names].sort(), ["argmax", "moe_sum"]);
    assert.equal(ahead.compiling, 2);
    assert.equal(await ahead.settle(50), 1);
    const built = builtKernel(gpu, "argmax");
    assert.ok(built.pipeline);
    release();
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(builtKernel(gpu, "argmax"), built, "the late async pipeline replaced nothing");
    assert.equal(kernelFor(gpu, ARGMAX, undefined), built);
    // A plan made now finds both built and starts nothing.
    assert.equal(compileAhead(gpu, () => kernelFor(gpu, MOE_SUM, undefined)).compiling, 0);
  },
);
