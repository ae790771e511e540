// tools/loadtest.ts against a tiny head: every client's requests are timed (TTFT, gaps between
// tokens, decode tokens/s) and reported, in-process and through the `deno task loadtest` command line.

import assert from "node:assert/strict";
import {
  formatReport,
  loadFigure,
  type LoadReport,
  requestBody,
  runLoad,
} from "../tools/loadtest.ts";
import { startTestHead, tinyModel } from "./_head.ts";
import { PROJECT_ROOT } from "./_workers.ts";

function checkReport(report: LoadReport, clients: number, requests: number): void {
  assert.equal(report.clients.length, clients);
  for (const c of report.clients) {
    assert.deepEqual(c.errors, []);
    assert.equal(c.timings.length, requests);
    for (const t of c.timings) {
      assert.ok(t.ttftMs > 0 && t.ttftMs <= t.totalMs, JSON.stringify(t));
      assert.ok(t.tokens >= 1, JSON.stringify(t));
      if (t.tokens > 1) assert.ok(t.tokensPerSecond > 0, JSON.stringify(t));
    }
  }
  assert.ok(report.totalTokensPerSecond > 0);
  assert.ok(report.ttftP50Ms > 0);
}

Deno.test("requestBody: text to /v1/messages, ids and ignore_eos to /completion, and no mixing", () => {
  const spec = { maxTokens: 8, temperature: 0.7, topP: 0.9, topK: 40, seed: 3 };
  assert.deepEqual(
    requestBody({ ...spec, route: "/completion", prompt: [5, 6], ignoreEos: true }),
    {
      prompt: [5, 6],
      n_predict: 8,
      stream: true,
      temperature: 0.7,
      top_p: 0.9,
      top_k: 40,
      seed: 3,
      ignore_eos: true,
    },
  );
  assert.deepEqual(requestBody({ ...spec, route: "/v1/messages", prompt: "hi" }), {
    model: "loadtest",
    max_tokens: 8,
    stream: true,
    messages: [{ role: "user", content: "hi" }],
    temperature: 0.7,
    top_p: 0.9,
    top_k: 40,
    seed: 3,
  });
  assert.throws(() => requestBody({ ...spec, route: "/v1/messages", prompt: [5] }), TypeError);
  assert.throws(
    () => requestBody({ ...spec, route: "/v1/messages", prompt: "hi", ignoreEos: true }),
    TypeError,
  );
});

Deno.test("runLoad on /v1/messages times every client's requests and formats a row per client", async () => {
  const head = await startTestHead({ slots: 2, ctx: 128 });
  try {
    const report = await runLoad({
      url: head.url,
      clients: 3,
      requests: 2,
      request: { route: "/v1/messages", prompt: "Once upon a time", maxTokens: 6, temperature: 0 },
    });
    checkReport(report, 3, 2);
    assert.ok(Number.isNaN(report.gapP99Ms), "pieces of text are not tokens: no gaps");
    const table = formatReport(report).split("\n");
    assert.match(table[0], /client +ok +errors +TTFT p50 +TTFT max +gap p99 +tok\/s/);
    const [p50, max] = table[1].split(/ +/).slice(3, 5).map(Number);
    assert.ok(p50 > 0 && max >= p50, table[1]);
    assert.match(table[1], /^0 +2 +0 +\d+ +\d+ +— +\d+\.\d$/);
    assert.match(table[4], /^all +6 +0 /);
  } finally {
    await head.close();
  }
});

Deno.test("runLoad on /completion: every token an event, its gaps timed, full replies with ignore_eos", async () => {
  const head = await startTestHead({ slots: 4, ctx: 128 });
  try {
    const report = await runLoad({
      url: head.url,
      clients: 4,
      requests: 1,
      request: {
        route: "/completion",
        prompt: [11, 12, 13, 14, 15, 16],
        maxTokens: 7,
        temperature: 0.7,
        seed: 5,
        ignoreEos: true,
      },
    });
    checkReport(report, 4, 1);
    const timings = report.clients.flatMap((c) => c.timings);
    for (const t of timings) {
      assert.equal(t.tokens, 7);
      assert.equal(t.gapsMs.length, 6, "a gap between each two of the 7 token events");
      assert.ok(t.gapsMs.every((g) => g >= 0));
    }
    const gaps = timings.flatMap((t) => t.gapsMs).sort((a, b) => a - b);
    // 24 gaps: the 99th percentile is the largest.
    assert.equal(report.gapP99Ms, gaps.at(-1));
    assert.deepEqual(loadFigure(report), {
      clients: 4,
      aggregateTokPerS: report.totalTokensPerSecond,
      ttftP50Ms: report.ttftP50Ms,
      gapP99Ms: report.gapP99Ms,
    });
    assert.ok(Math.abs(report.totalTokensPerSecond - 28 / (report.wallMs / 1000)) < 1e-9);
  } finally {
    await head.close();
  }
});

Deno.test("loadFigure refuses a run with failed requests", async () => {
  const head = await startTestHead({ slots: 1, ctx: 16 });
  try {
    // 20 prompt ids do not fit a 16-position context: every request is refused.
    const report = await runLoad({
      url: head.url,
      clients: 2,
      requests: 1,
      request: { route: "/completion", prompt: Array(20).fill(7), maxTokens: 4, temperature: 0 },
    });
    assert.match(report.clients[0].errors[0], /^HTTP 400/);
    assert.throws(() => loadFigure(report), /2 of 2 requests failed; the first: HTTP 400/);
  } finally {
    await head.close();
  }
});

Deno.test("deno task loadtest --model starts its own head and prints the report as JSON", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "tools/loadtest.ts",
      "--model",
      await tinyModel(),
      "--backend",
      "reference",
      "--clients",
      "2",
      "--requests",
      "1",
      "--max-tokens",
      "4",
      "--route",
      "/completion",
      "--ignore-eos",
      "--json",
    ],
    cwd: PROJECT_ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const report: LoadReport = JSON.parse(new TextDecoder().decode(out.stdout));
  checkReport(report, 2, 1);
  assert.ok(report.clients.every((c) => c.timings[0].gapsMs.length === 3));
});
