// The bench's workloads on the CPU reference (bench/measure.ts): what they feed, that slots and
// chunked prefill decode the same tokens, deadlines. Worker, GPU: tests/bench_measure_test.ts.

import assert from "node:assert/strict";
import { readHParams } from "../engine/hparams.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import type { TestModelSpec } from "../tests/_models.ts";
import { withModel } from "../tests/_stage_gates.ts";
import {
  BENCH_SAMPLING,
  Deadline,
  measure,
  median,
  OutOfTime,
  percentile,
  repeat,
  seededIds,
  timeConcurrentDecode,
  timeDecode,
  timeMtpSampledDecode,
  timePrefill,
  timeSampledDecode,
  timingOf,
} from "./measure.ts";
import { sampleToken, SplitMix64 } from "../lib/sampling/sample.ts";

const CTX = 48;

const TINY: TestModelSpec = { arch: "qwen35moe" };

Deno.test("median: middle value, mean of the middle two, and no values refused", () => {
  assert.equal(median([5, 1, 3]), 3);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.throws(() => median([]), RangeError);
});

Deno.test("percentile: nearest rank, so a p99 of fewer than 100 values is their largest", () => {
  const hundred = Array.from({ length: 100 }, (_, i) => 100 - i);
  assert.equal(percentile(hundred, 0.99), 99);
  assert.equal(percentile(hundred, 0.5), 50);
  assert.equal(percentile([3, 9, 1], 0.99), 9);
  assert.equal(percentile([3, 9, 1], 1 / 3), 1);
  assert.throws(() => percentile([], 0.5), RangeError);
  assert.throws(() => percentile([1], 0), RangeError);
});

Deno.test("timingOf: median, fastest and slowest of the runs", () => {
  assert.deepEqual(timingOf([3, 1, 2]), { seconds: [3, 1, 2], median: 2, min: 1, max: 3 });
});

Deno.test("seededIds: in the vocabulary, the same for a seed, different across seeds", () => {
  const a = seededIds(500, 963, 1);
  assert.ok(a.every((id) => id < 963));
  assert.deepEqual(seededIds(500, 963, 1), a);
  assert.notDeepEqual(seededIds(500, 963, 2), a);
  assert.ok(new Set(a).size > 300, "ids should spread over the vocabulary");
  assert.throws(() => seededIds(4, 0, 1), RangeError);
});

Deno.test("timeDecode feeds back the greedy tokens of stepping the stage by hand", async () => {
  await withModel(TINY, async (model) => {
    const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
    try {
      const first = seededIds(1, readHParams(model.metadata).V, 3)[0];
      const run = await timeDecode([stage], first, 6);
      assert.ok(run.seconds > 0);
      const greedy = [first];
      for (let pos = 0; pos < 5; pos++) {
        const out = await stage.run(0, { kind: "ids", ids: Uint32Array.of(greedy[pos]) }, 1, pos);
        greedy.push(out.kind === "ids" ? out.ids[0] : -1);
      }
      assert.deepEqual(Array.from(run.fed), greedy);
    } finally {
      stage.close();
    }
  });
});

Deno.test("timeSampledDecode draws each step's id from its top-k with the seeded stream", async () => {
  await withModel(TINY, async (model) => {
    const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
    try {
      const first = seededIds(1, readHParams(model.metadata).V, 3)[0];
      const run = await timeSampledDecode([stage], first, 8, BENCH_SAMPLING, 7);
      const rng = new SplitMix64(7n);
      const fed = [first];
      for (let pos = 0; pos < 7; pos++) {
        const out = await stage.run(0, { kind: "ids", ids: Uint32Array.of(fed[pos]) }, 1, pos, {
          topk: BENCH_SAMPLING.topK,
        });
        assert.equal(out.kind, "ids");
        if (out.kind === "ids") {
          assert.equal(out.top.length, BENCH_SAMPLING.topK);
          fed.push(sampleToken(out.ids[0], out.top, BENCH_SAMPLING, rng));
        }
      }
      assert.deepEqual(Array.from(run.fed), fed);
      assert.notDeepEqual(
        run.fed,
        (await timeDecode([stage], first, 8)).fed,
        "sampling is not greedy",
      );
    } finally {
      stage.close();
    }
  });
});

Deno.test("timeMtpSampledDecode samples as timeSampledDecode without drafts, and keeps a predictable model's drafts", async () => {
  const open = (model: Parameters<typeof openReferenceStage>[0]) =>
    openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX, maxRewind: 4, mtp: true });
  await withModel({ arch: "qwen35moe", quant: "q8_0", mtp: true }, async (model) => {
    const stage = await open(model);
    try {
      const plain = await timeSampledDecode([stage], 300, 10, BENCH_SAMPLING, 7);
      const none = await timeMtpSampledDecode(stage, 300, 10, 0, BENCH_SAMPLING, 7);
      assert.deepEqual(none.fed, plain.fed, "no drafts: the same draws");
      const a = await timeMtpSampledDecode(stage, 300, 10, 3, BENCH_SAMPLING, 7);
      const b = await timeMtpSampledDecode(stage, 300, 10, 3, BENCH_SAMPLING, 7);
      assert.deepEqual(a.fed, b.fed, "seeded: the same tokens again");
      assert.ok(a.drafted > 0);
    } finally {
      stage.close();
    }
  });
  await withModel(
    { arch: "qwen35moe", quant: "q8_0", mtp: true, predictable: true },
    async (model) => {
      const stage = await open(model);
      try {
        const run = await timeMtpSampledDecode(stage, 300, 12, 3, BENCH_SAMPLING, 7);
        assert.deepEqual([...run.fed], Array.from({ length: 12 }, (_, i) => 300 + i));
        assert.ok(run.drafted > 0 && run.kept === run.drafted, `${run.kept} of ${run.drafted}`);
      } finally {
        stage.close();
      }
    },
  );
});

Deno.test("timePrefill chunks by maxBatch as the server does and leaves the slot at the prompt's end", async () => {
  await withModel(TINY, async (model) => {
    const ids = seededIds(20, readHParams(model.metadata).V, 5);
    const next = Uint32Array.of(ids[0]);
    const after: number[] = [];
    const asked: (string | undefined)[][] = [];
    for (const maxBatch of [8, 32]) {
      const stage = await openReferenceStage(model, {
        first: 0,
        end: 4,
        slots: 1,
        ctx: CTX,
        maxBatch,
      });
      try {
        const runs: (string | undefined)[] = [];
        const recording: Stage = Object.assign(Object.create(stage), {
          run: (...args: Parameters<Stage["run"]>) => {
            runs.push(args[4]?.logits);
            return stage.run(...args);
          },
        });
        await timePrefill([recording], ids);
        asked.push(runs);
        const out = await stage.run(0, { kind: "ids", ids: next }, 1, ids.length);
        assert.equal(out.kind, "ids");
        after.push(out.kind === "ids" ? out.ids[0] : -1);
        await assert.rejects(() => stage.run(0, { kind: "ids", ids: next }, 1, ids.length + 5));
      } finally {
        stage.close();
      }
    }
    assert.equal(after[0], after[1], "chunked and whole prefill should reach the same state");
    // Only the prompt's last position is sampled from, so only its logits are asked for.
    assert.deepEqual(asked, [["none", "none", "last"], ["last"]]);
  });
});

Deno.test("timeConcurrentDecode: each slot decodes as it would alone, greedy or sampled from its own seed", async () => {
  await withModel(TINY, async (model) => {
    const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 3, ctx: CTX });
    try {
      const firsts = Array.from(seededIds(3, readHParams(model.metadata).V, 9));
      const greedy = await timeConcurrentDecode([stage], firsts, 5);
      const sampled = await timeConcurrentDecode([stage], firsts, 5, BENCH_SAMPLING, 40);
      for (const [slot, first] of firsts.entries()) {
        assert.deepEqual(greedy.fed[slot], (await timeDecode([stage], first, 5)).fed);
        const alone = await timeSampledDecode([stage], first, 5, BENCH_SAMPLING, 40 + slot);
        assert.deepEqual(sampled.fed[slot], alone.fed);
      }
      assert.notDeepEqual(greedy.fed[0], greedy.fed[1]);
      assert.notDeepEqual(sampled.fed, greedy.fed, "the sampled slots draw");
    } finally {
      stage.close();
    }
  });
});

Deno.test("timeDecode from a base position continues the slot's prefix, as stepping by hand", async () => {
  await withModel(TINY, async (model) => {
    const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 2, ctx: CTX });
    try {
      const prefix = seededIds(12, readHParams(model.metadata).V, 6);
      await timePrefill([stage], prefix, 1);
      const run = await timeDecode([stage], 17, 4, { slot: 1, base: 12 });
      await timePrefill([stage], prefix, 1);
      const fed = [17];
      for (let pos = 12; pos < 15; pos++) {
        const out = await stage.run(1, { kind: "ids", ids: Uint32Array.of(fed.at(-1)!) }, 1, pos);
        fed.push(out.kind === "ids" ? out.ids[0] : -1);
      }
      assert.deepEqual(Array.from(run.fed), fed);
      // From position 0 the same first id decodes otherwise: the prefix was read.
      assert.notDeepEqual((await timeDecode([stage], 17, 4, { slot: 1 })).fed, run.fed);
    } finally {
      stage.close();
    }
  });
});

/** A Deadline on a clock that moves only by what each run returns, as if it took that long. */
function spentRuns(limit: number, runs: readonly number[]) {
  let now = 0;
  let calls = 0;
  const once = () => {
    const s = runs[Math.min(calls++, runs.length - 1)];
    now += s * 1000;
    return Promise.resolve(s);
  };
  return { deadline: new Deadline(limit, () => now), once, calls: () => calls };
}

Deno.test("repeat: warm-up excluded, runs cut to the deadline, none without time", async () => {
  const plenty = spentRuns(60, [9, 1, 3, 2]);
  const timing = await repeat(3, plenty.once, plenty.deadline);
  assert.deepEqual(timing.seconds, [1, 3, 2]);
  assert.equal(timing.median, 2);
  // 20 s runs in 50 s: the warm-up and one timed run fit, a second would end past the deadline.
  const cut = spentRuns(50, [20]);
  assert.equal((await repeat(3, cut.once, cut.deadline)).seconds.length, 1);
  assert.equal(cut.calls(), 2);
  await assert.rejects(() => repeat(3, () => Promise.resolve(1), new Deadline(-1)), OutOfTime);
  const slow = spentRuns(60, [90]);
  await assert.rejects(() => repeat(3, slow.once, slow.deadline), OutOfTime);
});

Deno.test("repeat: a slow warm-up (one-time costs) does not cut the fast runs after it", async () => {
  // llama.cpp's first pp512 builds its pipelines: 25 s, then 0.1 s a run, in 100 s.
  const warmSlow = spentRuns(100, [25, 0.1]);
  const timing = await repeat(5, warmSlow.once, warmSlow.deadline);
  assert.equal(timing.seconds.length, 5);
  assert.equal(warmSlow.calls(), 6);
});

Deno.test("measure keeps a failure as the figure's error instead of throwing", async () => {
  const lines: string[] = [];
  const failed = await measure(
    "pp8",
    8,
    3,
    () => {
      throw new Error("device lost");
    },
    new Deadline(60),
    (l) => lines.push(l),
  );
  assert.deepEqual(failed, { tokens: 8, error: "device lost" });
  const skipped = await measure("tg8", 8, 3, () => Promise.resolve(1), new Deadline(-1), () => {});
  assert.match(skipped.error ?? "", /^skipped: /);
  const ok = await measure("tg8", 8, 3, () => Promise.resolve(0.5), new Deadline(60), () => {});
  assert.equal(ok.timing?.median, 0.5);
  assert.match(lines[0], /^pp8: .*device lost/s);
});
