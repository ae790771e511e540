// The CPU reference engine against llama.cpp's recorded greedy runs on every model fixture.
// End-to-end numeric check of engine/reference (GGUF → stage → logits); tests/_parity.ts compares.

import assert from "node:assert/strict";
import { readHParams } from "../engine/hparams.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { type ModelFixture, readFixture } from "../tools/fixtures/fixture_format.ts";
import {
  checkFixture,
  checkFreeRunning,
  modelFixtureNames,
  type StageChainFactory,
  TWIN_LABEL,
} from "./_parity.ts";

const openReference: StageChainFactory = async (model, ctx) => [
  await openReferenceStage(model, {
    first: 0,
    end: readHParams(model.metadata).nLayer,
    slots: 1,
    ctx,
  }),
];

const names = modelFixtureNames();

Deno.test("llama.cpp fixtures cover every arch, layout, F32 and quantized, and a split model", async () => {
  const specs = await Promise.all(
    names.map(async (n) => (await readFixture<ModelFixture>(n)).spec),
  );
  const has = (arch: string, quant: string, layout?: string) =>
    specs.some((s) => s.arch === arch && s.quant === quant && s.layout === layout);
  for (const quant of ["f32", "q4_k_m", "iq4_xs", "mixed"]) {
    assert.ok(has("qwen35moe", quant), `no qwen35moe ${quant} fixture`);
    assert.ok(has("qwen35", quant), `no qwen35 ${quant} fixture`);
    assert.ok(has("qwen3next", quant, "split"), `no qwen3next ${quant} split-layout fixture`);
    assert.ok(has("qwen3next", quant, "legacy"), `no qwen3next ${quant} legacy-layout fixture`);
  }
  assert.ok(specs.some((s) => (s.split ?? 1) > 1), "no split-file fixture");
});

for (const name of names) {
  Deno.test(`llama.cpp parity of the reference engine: ${name}`, async () => {
    const { fixture, report } = await checkFixture(name, openReference);
    console.log(`${name}: ${JSON.stringify(report)}`);
    // The id check skips near ties; the exact-math comparisons must still cover nearly all ids.
    const exact = report[fixture.spec.quant === "f32" ? "llama.cpp" : TWIN_LABEL];
    assert.ok(exact.idPositions > 10 * exact.nearTies, JSON.stringify(exact));
  });
}

for (const name of names.filter((n) => n.includes("-f32"))) {
  Deno.test(`free-running greedy output of the reference engine equals llama.cpp: ${name}`, () =>
    checkFreeRunning(name, openReference));
}
