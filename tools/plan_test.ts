// Tests of `deno task plan` (plan.ts) as its flags are read: one block per stage and the total,
// snapshots defaulting as the head's and the worker's do. tests/gpu_memory_plan_test.ts holds the
// numbers themselves equal to what a GPU stage allocates.

import assert from "node:assert/strict";
import { readFlags } from "../lib/cli.ts";
import { defaultSnapshots } from "../lib/scheduler/prefix_cache.ts";
import { testModel } from "../tests/_models.ts";
import { PLAN, planReport } from "./plan.ts";

const model = await testModel({ arch: "qwen35moe" });

/** The report for these command-line arguments, read as the task reads them. */
function report(args: string[]): Promise<string[]> {
  return planReport(readFlags(PLAN, ["--model", model, ...args], () => undefined)!);
}

Deno.test("plan: one block per stage, then all stages; snapshots default as the stages' do", async () => {
  for (const [ctx, slots] of [[4096, 1], [40000, 2]]) {
    const common = ["--stages", "0:2,2:4", "--ctx", `${ctx}`, "--slots", `${slots}`];
    const lines = await report(common);
    assert.deepEqual(
      lines.filter((l) => /^\S/.test(l)).map((l) => l.split(/\s{2,}/)[0]),
      ["stage 0:2", "stage 2:4", "all stages"],
    );
    const places = (ls: string[]) =>
      ls.filter((l) => l.startsWith("  snapshots")).map((l) => Number(/(\d+) ×/.exec(l)![1]));
    const expected = defaultSnapshots(ctx, slots);
    assert.ok(expected > 0);
    assert.deepEqual(places(lines), [expected, expected]);
    const none = await report([...common, "--snapshots", "0"]);
    assert.deepEqual(places(none), [0, 0]);
    // The worker's snapshots hold KV: planning none must come out smaller.
    assert.notEqual(none.at(-1), lines.at(-1));
  }
  await assert.rejects(
    report(["--stages", "0:2,3:4", "--ctx", "64", "--slots", "1"]),
    /contiguous/,
  );
});

Deno.test("plan --rewind: each slot's line adds its rewind trail, and the total grows", async () => {
  const common = ["--stages", "0:4", "--ctx", "256", "--slots", "2", "--snapshots", "0"];
  const plain = await report(common);
  const kept = await report([...common, "--rewind", "4"]);
  const slot = (ls: string[]) => ls.find((l) => l.startsWith("  per slot"))!;
  assert.doesNotMatch(slot(plain), /rewind trail/);
  assert.match(slot(kept), /rewind trail [\d.]+ MiB\) × 2 slots/);
  // The slot's size is its state and its trail together, which the slots' total multiplies.
  const mib = (l: string) => Number(/per slot\s+([\d.]+) MiB/.exec(l)![1]);
  assert.ok(mib(slot(kept)) > mib(slot(plain)));
  assert.notEqual(kept.at(-1), plain.at(-1));
});
