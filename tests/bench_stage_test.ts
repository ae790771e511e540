// One engine's bench figures (bench/stage_bench.ts) on a tiny model and the CPU reference: every
// figure asked for timed (none short of context or slots), or skipped past the deadline.

import assert from "node:assert/strict";
import { benchStage } from "../bench/stage_bench.ts";
import { testModel } from "./_models.ts";

Deno.test("benchStage: pp, tg, verified drafts, sampled tg on many slots, tg after a prefix and the split, each timed", async () => {
  const report = await benchStage({
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference",
    gpu: "builtin",
    pp: [16, 40],
    tg: 4,
    slots: 2,
    concurrency: [3, 5],
    at: 40,
    drafts: [1, 3],
    split: 2,
    runs: 1,
    seed: 1,
    deadlineS: 120,
  });
  assert.equal(report.error, undefined);
  const tokens = Object.fromEntries(
    Object.entries(report.figures).map(([name, f]) => {
      assert.equal(f.timing?.seconds.length, 1, `${name}: ${f.error}`);
      return [name, f.tokens];
    }),
  );
  assert.deepEqual(tokens, {
    pp16: 16,
    pp40: 40,
    tg4: 4,
    "tg4-verify1-kept": 4,
    "tg4-verify1-refused": 4,
    "tg4-verify3-kept": 4,
    "tg4-verify3-refused": 4,
    "tg4-sampled": 4,
    tg4x2: 8,
    "tg4@40": 4,
    "tg4x3-sampled": 12,
    "tg4x5-sampled": 20,
  });
  assert.ok(report.manySlotsOpenSeconds! >= 0);
  assert.equal(report.split?.layers, "0:2 + 2:4");
  assert.ok(report.split?.decode.timing && report.split.concurrent?.timing);
});

Deno.test("benchStage past its deadline skips every figure and opens no further stage or worker", async () => {
  const report = await benchStage({
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference",
    gpu: "builtin",
    pp: [16],
    tg: 4,
    slots: 1,
    concurrency: [3],
    at: 20,
    drafts: [2],
    split: 2,
    runs: 1,
    seed: 1,
    deadlineS: 0,
  });
  for (const [name, f] of Object.entries(report.figures)) {
    assert.match(f.error ?? "", /^skipped: /, name);
  }
  assert.equal(report.figures["tg4x3-sampled"].error, "skipped: no time left to open 3 slots");
  assert.equal(report.manySlotsOpenSeconds, undefined);
  assert.deepEqual(report.split, {
    layers: "0:2 + 2:4",
    decode: { tokens: 4, error: "skipped: no time left to start the worker" },
  });
});

Deno.test("benchStage on a file with an MTP block: tgN-mtpK figures carry the drafts they made and kept", async () => {
  const options = {
    model: await testModel({ arch: "qwen35moe", quant: "q4_k_m", mtp: true }),
    backend: "reference" as const,
    gpu: "builtin" as const,
    pp: [16],
    tg: 4,
    slots: 1,
    concurrency: [],
    at: 0,
    drafts: [2],
    runs: 1,
    seed: 1,
  };
  const report = await benchStage({ ...options, deadlineS: 120 });
  const drafted = ["tg4-mtp2", "tg4-mtp2-sampled"].map((name) => {
    const f = report.figures[name];
    assert.equal(f.timing?.seconds.length, 1, `${name}: ${f.error}`);
    assert.deepEqual(Object.keys(f.drafts ?? {}).sort(), ["drafted", "kept"], name);
    assert.ok(f.drafts!.kept <= f.drafts!.drafted && f.drafts!.drafted > 0, name);
    return f.drafts!.drafted;
  });
  assert.equal(drafted.length, 2);
  assert.deepEqual(report.figures["tg4-mtp0"].drafts, { drafted: 0, kept: 0 });
  // Past the deadline nothing is measured, and no figure claims drafts.
  const late = await benchStage({ ...options, deadlineS: 0 });
  for (const [name, f] of Object.entries(late.figures)) {
    assert.match(f.error ?? "", /^skipped: /, name);
    assert.equal(f.drafts, undefined, name);
  }
});
