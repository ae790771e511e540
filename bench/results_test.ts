// Merging part runs into one bench report (bench/results.ts): each engine and peer with every run's
// figures, a later run's over an earlier one's, and the other sections from the last run with them.

import assert from "node:assert/strict";
import { timingOf } from "./measure.ts";
import { type BenchReport, mergeReports } from "./results.ts";

const t = (s: number) => timingOf([s]);

const BASE: BenchReport = {
  date: "2026-12-06T10:00:00.000Z",
  commit: "abc",
  command: "deno task bench --only engine,peer",
  device: "GPU X",
  model: { path: "m.gguf", bytes: 1, source: "given" },
  engines: [],
  servers: [],
  peers: [],
};

Deno.test("mergeReports: engines and peers joined by name, later figures over earlier, sections from the last that has them", () => {
  const first: BenchReport = {
    ...BASE,
    parts: ["peer", "engine"],
    engines: [
      {
        backend: "gpu",
        gpu: "dawn",
        openSeconds: 8,
        figures: { pp512: { tokens: 512, timing: t(1) }, tg128: { tokens: 128, timing: t(1) } },
      },
      { gpu: "builtin", error: "no adapter" },
    ],
    peers: [{ name: "llama.cpp", error: "not installed" }],
    load: [{ clients: 1, aggregateTokPerS: 1, ttftP50Ms: 1, gapP99Ms: 1 }],
    grammar: { error: "the grammar part failed: no vocabulary" },
  };
  const second: BenchReport = {
    ...BASE,
    date: "2026-12-06T11:00:00.000Z",
    commit: "def",
    command: "deno task bench --only engine,load,long",
    parts: ["engine", "load", "long"],
    engines: [{
      backend: "gpu",
      gpu: "dawn",
      figures: {
        tg128: { tokens: 128, timing: t(2) },
        "tg128x4-sampled": { tokens: 512, timing: t(3) },
      },
    }],
    load: [{ clients: 16, aggregateTokPerS: 2, ttftP50Ms: 2, gapP99Ms: 2 }],
    longPrompt: { layers: "0:40", streams: 8, longTokens: 32768, ttftAloneMs: 9 },
  };
  const merged = mergeReports([first, second], ["a.json", "b.json"]);
  assert.equal(merged.date, second.date);
  assert.equal(merged.commit, "abc, def");
  assert.equal(merged.command, `${first.command} ; ${second.command}`);
  assert.equal(merged.device, "GPU X");
  assert.deepEqual(merged.parts, ["peer", "engine", "load", "long"]);
  assert.deepEqual(merged.merged, ["a.json", "b.json"]);
  assert.deepEqual(merged.engines, [
    {
      backend: "gpu",
      gpu: "dawn",
      openSeconds: 8,
      figures: {
        pp512: { tokens: 512, timing: t(1) },
        tg128: { tokens: 128, timing: t(2) },
        "tg128x4-sampled": { tokens: 512, timing: t(3) },
      },
    },
    { gpu: "builtin", error: "no adapter" },
  ]);
  assert.deepEqual(merged.peers, first.peers, "an entry of one run stays as it was");
  assert.deepEqual(merged.load, second.load);
  assert.deepEqual(merged.longPrompt, second.longPrompt);
  assert.deepEqual(merged.grammar, first.grammar, "a section only an earlier run has is kept");
  assert.equal(merged.loadSplit, undefined);
  assert.throws(() => mergeReports([], []), RangeError);
});
