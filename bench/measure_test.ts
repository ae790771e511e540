// The bench's workloads on the CPU reference: what they feed, that slots and chunked prefill decode
// the same tokens, deadlines, and the closing table (bench/measure.ts, report.ts). A worker process
// and the GPU: tests/bench_measure_test.ts.

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
  timePrefill,
  timeSampledDecode,
  timingOf,
} from "./measure.ts";
import { sampleToken, SplitMix64 } from "../lib/sampling/sample.ts";
import { formatTable } from "./report.ts";

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

Deno.test("formatTable: median (best–worst, ×slowest/median), load, server rows, notes", () => {
  const t = (...seconds: number[]) => timingOf(seconds);
  const table = formatTable(
    {
      date: "2026-11-29T10:00:00.000Z",
      commit: "abc",
      device: "GPU X",
      model: { path: "m.gguf", bytes: 19.66e9, source: "made", makeSeconds: 42 },
      engines: [
        {
          backend: "gpu",
          gpu: "dawn",
          openSeconds: 11.87,
          figures: {
            pp512: { tokens: 512, timing: t(0.5, 0.4, 0.6) },
            tg128: { tokens: 128, timing: t(2) },
            "tg128-fused": { tokens: 128, timing: t(1.6) },
            "tg128-sampled": { tokens: 128, timing: t(2.56) },
            tg128x2: { tokens: 256, error: "skipped: out of time" },
          },
          split: {
            layers: "0:20 + 20:40",
            decode: { tokens: 128, timing: t(0.32) },
            concurrent: { tokens: 256, timing: t(2) },
          },
        },
        { gpu: "builtin", error: "the builtin engine exited with code 1" },
      ],
      servers: [{
        backend: "gpu",
        gpu: "dawn",
        promptTokens: 510,
        maxTokens: 128,
        modes: [
          {
            layers: "0:40",
            startSeconds: 12.3,
            routes: [
              {
                route: "/v1/messages",
                greedy: {
                  ttft: { tokens: 510, timing: t(0.45) },
                  decode: { tokens: 1, timing: t(0.01, 0.011) },
                },
                sampled: {
                  ttft: { tokens: 510, timing: t(0.5) },
                  decode: { tokens: 1, timing: t(0.0125) },
                },
              },
              {
                route: "/completion",
                greedy: {
                  ttft: { tokens: 510, timing: t(0.25) },
                  decode: { tokens: 1, timing: t(0.005) },
                },
                sampled: {
                  ttft: { tokens: 510, timing: t(0.26) },
                  decode: { tokens: 1, timing: t(0.006) },
                },
              },
            ],
          },
          { layers: "0:20 + 20:40", error: "the worker did not start" },
        ],
      }],
      peers: [{
        name: "llama.cpp",
        loadSeconds: 6.84,
        figures: {
          pp512: { tokens: 512, timing: t(0.1) },
          tg128: { tokens: 128, timing: t(1) },
          "tg128-nologits": { tokens: 128, timing: t(0.5) },
        },
      }],
    },
    [512],
    128,
    2,
  );
  const lines = table.split("\n");
  assert.equal(lines[0], "2026-11-29, GPU X, commit abc");
  assert.equal(lines[1], "model m.gguf (19.66 GB, made in 42 s)");
  assert.match(lines[3], /^\| engine \| load s \| pp512 tok\/s \| tg128 tok\/s \| tg128 fused/);
  assert.equal(
    lines[5],
    "| tandem gpu dawn | 11.9 | 1024 (1280–853, ×1.20) | 64.0 (64.0–64.0, ×1.00) | " +
      "80.0 (80.0–80.0, ×1.00) | 50.0 (50.0–50.0, ×1.00) | (1) | 0:20 + 20:40 | " +
      "2.5 (2.5–2.5, ×1.00) | 128 (128–128, ×1.00) |",
  );
  assert.equal(lines[6], "| tandem gpu builtin | (2) | — | — | — | — | — | — | — | — |");
  assert.equal(
    lines[7],
    "| llama.cpp | 6.8 | 5120 (5120–5120, ×1.00) | 128 (128–128, ×1.00); 256 without sampling " +
      "| — | — | — | — | — | — |",
  );
  assert.match(lines[9], /^\| through the server, 510-token prompt, 128 out \| start s \|/);
  assert.equal(
    lines[11],
    "| tandem gpu dawn, layers 0:40, /v1/messages | 12.3 | 450 (450–450, ×1.00) | " +
      "95.2 (100–90.9, ×1.05) | 500 (500–500, ×1.00) | 80.0 (80.0–80.0, ×1.00) |",
  );
  assert.equal(
    lines[12],
    "| tandem gpu dawn, layers 0:40, /completion | 12.3 | 250 (250–250, ×1.00) | " +
      "200 (200–200, ×1.00) | 260 (260–260, ×1.00) | 167 (167–167, ×1.00) |",
  );
  assert.equal(lines[13], "| tandem gpu dawn, layers 0:20 + 20:40 | (3) | — | — | — | — |");
  assert.match(lines[15], /Largest slowest\/median: ×1\.20 \(tandem gpu dawn pp512\)\.$/);
  assert.deepEqual(lines.slice(17), [
    "(1) skipped: out of time",
    "(2) the builtin engine exited with code 1",
    "(3) the worker did not start",
  ]);
});
