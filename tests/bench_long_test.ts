// The bench's long prompt beside live streams (bench/long_prompt.ts) on a tiny model and the CPU
// reference: its first token alone and beside the streams, their gaps without it and with it.

import assert from "node:assert/strict";
import { benchLongPrompt } from "../bench/long_prompt.ts";
import { Deadline } from "../bench/measure.ts";
import { testModel } from "./_models.ts";

Deno.test("benchLongPrompt: first token alone and beside the streams, their p99 gap without and with it", async () => {
  const lines: string[] = [];
  const report = await benchLongPrompt({
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference",
    gpu: "builtin",
    promptTokens: 30,
    longTokens: 120,
    streams: 2,
    window: 6,
    prefillChunk: 16,
    seed: 1,
    deadline: new Deadline(120),
    log: (line) => lines.push(line),
  });
  assert.equal(report.error, undefined, report.error);
  assert.equal(report.layers, "0:4");
  assert.ok(report.ttftAloneMs! > 0 && report.ttftBesideMs! > 0, JSON.stringify(report));
  assert.ok(report.gapP99WithoutMs! > 0 && report.gapP99WithMs! > 0, JSON.stringify(report));
  // Each stream's window tokens arrived after the window opened: a gap between each two of them.
  assert.ok(report.gapsWithout! >= 2 * 5, JSON.stringify(report));
  // Each stream had a token before the long prompt came and one after its first: a gap across.
  assert.ok(report.gapsWith! >= 2, JSON.stringify(report));
  assert.ok(lines.some((l) => /^long prompt of 120 beside 2 streams: first token \d+ ms/.test(l)));
});

Deno.test("benchLongPrompt past its deadline starts no head and says why", async () => {
  const report = await benchLongPrompt({
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference",
    gpu: "builtin",
    promptTokens: 30,
    longTokens: 120,
    streams: 2,
    window: 6,
    seed: 1,
    deadline: new Deadline(-1),
    log: () => {},
  });
  assert.equal(report.error, "skipped: no time left to start the head");
  assert.equal(report.ttftAloneMs, undefined);
});
