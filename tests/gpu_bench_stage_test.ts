// The engine bench's figures on the GPU engine (bench/stage_bench.ts): the many-sequence figure
// fused on the device times Stage.decodeFusedMany and checks its tokens against the per-step draws.

import assert from "node:assert/strict";
import { benchStage } from "../bench/stage_bench.ts";
import type { ProviderName } from "../engine/gpu/provider.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";

gpuTest(
  "benchStage on the GPU: sequences sampled at once, per step and fused on the device, draw the same tokens",
  async () => {
    const report = await benchStage({
      model: await testModel({ arch: "qwen35moe" }),
      backend: "gpu",
      gpu: (Deno.env.get("TANDEM_GPU") ?? "builtin") as ProviderName,
      pp: [],
      tg: 12,
      slots: 1,
      concurrency: [3],
      at: 0,
      drafts: [],
      runs: 1,
      seed: 1,
      deadlineS: 300,
    });
    assert.equal(report.error, undefined);
    for (const name of ["tg12x3-sampled", "tg12x3-sampled-fused"]) {
      const figure = report.figures[name];
      assert.equal(figure?.error, undefined, `${name}: ${figure?.error}`);
      assert.equal(figure.tokens, 36);
      assert.equal(figure.timing?.seconds.length, 1);
    }
  },
);
