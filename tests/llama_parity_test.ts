// The CPU reference engine against llama.cpp's recorded greedy runs on every model fixture.
// End-to-end numeric check of engine/reference (GGUF → stage → logits); tests/_parity.ts compares.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { readHParams } from "../engine/model/hparams.ts";
import { openReferenceStage } from "../engine/reference/stage.ts";
import type { PerPosition } from "../tools/fixtures/driver.ts";
import {
  FIXTURE_DIR,
  type ModelFixture,
  readFixture,
  RECORD_HINT,
  TOKENIZER_FIXTURE,
} from "../tools/fixtures/format.ts";
import { testModel } from "./_models.ts";
import {
  checkModelHash,
  checkParity,
  type ComparisonPlan,
  type PositionTolerance,
  type StageChainFactory,
} from "./_parity.ts";

/**
 * F32 weights: llama.cpp multiplies F32 weights by F32 activations, so what remains of exact math
 * is summation order and its F16 KV cache. Measured: up to 6e-4 (tools/fixtures/README.md).
 */
const F32_TOLERANCE = 1e-3;

/** Bound per position: F32_TOLERANCE plus the given per-position measurements. */
function bound(...terms: readonly PerPosition[]): PositionTolerance {
  const at = (key: keyof PerPosition, i: number) =>
    terms.reduce((sum, t) => sum + t[key][i], F32_TOLERANCE);
  return { prefill: (i) => at("prefill", i), gen: (j) => at("gen", j) };
}

/**
 * Each recorded llama.cpp run carries its own noise per position (`noise`: the same tokens as one
 * batch vs one token per call). It is ~1e-4 almost everywhere, but where the MoE router sits near
 * a tie a rounding difference picks another expert and the logits jump (0.3 seen); an engine can
 * land on either side of such a tie, so the bound at a position is F32_TOLERANCE + its noise.
 *
 * F32 models: one comparison with llama.cpp at that bound.
 *
 * Quantized models: our engine dequantizes exactly as llama.cpp does and keeps activations in
 * f64, while llama.cpp's CPU backend rounds activations to Q8_0/Q8_K/F16 before each dot product.
 * Each prompt therefore carries a second llama.cpp run over the same tokens, `twin`, on the F32
 * twin of the model (the same dequantized weights, F32 activations: exact math again), and
 * `quantDiff`, the measured top-8 difference between the two runs at every position.
 * 1. Against the twin, ours must hold F32_TOLERANCE + twin noise: this pins the whole forward
 *    pass on the quantized file to exact math.
 * 2. Against the quantized run, by the triangle inequality
 *      |ours − quant| ≤ |ours − twin| + |twin − quant| ≤ F32_TOLERANCE + twin noise + quantDiff
 *    per position. On these random-weight models quantDiff reaches 0.06–1.4 logits (a fixture's
 *    `quantNoise`), so this is the looser check, as llama.cpp's quantized numbers allow.
 * In every comparison our greedy id must equal llama.cpp's wherever its top-2 gap exceeds twice
 * the bound: beyond that no two in-bound logits can swap order.
 */
function plan(fixture: ModelFixture, name: string): ComparisonPlan {
  if (fixture.spec.quant === "f32") {
    return (
      record,
    ) => [{ label: "llama.cpp", run: record, tolerance: bound(record.noise) }];
  }
  return (record, p) => {
    const { twin, quantDiff } = record;
    if (twin === undefined || quantDiff === undefined) {
      throw new Error(
        `Cannot check "${name}": prompt ${p} has no twin run; ${RECORD_HINT}`,
      );
    }
    return [
      {
        label: "llama.cpp on the F32 twin",
        run: twin,
        tolerance: bound(twin.noise),
      },
      {
        label: "llama.cpp",
        run: record,
        tolerance: bound(twin.noise, quantDiff),
      },
    ];
  };
}

const openReference: StageChainFactory = async (model, ctx) => [
  await openReferenceStage(model, {
    first: 0,
    end: readHParams(model.metadata).nLayer,
    slots: 1,
    ctx,
  }),
];

const names = [...Deno.readDirSync(FIXTURE_DIR)]
  .map((e) => e.name)
  .filter((n) => n.endsWith(".json") && n !== TOKENIZER_FIXTURE)
  .sort();

Deno.test("llama.cpp fixtures cover every arch, layout, F32 and quantized, and a split model", async () => {
  const specs = await Promise.all(
    names.map(async (n) => (await readFixture<ModelFixture>(n)).spec),
  );
  const has = (arch: string, quant: string, layout?: string) =>
    specs.some((s) => s.arch === arch && s.quant === quant && s.layout === layout);
  for (const quant of ["f32", "q4_k_m", "iq4_xs", "mixed"]) {
    assert.ok(has("qwen35moe", quant), `no qwen35moe ${quant} fixture`);
    assert.ok(has("qwen35", quant), `no qwen35 ${quant} fixture`);
    assert.ok(
      has("qwen3next", quant, "split"),
      `no qwen3next ${quant} split-layout fixture`,
    );
    assert.ok(
      has("qwen3next", quant, "legacy"),
      `no qwen3next ${quant} legacy-layout fixture`,
    );
  }
  assert.ok(specs.some((s) => (s.split ?? 1) > 1), "no split-file fixture");
});

for (const name of names) {
  Deno.test(`llama.cpp parity of the reference engine: ${name}`, async () => {
    const fixture = await readFixture<ModelFixture>(name);
    const path = await testModel(fixture.spec);
    await checkModelHash(fixture, path, name);
    const model = await openGguf(path);
    try {
      const report = await checkParity(
        fixture,
        model,
        openReference,
        plan(fixture, name),
      );
      console.log(`${name}: ${JSON.stringify(report)}`);
      // The id check skips near ties; the F32 comparisons must still cover nearly every position.
      for (const [label, r] of Object.entries(report)) {
        if (label !== "llama.cpp" || fixture.spec.quant === "f32") {
          assert.ok(
            r.idPositions > 10 * r.nearTies,
            `${label}: ${JSON.stringify(r)}`,
          );
        }
      }
    } finally {
      model.close();
    }
  });
}
