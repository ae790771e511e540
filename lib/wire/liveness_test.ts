// Tests of lib/wire/liveness.ts: the worker's ALIVE cadence and ordered writes, the client's
// silence watch (its own stalls discounted), and both over loopback TCP with a cut network.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import { openReferenceStage } from "../../engine/reference/reference_stage.ts";
import { testModel } from "../../tests/_models.ts";
import { StageProxy } from "../../tests/_proxy.ts";
import { serveLocal } from "../../tests/_workers.ts";
import { ALIVE_MS, decodeFrame, Op } from "./frame.ts";
import { FrameWriter, MIN_SILENCE_MS, SilenceWatch } from "./liveness.ts";
import { StageUnavailableError } from "./peer.ts";
import { connectRemoteStage } from "./remote_stage.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A sink that records each frame's op and can hold its writes until released. */
class Sink {
  readonly ops: number[] = [];
  #hold: PromiseWithResolvers<void> | undefined;

  hold(): void {
    this.#hold = Promise.withResolvers();
  }

  release(): void {
    this.#hold?.resolve();
    this.#hold = undefined;
  }

  async write(p: Uint8Array): Promise<number> {
    await this.#hold?.promise;
    this.ops.push(decodeFrame(p, { nEmbd: 0, maxBatch: 1 }).op);
    return p.length;
  }
}

Deno.test("a worker's writer sends ALIVE while it has nothing to say, never between or behind a frame", async () => {
  const sink = new Sink();
  const writer = new FrameWriter(sink);
  try {
    await sleep(ALIVE_MS * 2.3);
    // Every ALIVE_MS (checked each half of it) while idle.
    const alive = sink.ops.filter((op) => op === Op.Alive).length;
    assert.ok(alive >= 2 && alive <= 5, `${alive} ALIVEs in ${ALIVE_MS * 2.3} ms`);
    // A write the client does not take holds back every ALIVE behind it: none piles up.
    sink.hold();
    const pong = writer.send({ op: Op.Pong });
    await sleep(ALIVE_MS * 2.3);
    const before = sink.ops.length;
    sink.release();
    await pong;
    assert.deepEqual(sink.ops.slice(before), [Op.Pong]);
    // Frames sent one after another go out whole, in order.
    await Promise.all([
      writer.send({ op: Op.Pong }),
      writer.send({ op: Op.Saved, slot: 1, idx: 2 }),
    ]);
    assert.deepEqual(sink.ops.slice(-2), [Op.Pong, Op.Saved]);
  } finally {
    await writer.stop();
  }
  const stopped = sink.ops.length;
  await sleep(ALIVE_MS * 1.5);
  assert.equal(sink.ops.length, stopped, "an ALIVE after stop");
});

Deno.test("the silence watch fires after its limit, and not for time its own event loop was held", async () => {
  const silent = Promise.withResolvers<number>();
  const watch = new SilenceWatch(400, silent.resolve);
  try {
    // Heard every 100 ms for 800 ms: no alarm.
    for (let i = 0; i < 8; i++) {
      await sleep(100);
      watch.heard();
    }
    // This side's thread held for 1.5 s (a long synchronous step): frames that came meanwhile
    // are unread, so the watch starts over instead of blaming the worker.
    const held = performance.now();
    while (performance.now() - held < 1500);
    const fired = await Promise.race([silent.promise, sleep(200).then(() => undefined)]);
    assert.equal(fired, undefined, "the watch blamed the worker for this side's stall");
    const t0 = performance.now();
    const ms = await silent.promise;
    assert.ok(ms >= 400, `fired after ${ms} ms of silence`);
    assert.ok(performance.now() - t0 < 1500, "fired late");
  } finally {
    watch.stop();
  }
});

Deno.test("over TCP: ALIVE carries a step past the silence limit; a cut network fails the next within it", async () => {
  const model = await openGguf(await testModel({ arch: "qwen35moe" }));
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: 2048 });
  const proxy = StageProxy.start(worker.address);
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: 2048 });
  // The shortest limit a client may set, three ALIVE intervals: a limit of one interval failed a
  // loaded 2-core run whose worker sent its ALIVE a little late.
  const silenceMs = MIN_SILENCE_MS;
  const remote = await connectRemoteStage(proxy.address, { local: head, model, silenceMs });
  try {
    // A 1600-position step on the worker's two layers outlasts the limit.
    const n = 1600;
    const rows = new Float32Array(n * head.nEmbd).fill(0.01);
    const t0 = performance.now();
    const out = await remote.run(0, { kind: "hidden", rows }, n, 0, { logits: "last" });
    const took = performance.now() - t0;
    assert.equal(out.kind, "ids");
    assert.ok(took > silenceMs, `the step took ${took} ms, not past the limit`);

    proxy.partition();
    const t1 = performance.now();
    const one = new Float32Array(head.nEmbd).fill(0.01);
    const cut = remote.run(0, { kind: "hidden", rows: one }, 1, n, { logits: "last" });
    await assert.rejects(cut, (e) => {
      assert.ok(e instanceof StageUnavailableError);
      assert.match(e.message, /it sent nothing for \d+\.\d s \(--silence-s 1\.5\)/);
      return true;
    });
    const noticed = performance.now() - t1;
    assert.ok(noticed >= silenceMs && noticed < 2 * silenceMs, `failed after ${noticed} ms`);
    proxy.heal();
    // The next call connects afresh (a new epoch) and is served.
    await remote.run(0, { kind: "hidden", rows: one }, 1, 0, { logits: "last" });
    assert.equal(remote.epoch, 2);
  } finally {
    proxy.heal();
    remote.close();
    head.close();
    await proxy.close();
    await worker.stop();
    model.close();
  }
});
