// The llama.cpp peer's load (bench/peers/load.ts) without node-llama-cpp: that every step reaches
// a node-llama-cpp-like batcher as one batch, what each sequence is fed, and the figure's numbers.

import assert from "node:assert/strict";
import {
  type Evaluate,
  loadFigure,
  type LoadRun,
  nearestRank,
  runLoad,
} from "../bench/peers/load.ts";

/**
 * Batches as node-llama-cpp's context does: the first evaluation queued schedules a decode on the
 * next event-loop turn, which takes every evaluation queued by then. A decode of prompts takes
 * 50 ms of the fake clock, one of single tokens 10 ms; each sequence's token is 1000 × its index
 * + its step.
 */
function fakeContext() {
  let clock = 0;
  const batches: { sequence: number; ids: readonly number[]; step: number }[][] = [];
  let queued: { sequence: number; ids: readonly number[]; step: number; done: () => void }[] = [];
  const evaluate: Evaluate = (sequence, ids, step) =>
    new Promise((resolve) => {
      if (queued.length === 0) {
        setTimeout(() => {
          const batch = queued;
          queued = [];
          batches.push(batch.map(({ sequence, ids, step }) => ({ sequence, ids, step })));
          clock += batch.some((e) => e.ids.length > 1) ? 50 : 10;
          // Sampled tokens resolve in any order; the last sequence's first here.
          for (const e of batch.reverse()) e.done();
        }, 0);
      }
      queued.push({ sequence, ids, step, done: () => resolve(1000 * sequence + step) });
    });
  return { evaluate, batches, now: () => clock };
}

Deno.test("runLoad: every step is one batch of all sequences, each fed its own last token", async () => {
  const fake = fakeContext();
  const prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]];
  const run = await runLoad(prompts, 4, fake.evaluate, fake.now);
  assert.equal(fake.batches.length, 4, "one decode per generated token");
  for (const [step, batch] of fake.batches.entries()) {
    assert.deepEqual(
      batch.map((e) => e.sequence).sort(),
      [0, 1, 2],
      `step ${step} should hold every sequence once`,
    );
    for (const e of batch) {
      assert.equal(e.step, step);
      assert.deepEqual(e.ids, step === 0 ? prompts[e.sequence] : [1000 * e.sequence + step - 1]);
    }
  }
  assert.deepEqual(run.tokenMs, [[50, 60, 70, 80], [50, 60, 70, 80], [50, 60, 70, 80]]);
  assert.equal(run.seconds, 0.08);
});

Deno.test("runLoad: an evaluation's failure fails the run", async () => {
  const failing: Evaluate = (sequence, _ids, step) =>
    sequence === 1 && step === 2 ? Promise.reject(new Error("no token")) : Promise.resolve(7);
  await assert.rejects(runLoad([[1], [2]], 4, failing), /no token/);
});

Deno.test("nearestRank: the smallest value with at least p of the values at or below it", () => {
  const hundred = Array.from({ length: 100 }, (_, i) => 100 - i);
  assert.equal(nearestRank(hundred, 0.99), 99);
  assert.equal(nearestRank(hundred, 1), 100);
  assert.equal(nearestRank(hundred, 0.5), 50);
  assert.equal(nearestRank([3, 1, 2], 0.99), 3);
  assert.equal(nearestRank([4], 0.01), 4);
  assert.throws(() => nearestRank([], 0.5), RangeError);
  assert.throws(() => nearestRank([1], 0), RangeError);
  assert.throws(() => nearestRank([1], 1.5), RangeError);
});

Deno.test("loadFigure: aggregate over the median run, first-token median, gap p99 over every run", () => {
  // Two clients, three tokens each; runs of 0.3, 0.1 and 0.2 s: the median run is 0.2 s.
  const runs: LoadRun[] = [
    { seconds: 0.3, tokenMs: [[100, 110, 300], [120, 130, 140]] },
    { seconds: 0.1, tokenMs: [[40, 60, 80], [50, 70, 90]] },
    { seconds: 0.2, tokenMs: [[60, 70, 80], [70, 80, 200]] },
  ];
  const figure = loadFigure(2, runs);
  assert.deepEqual(Object.keys(figure).sort(), [
    "aggregateTokPerS",
    "clients",
    "gapP99Ms",
    "ttftP50Ms",
  ]);
  assert.equal(figure.clients, 2);
  assert.equal(figure.aggregateTokPerS, 6 / 0.2);
  // First tokens 100, 120, 40, 50, 60, 70: the median is (60 + 70) / 2.
  assert.equal(figure.ttftP50Ms, 65);
  // Gaps 10, 190, 10, 10, 20, 20, 20, 20, 10, 10, 10, 120: the 12th of 12 is the largest.
  assert.equal(figure.gapP99Ms, 190);
});

Deno.test("loadFigure: refuses no runs, runs of other sizes, and sequences without a gap", () => {
  const run: LoadRun = { seconds: 1, tokenMs: [[1, 2], [1, 2]] };
  assert.throws(() => loadFigure(2, []), RangeError);
  assert.throws(() => loadFigure(3, [run]), RangeError);
  assert.throws(
    () => loadFigure(2, [run, { seconds: 1, tokenMs: [[1, 2, 3], [1, 2]] }]),
    RangeError,
  );
  assert.throws(() => loadFigure(1, [{ seconds: 1, tokenMs: [[5]] }]), RangeError);
});
