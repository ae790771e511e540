// The head's StageLink against an in-process worker: an idle worker is probed with PING (no slot
// touched, round trip recorded for /health), and a dead one is reported down with its reason.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import { openReferenceStage } from "../../engine/reference/reference_stage.ts";
import { StageLink } from "./link.ts";
import { serveLocal } from "../../tests/_workers.ts";
import { modelFingerprint } from "../wire/hello.ts";
import { StageUnavailableError } from "../wire/peer.ts";
import { remoteStageAfter } from "../wire/remote_stage.ts";
import { testModel } from "../../tests/_models.ts";

const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
const CTX = 16;

Deno.test("an idle stage is probed with PING, which leaves every slot as it was", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  const link = new StageLink(
    remoteStageAfter(worker.address, head, await modelFingerprint(model)),
    { idleMs: 0 },
  );
  try {
    const prompt = Uint32Array.of(3, 1, 4, 1);
    const part = async (ids: Uint32Array, base: number) => {
      const out = await head.run(0, { kind: "ids", ids }, ids.length, base);
      assert.equal(out.kind, "hidden");
      return await link.run(0, out.kind === "hidden" ? out.rows : new Float32Array(), 2, base, {});
    };
    await link.ensureUp(); // First contact: a connection, not a probe.
    assert.equal(link.status().lastRttMs, null);
    await part(prompt.subarray(0, 2), 0);
    await link.ensureUp(); // Silent for longer than idleMs (0): probed.
    const rtt = link.status().lastRttMs;
    assert.ok(rtt !== null && rtt > 0, `last round trip ${rtt}`);
    // The only slot holds a half-run sequence; it continues as if no probe had been sent.
    const got = await part(prompt.subarray(2), 2);
    const want = await whole.run(0, { kind: "ids", ids: prompt }, 4, 0);
    assert.ok(want.kind === "ids");
    assert.deepEqual([...got.ids], [...want.ids.subarray(2)]);
    assert.equal(link.epoch, 1);

    await worker.stop();
    const e = await link.ensureUp().then(() => undefined, (e) => e);
    assert.ok(e instanceof StageUnavailableError, `expected a refusal, got ${e}`);
    assert.equal(link.up, false);
    assert.match(link.status().error ?? "", /cannot connect/);
  } finally {
    link.close();
    whole.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("a reconnect ends at its deadline, and a health check within its wait, against a silent stage", async () => {
  // A stage that first drops each connection at once, then keeps them and never says a word:
  // a worker going to sleep. Quick failures at 0, 100 and 300 ms lead the reconnect through its
  // backoff waits to the last one, which ends at the deadline: no attempt may start after it.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let silentFrom = Infinity;
  const held: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) {
      if (performance.now() < silentFrom) conn.close();
      else held.push(conn);
    }
  })();
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const address = `127.0.0.1:${listener.addr.port}`;
  const link = new StageLink(
    remoteStageAfter(address, head, await modelFingerprint(model), { connectTimeoutMs: 3000 }),
  );
  try {
    const t0 = performance.now();
    silentFrom = t0 + 450;
    const e = await link.reconnect(t0 + 600).then(() => undefined, (e) => e);
    const took = performance.now() - t0;
    assert.ok(e instanceof StageUnavailableError, `expected a failure, got ${e}`);
    // Not a connect timeout (3 s) past the deadline.
    assert.ok(took >= 600 && took < 1000, `the reconnect gave up after ${took} ms`);
    const t1 = performance.now();
    await link.check(300);
    assert.ok(performance.now() - t1 < 600, "the health check waited for the connect timeout");
    assert.equal(link.status().up, false);
  } finally {
    link.close();
    head.close();
    listener.close();
    await accepting.catch(() => undefined);
    for (const conn of held) conn.close();
  }
});
