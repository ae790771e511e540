// The bench's workloads that need a worker or a GPU (bench/measure.ts, split.ts): the split decodes
// one stage's tokens, fused decoding the stepwise ones, sampled slots sharing steps their own.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { readHParams } from "../engine/hparams.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import {
  BENCH_SAMPLING,
  seededIds,
  timeConcurrentDecode,
  timeDecode,
  timeFusedDecode,
  timeSampledDecode,
} from "../bench/measure.ts";
import { startWorker } from "../bench/split.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel, type TestModelSpec } from "./_models.ts";
import { withModel } from "./_stage_gates.ts";

const CTX = 48;
const TINY: TestModelSpec = { arch: "qwen35moe" };

/** A reference-backend worker of layers [2, end) of `path`, quiet, two slots. */
function startReferenceWorker(path: string, end: number) {
  return startWorker({
    model: path,
    first: 2,
    end,
    backend: "reference",
    gpu: "builtin",
    slots: 2,
    ctx: CTX,
    startTimeoutS: 60,
    log: () => {},
  });
}

Deno.test("split: layers 0:2 here and 2:4 in a worker decode the tokens of one stage, one slot or two at once", async () => {
  const path = await testModel(TINY);
  await withModel(TINY, async (model) => {
    const firsts = Array.from(seededIds(2, readHParams(model.metadata).V, 11));
    const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
    const alone = [];
    for (const first of firsts) alone.push((await timeDecode([whole], first, 5)).fed);
    whole.close();
    const worker = await startReferenceWorker(path, 4);
    const local = await openReferenceStage(model, { first: 0, end: 2, slots: 2, ctx: CTX });
    try {
      const remote = await connectRemoteStage(worker.address, { local, model });
      try {
        assert.deepEqual((await timeDecode([local, remote], firsts[0], 5)).fed, alone[0]);
        assert.deepEqual((await timeConcurrentDecode([local, remote], firsts, 5)).fed, alone);
      } finally {
        remote.close();
      }
    } finally {
      local.close();
      await worker.stop();
    }
  });
});

Deno.test("startWorker reports the worker's own error when it cannot start", async () => {
  await assert.rejects(
    async () => startReferenceWorker(await testModel(TINY), 9),
    /exited with code 1.*\n.*the model has 4 layers/s,
  );
});

gpuTest(
  "timeFusedDecode feeds the tokens of timeDecode and timeSampledDecode, several steps a readback",
  async (gpu) => {
    await withModel(TINY, async (model) => {
      const stage = await openGpuStage(model, gpu, { first: 0, end: 4, slots: 1, ctx: CTX });
      const reference = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
      try {
        const first = seededIds(1, readHParams(model.metadata).V, 5)[0];
        const stepwise = await timeDecode([stage], first, 11);
        // 11 tokens in steps of 4: whole bursts and a short last one.
        const fused = await timeFusedDecode(stage, first, 11, 4);
        assert.ok(fused.seconds > 0);
        assert.deepEqual(fused.fed, stepwise.fed);
        // Sampled on the device: the draws the head makes from each step's candidates.
        const sampled = await timeSampledDecode([stage], first, 11, BENCH_SAMPLING, 9);
        const draws = { sampling: BENCH_SAMPLING, seed: 9 };
        assert.deepEqual((await timeFusedDecode(stage, first, 11, 4, 0, draws)).fed, sampled.fed);
        assert.notDeepEqual(sampled.fed, stepwise.fed, "the draws left the greedy path");
        await assert.rejects(timeFusedDecode(reference, first, 4, 2), TypeError);
      } finally {
        stage.close();
        reference.close();
      }
    });
  },
);

gpuTest(
  "timeConcurrentDecode: sampled slots sharing the GPU's steps draw what each draws alone",
  async (gpu) => {
    await withModel(TINY, async (model) => {
      // Four slots: the builtin provider shares steps from three active slots on.
      const stage = await openGpuStage(model, gpu, { first: 0, end: 4, slots: 4, ctx: CTX });
      try {
        const firsts = Array.from(seededIds(4, readHParams(model.metadata).V, 21));
        const together = await timeConcurrentDecode([stage], firsts, 6, BENCH_SAMPLING, 3);
        for (const [slot, first] of firsts.entries()) {
          const alone = await timeSampledDecode([stage], first, 6, BENCH_SAMPLING, 3 + slot);
          assert.deepEqual(together.fed[slot], alone.fed, `slot ${slot}`);
        }
      } finally {
        stage.close();
      }
    });
  },
);
