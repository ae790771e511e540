// bench/split_probe.ts on a tiny model and the CPU reference: the three rows, each stage's share
// timed within its step, and every stage and the worker closed afterwards (the process would hang
// otherwise).

import assert from "node:assert/strict";
import { probeSplit } from "../bench/split_probe.ts";
import { testModel } from "./_models.ts";

/** The probe's flags for `rows` of the tiny model on the CPU reference, stages split at layer 1. */
async function referenceFlags(rows: Parameters<typeof probeSplit>[0]["rows"]) {
  return {
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference" as const,
    gpu: "builtin" as const,
    "allow-software-gpu": false,
    split: 1,
    steps: 3,
    rows,
    unpaced: false,
    "trace-polls": 0,
  };
}

Deno.test("probeSplit: unsplit, split in process and split over a worker, with each stage's share", async () => {
  const rows = await probeSplit(await referenceFlags(["whole", "local", "worker"]));
  assert.deepEqual(rows.map((r) => r.what), [
    "layers 0:4 in one stage",
    "0:1 + 1:4, both in this process",
    "0:1 + 1:4 in a worker over loopback",
  ]);
  assert.deepEqual(rows.map((r) => r.stageMs.length), [1, 2, 2]);
  // The reference engine reports no GPU profile.
  assert.deepEqual(rows.flatMap((r) => r.profiles), [
    undefined,
    undefined,
    undefined,
    undefined,
    undefined,
  ]);
  for (const row of rows) {
    assert.ok(row.stepMs > 0);
    // A step is its stages one after the other: each stage's run is within its step, so a stage's
    // median is at most the step's (medians of three runs need not add up on a busy machine).
    for (const ms of row.stageMs) {
      assert.ok(ms > 0 && ms <= row.stepMs, `${ms} vs ${row.stepMs}`);
    }
  }
});

Deno.test("probeSplit: refuses two stages on one device without a GPU", async () => {
  await assert.rejects(
    probeSplit(await referenceFlags(["device"])),
    /Cannot put two stages on one device with the reference backend/,
  );
});
