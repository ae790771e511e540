// The worker-kill drill at CI size (kill_drill.ts): 30 SIGKILLs of the worker under three
// streaming clients; `deno task drill` runs 100.

import assert from "node:assert/strict";
import { drillProblems, runKillDrill } from "./kill_drill.ts";

Deno.test("30 worker kills under streaming load: each request identical or a typed error", async () => {
  const report = await runKillDrill({ kills: 30 });
  assert.deepEqual(drillProblems(report), [], JSON.stringify(report, null, 2));
  assert.equal(report.kills, 30);
  assert.equal(
    report.requests,
    report.identical + report.refused + report.cut.length + report.failures.length,
  );
});
