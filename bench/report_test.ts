// The bench's closing tables (bench/report.ts): which figures a report has, read from their names;
// cells, notes, and the tables of many sequences, through the server, under load and the long prompt.

import assert from "node:assert/strict";
import { timingOf } from "./measure.ts";
import { formatTable, reportShape, type TableInput } from "./report.ts";

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
            "tg128-sampled-step": { tokens: 128, timing: t(3.2) },
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
  );
  const lines = table.split("\n");
  assert.equal(lines[0], "2026-11-29, GPU X, commit abc");
  assert.equal(lines[1], "model m.gguf (19.66 GB, made in 42 s)");
  assert.match(lines[3], /^\| engine \| load s \| pp512 tok\/s \| tg128 tok\/s \| tg128 fused/);
  assert.equal(
    lines[5],
    "| tandem gpu dawn | 11.9 | 1024 (1280–853, ×1.20) | 64.0 (64.0–64.0, ×1.00) | " +
      "80.0 (80.0–80.0, ×1.00) | 50.0 (50.0–50.0, ×1.00) | 40.0 (40.0–40.0, ×1.00) | (1) | " +
      "0:20 + 20:40 | " +
      "2.5 (2.5–2.5, ×1.00) | 128 (128–128, ×1.00) |",
  );
  assert.equal(lines[6], "| tandem gpu builtin | (2) | — | — | — | — | — | — | — | — | — |");
  assert.equal(
    lines[7],
    "| llama.cpp | 6.8 | 5120 (5120–5120, ×1.00) | 128 (128–128, ×1.00); 256 without sampling " +
      "| — | — | — | — | — | — | — |",
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

const t = (...seconds: number[]) => timingOf(seconds);

/** A run of every part: two engine figures per kind, ours under load and a peer's, the long prompt. */
const FULL: TableInput = {
  date: "2026-12-06T10:00:00.000Z",
  commit: "abc",
  device: "GPU X",
  model: { path: "m.gguf", bytes: 19.66e9, source: "given" },
  engines: [{
    backend: "gpu",
    gpu: "dawn",
    figures: {
      pp512: { tokens: 512, timing: t(0.2) },
      pp32768: { tokens: 32768, error: "skipped: out of time" },
      tg128: { tokens: 128, timing: t(0.64) },
      "tg128-fused": { tokens: 128, error: "skipped: out of time" },
      "tg128-sampled": { tokens: 128, timing: t(0.8) },
      "tg128x4-sampled": { tokens: 512, timing: t(1) },
      "tg128x16-sampled": { tokens: 2048, timing: t(2, 2.2) },
      "tg128@32768": { tokens: 128, timing: t(0.8) },
    },
  }],
  peers: [{
    name: "llama.cpp",
    figures: { pp512: { tokens: 512, timing: t(0.1) }, tg128: { tokens: 128, timing: t(1) } },
    load: [{ clients: 16, aggregateTokPerS: 640, ttftP50Ms: 900, gapP99Ms: 40.25 }],
  }],
  load: [
    { clients: 1, aggregateTokPerS: 150.4, ttftP50Ms: 190.6, gapP99Ms: 6.04 },
    { clients: 16, aggregateTokPerS: 1020, ttftP50Ms: 1500, gapP99Ms: 30 },
  ],
  loadSplit: [{ clients: 16, aggregateTokPerS: 800, ttftP50Ms: 1700, gapP99Ms: 35 }],
  loadSetup: {
    backend: "gpu",
    gpu: "dawn",
    promptTokens: 510,
    maxTokens: 128,
    temperature: 0.7,
    heads: [{ layers: "0:40" }, { layers: "0:20 + 20:40" }],
    notes: ["0:40, 64 clients: skipped: 10 s left, about 40 s needed"],
  },
  longPrompt: {
    layers: "0:40",
    streams: 8,
    longTokens: 32768,
    ttftAloneMs: 12000,
    ttftBesideMs: 15000,
    gapP99WithoutMs: 8,
    gapP99WithMs: 30,
  },
};

Deno.test("reportShape: the figures' lengths, steps, slots, sequences and prefix, from their names", () => {
  assert.deepEqual(reportShape(FULL), {
    pp: [512, 32768],
    tg: 128,
    slots: 1,
    concurrency: [4, 16],
    at: 32768,
  });
});

Deno.test("formatTable: many sequences and a long prefix against one, load rows of ours and the peer's, the long prompt", () => {
  const lines = formatTable(FULL).split("\n");
  const at = (prefix: string) => lines.find((l) => l.startsWith(prefix));
  assert.equal(
    at("| engine | tg128 sampled"),
    "| engine | tg128 sampled tok/s | tg128 ×4 sampled tok/s; × of one | " +
      "tg128 ×16 sampled tok/s; × of one | tg128 after 32768 tok/s; × of tg128 |",
  );
  // 512 tok/s on 4 sequences is ×3.2 of 160 on one; 32768 positions in, ×0.80 of tg128's 200.
  assert.equal(
    at("| tandem gpu dawn | 160"),
    "| tandem gpu dawn | 160 (160–160, ×1.00) | 512 (512–512, ×1.00); ×3.20 | " +
      "975 (1024–931, ×1.05); ×6.10 | 160 (160–160, ×1.00); ×0.80 |",
  );
  assert.equal(
    at("| under load"),
    "| under load, 510-token prompt, 128 out, temperature 0.7 | clients | aggregate tok/s | " +
      "first token p50 ms | gap p99 ms |",
  );
  assert.deepEqual(lines.filter((l) => /^\| (tandem gpu dawn, layers|llama\.cpp \| 16)/.test(l)), [
    "| tandem gpu dawn, layers 0:40 | 1 | 150 | 191 | 6.0 |",
    "| tandem gpu dawn, layers 0:40 | 16 | 1020 | 1500 | 30.0 |",
    "| tandem gpu dawn, layers 0:20 + 20:40 | 16 | 800 | 1700 | 35.0 |",
    "| llama.cpp | 16 | 640 | 900 | 40.3 |",
  ]);
  assert.equal(at("Not measured under load"), "Not measured under load: (2).");
  assert.equal(
    at("A 32768-token prompt"),
    "A 32768-token prompt beside 8 streams (layers 0:40): its first token 15000 ms against " +
      "12000 ms alone (×1.25); the streams' p99 gap 30.0 ms with it, 8.0 ms without (×3.75).",
  );
  // One reason, one number: pp32768 and tg128 fused were both skipped.
  assert.match(
    at("| tandem gpu dawn | — |")!,
    /^\| tandem gpu dawn \| — \| 2560 \(2560–2560, ×1\.00\) \| \(1\) \| 200 \(200–200, ×1\.00\) \| \(1\) \|/,
  );
  assert.deepEqual(lines.slice(-2), [
    "(1) skipped: out of time",
    "(2) 0:40, 64 clients: skipped: 10 s left, about 40 s needed",
  ]);
});

Deno.test("formatTable: the grammar part's cases, or why it has none; a run of it alone shows no engine table", () => {
  const step = (p50: number, max: number) => ({
    stepMsP50: p50,
    stepMsP90: p50 * 2,
    stepMsP99: max / 2,
    stepMsMax: max,
  });
  const alone: TableInput = {
    ...FULL,
    engines: [],
    peers: [],
    load: undefined,
    loadSplit: undefined,
    loadSetup: undefined,
    longPrompt: undefined,
    grammar: {
      sequences: 16,
      steps: 300,
      replyTokens: 64,
      budget: false,
      vocabulary: { tokens: 248320, textTokens: 248317, source: "tests/_big_vocab.ts" },
      indexMs: 1234,
      cpu: "CPU Y (16 cores)",
      loadAverage: [0.5, 1.25],
      cases: [
        {
          name: "agentic",
          grammars: ["tool-call"],
          ...step(0.014, 0.8),
          processCpu: step(0.02, 1.5),
          acceptMsP50: 0.3,
          documents: 90,
          cold: step(0.05, 123.4),
        },
        {
          name: "mix",
          grammars: ["enum", "numbers"],
          ...step(0.1, 12.34),
          processCpu: step(0.1, 12),
          acceptMsP50: 0.4,
          documents: 100,
          cold: step(0.2, 40),
        },
      ],
    },
  };
  const lines = formatTable(alone).split("\n");
  assert.deepEqual(lines.slice(1, 8), [
    "model m.gguf (19.66 GB, given)",
    "",
    "| masks of 16 constrained sequences at once, ms a step (no budget, 64-token replies) | " +
    "grammars | p50 | p90 | p99 | max | process CPU p99 | process CPU max | cold p99 | cold max |",
    "|---|---|---|---|---|---|---|---|---|---|",
    "| agentic | tool-call | 0.01 | 0.03 | 0.40 | 0.80 | 0.75 | 1.50 | 61.7 | 123.4 |",
    "| mix | enum, numbers | 0.10 | 0.20 | 6.17 | 12.3 | 6.00 | 12.0 | 20.0 | 40.0 |",
    "lib/grammar on CPU Y (16 cores), a 248320-token vocabulary (tests/_big_vocab.ts; index " +
    "built in 1.2 s); load average 0.5 → 1.3. Wall time from asking the masks to having them " +
    "all; process CPU: every thread's in the same steps (far below the wall: the thread was " +
    "preempted). Cold: the same workload's first run, before any of its masks was cached.",
  ]);
  const failed = formatTable({ ...alone, grammar: { error: "the grammar part failed: boom" } });
  assert.deepEqual(failed.split("\n").slice(2, 4), [
    "",
    "Grammar masks: not measured (1).",
  ]);
  assert.equal(failed.split("\n").at(-1), "(1) the grammar part failed: boom");
});
