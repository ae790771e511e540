// The bench's figures under load (bench/load_bench.ts) on a tiny model and the CPU reference: a
// head with a slot per client, then the split over a worker, each count of clients a LoadFigure.

import assert from "node:assert/strict";
import { benchLoad, type LoadBenchOptions } from "../bench/load_bench.ts";
import { Deadline } from "../bench/measure.ts";
import { testModel } from "./_models.ts";

async function options(deadlineS: number, lines: string[]): Promise<LoadBenchOptions> {
  return {
    model: await testModel({ arch: "qwen35moe" }),
    backend: "reference",
    gpu: "builtin",
    promptTokens: 40,
    maxTokens: 5,
    clients: [1, 3],
    splitClients: [2],
    split: 2,
    draft: 2,
    draftClients: [1],
    requests: 1,
    seed: 1,
    deadline: new Deadline(deadlineS),
    log: (line) => lines.push(line),
  };
}

Deno.test("benchLoad: a figure per count of clients, unsplit, split and drafting, each head a slot per client", async () => {
  const lines: string[] = [];
  const result = await benchLoad(await options(120, lines));
  assert.deepEqual(result.loadSetup.notes, []);
  assert.deepEqual(result.load.map((f) => f.clients), [1, 3]);
  assert.deepEqual(result.loadSplit?.map((f) => f.clients), [2]);
  assert.deepEqual(result.loadDraft?.map((f) => f.clients), [1]);
  for (const f of [...result.load, ...result.loadSplit!, ...result.loadDraft!]) {
    assert.ok(f.aggregateTokPerS > 0 && f.ttftP50Ms > 0, JSON.stringify(f));
    assert.ok(Number.isFinite(f.gapP99Ms) && f.gapP99Ms >= 0, JSON.stringify(f));
  }
  const { heads, promptTokens, temperature, route } = result.loadSetup;
  assert.deepEqual(heads.map((h) => [h.layers, h.slots, h.draft]), [
    ["0:4", 3, undefined],
    ["0:2 + 2:4", 2, undefined],
    ["0:4 --draft 2", 1, 2],
  ]);
  assert.ok(promptTokens <= 40 && promptTokens > 30);
  assert.equal(temperature, 0.7);
  assert.equal(route, "/completion");
  assert.ok(
    lines.some((l) => /^load 0:2 \+ 2:4, 2 clients: [\d.]+ tok\/s, first token p50 \d+ ms/.test(l)),
  );
});

Deno.test("benchLoad past its deadline starts no head and says why", async () => {
  const result = await benchLoad(await options(-1, []));
  assert.deepEqual(result.load, []);
  assert.deepEqual(result.loadSplit, []);
  assert.deepEqual(result.loadSetup.notes, [
    "0:4: skipped: no time left to start it",
    "0:2 + 2:4: skipped: no time left to start it",
    "0:4 --draft 2: skipped: no time left to start it",
  ]);
});
