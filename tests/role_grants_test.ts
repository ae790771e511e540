// Each role runs under the grant its own flags call for: `deno task head` and `deno task worker`,
// started as the README starts them, serve a split on stage shards; a role thread started the same
// way is refused another file, another address, writes and subprocesses, and still serves.

import assert from "node:assert/strict";
import { layerRange, listOf } from "../lib/cli.ts";
import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";
import { writeStageShards } from "../tools/shard.ts";
import { probeWorker } from "../tools/probe.ts";
import { post, tinyModel } from "./_head.ts";
import { freePort, PROJECT_ROOT, startLogged } from "./_workers.ts";

const COMMON = ["--backend", "reference", "--ctx", "256", "--slots", "1", "--snapshots", "2"];
const ASK = {
  model: "m",
  max_tokens: 6,
  temperature: 0,
  messages: [{ role: "user", content: "Hello there" }],
};

/** A head and a worker on the two shards of the tiny model, in a fresh directory. */
async function withShards(use: (whole: string, head: string, worker: string) => Promise<void>) {
  // Resolved, so that the grant (which names files as their links resolve) reads as given.
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "tandem-grants-" }));
  try {
    const whole = await tinyModel();
    const [head, worker] = await writeStageShards(whole, listOf(layerRange).parse("0:2,2:4"), dir);
    await use(whole, head, worker);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

Deno.test("deno task worker and deno task head serve a split on shards, each under its own grant", async () => {
  await withShards(async (_whole, headShard, workerShard) => {
    const [wp, hp] = [freePort(), freePort()];
    const worker = await startLogged(
      ["task", "worker", "--model", workerShard, "--layers", "2:4", "--port", `${wp}`, ...COMMON],
      /listening on/,
    );
    const head = await startLogged([
      "task",
      "head",
      ...["--model", headShard, "--layers", "0:2", "--next", `127.0.0.1:${wp}`],
      ...["--port", `${hp}`, ...COMMON],
    ], /serving/);
    try {
      const res = await post(`http://127.0.0.1:${hp}/v1/messages`, ASK);
      assert.equal(res.status, 200);
      assert.equal((await res.json()).usage.output_tokens, 6);
      const health = await (await fetch(`http://127.0.0.1:${hp}/health`)).json();
      assert.deepEqual(health.stages.map((s: { up: boolean }) => s.up), [true, true]);
    } finally {
      assert.equal((await head.stop()).code, 0, head.log());
      assert.equal((await worker.stop()).code, 0, worker.log());
    }
    assert.match(
      worker.log(),
      new RegExp(escape(
        `[launch] the worker runs with: net 127.0.0.1:${wp}; read ${workerShard}; env ` +
          `TANDEM_*; ffi none; no write, run or sys`,
      )),
    );
    assert.match(
      head.log(),
      new RegExp(
        escape(
          `[launch] the head runs with: net 127.0.0.1:${hp}, 127.0.0.1:${wp}, 127.0.0.1:`,
        ) + String.raw`\d+` + escape(
          `; read ${headShard}, ${PROJECT_ROOT}/lib/, ${PROJECT_ROOT}/engine/, ` +
            `${PROJECT_ROOT}/node_modules/; env TANDEM_*; ffi none; no write, run or sys`,
        ),
      ),
    );
  });
});

Deno.test("a role thread is refused another file, another address, writes and runs, and still serves", async () => {
  // The probe runs with exactly the launcher grant of the tasks.
  const tasks = JSON.parse(await Deno.readTextFile(`${PROJECT_ROOT}/deno.json`)).tasks;
  const flags = LAUNCHER_FLAGS.map((f) => f.includes("*") ? `'${f}'` : f).join(" ");
  assert.equal(tasks.head, `deno run ${flags} main.ts`);
  assert.equal(tasks.worker, `deno run ${flags} worker.ts`);

  await withShards(async (whole, headShard, workerShard) => {
    const elsewhere = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const outside = {
      TANDEM_PROBE_READ: whole,
      TANDEM_PROBE_CONNECT: `127.0.0.1:${(elsewhere.addr as Deno.NetAddr).port}`,
    };
    const refused = JSON.stringify({
      read: "NotCapable",
      connect: "NotCapable",
      write: "NotCapable",
      run: "NotCapable",
    });
    const [wp, hp] = [freePort(), freePort()];
    const probe = [...LAUNCHER_FLAGS, "tests/_role_probe.ts"];
    const worker = await startLogged(
      ["run", ...probe, "--model", workerShard, "--layers", "2:4", "--port", `${wp}`, ...COMMON],
      /listening on/,
      { ...outside, TANDEM_PROBE_ROLE: "worker" },
    );
    // A worker serves one client at a time: ask it before the head holds its connection.
    const answer = await probeWorker(`127.0.0.1:${wp}`);
    const head = await startLogged(
      [
        "run",
        ...probe,
        ...["--model", headShard, "--layers", "0:2", "--next", `127.0.0.1:${wp}`],
        ...["--port", `${hp}`, ...COMMON],
      ],
      /serving/,
      { ...outside, TANDEM_PROBE_ROLE: "head" },
    );
    try {
      assert.ok(worker.log().includes(`probe: ${refused}`), worker.log());
      assert.ok(head.log().includes(`probe: ${refused}`), head.log());
      // Both still serve: the worker answers a hello and a PING, the head a request through it.
      assert.match(answer, /layers 2\.\.4 of 4.*PING/);
      const res = await post(`http://127.0.0.1:${hp}/v1/messages`, ASK);
      assert.equal(res.status, 200);
      await res.body?.cancel();
    } finally {
      elsewhere.close();
      await head.stop();
      await worker.stop();
    }
  });
});
