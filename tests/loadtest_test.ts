// tools/loadtest.ts against a tiny head: every client's requests are timed (TTFT, decode
// tokens/s) and reported, in-process and through the `deno task loadtest` command line.

import assert from "node:assert/strict";
import { formatReport, type LoadReport, runLoad } from "../tools/loadtest.ts";
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
}

Deno.test("runLoad times every client's streamed requests and formats a row per client", async () => {
  const head = await startTestHead({ slots: 2, ctx: 128 });
  try {
    const report = await runLoad({
      url: head.url,
      clients: 3,
      requests: 2,
      maxTokens: 6,
      prompt: "Once upon a time",
    });
    checkReport(report, 3, 2);
    const table = formatReport(report).split("\n");
    assert.match(table[0], /client +ok +errors +TTFT p50 +TTFT max +tok\/s/);
    assert.match(table[1], /^0 +2 +0 /);
    assert.match(table[4], /^all +6 +0 /);
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
      "--json",
    ],
    cwd: PROJECT_ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  checkReport(JSON.parse(new TextDecoder().decode(out.stdout)), 2, 1);
});
