// Tests of stage_server.ts's admission against strangers over loopback TCP: sockets that greet and
// go silent, pre-auth frames that would size a payload, and a crowd of authenticated newcomers.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import { openReferenceStage } from "../../engine/reference/reference_stage.ts";
import { serveLocal } from "../../tests/_workers.ts";
import { testModel } from "../../tests/_models.ts";
import {
  encodeFrame,
  encodeGreeting,
  ErrorCode,
  type Frame,
  GREETING_BYTES,
  HEADER_BYTES,
  MAGIC,
  Op,
} from "./frame.ts";
import { FrameReader, writeAll } from "./frame_stream.ts";
import { freshNonce, importKey, modelFingerprint, NO_PROOF } from "./hello.ts";
import { connectRemoteStage } from "./remote_stage.ts";
import { MAX_HANDSHAKES, serveStage } from "./stage_server.ts";
import { connectPeer, type Peer, StageUnavailableError } from "./peer.ts";
import { readHParams } from "../../engine/hparams.ts";
import type { Stage } from "../../engine/stage.ts";

import { fuzzRuns, fuzzSeed, Random } from "../../tests/_fuzz.ts";

const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
const CTX = 16;
const NO_LIMITS = { nEmbd: 0, maxBatch: 0 };

async function dial(address: string): Promise<Deno.TcpConn> {
  const [hostname, port] = address.split(":");
  return await Deno.connect({ hostname, port: Number(port) });
}

/** Every frame the worker sends until it closes (an ERROR, usually), or the read error. */
async function answers(conn: Deno.Conn): Promise<Frame[]> {
  const reader = new FrameReader(conn);
  const frames: Frame[] = [];
  try {
    for (let f = await reader.readFrame(NO_LIMITS); f; f = await reader.readFrame(NO_LIMITS)) {
      frames.push(f);
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.ConnectionReset)) throw e;
  }
  return frames;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  parts.reduce((at, p) => (out.set(p, at), at + p.length), 0);
  return out;
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Closed by the worker's side already.
  }
}

Deno.test("greeting-only sockets renewed past the handshake places never keep the keyed head out", async () => {
  const key = await importKey(new TextEncoder().encode("a shared key of the chain"), "test");
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, {
    key,
    // Places are held for 250 ms: room for the head's handshake on a loaded 2-core machine.
    handshakeTimeoutMs: 1000,
  });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  let attacking = true;
  let strangers = 0;
  // Each stranger greets and goes silent; when the worker drops it (timeout or a newer
  // stranger), another takes its place at once, so the handshake places stay over-full.
  const stranger = async () => {
    while (attacking) {
      const conn = await dial(worker.address);
      strangers++;
      await writeAll(conn, encodeGreeting(freshNonce(), MAGIC)).catch(() => undefined);
      await answers(conn).catch(() => []);
      closeQuietly(conn);
    }
  };
  const crowd = Array.from({ length: MAX_HANDSHAKES + 16 }, stranger);
  try {
    for (let round = 0; round < 6; round++) {
      const remote = await connectRemoteStage(worker.address, { local: head, model, key });
      const hidden = await head.run(0, { kind: "ids", ids: Uint32Array.of(1 + round, 2) }, 2, 0);
      const out = await remote.run(0, hidden, 2, 0, { topk: 2 });
      assert.equal(out.kind, "ids");
      remote.close();
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(strangers > MAX_HANDSHAKES + 16, `only ${strangers} stranger connections were made`);
  } finally {
    attacking = false;
    await Promise.all(crowd);
    head.close();
    await worker.stop();
  }
});

Deno.test("a newcomer past the handshake places waits until the oldest has held its place long enough", async () => {
  const handshakeTimeoutMs = 2000;
  // A place is held for a quarter of the deadline before a newcomer may take it over.
  const heldMs = handshakeTimeoutMs / 4;
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, {
    handshakeTimeoutMs,
  });
  /** Dials, greets and reads the challenge: a stranger holding a handshake place. */
  const challenged = async () => {
    const conn = await dial(worker.address);
    await writeAll(conn, encodeGreeting(freshNonce(), MAGIC));
    const frame = await new FrameReader(conn).readFrame(NO_LIMITS);
    assert.equal(frame?.op, Op.Challenge);
    return conn;
  };
  const holders: Deno.TcpConn[] = [];
  try {
    const firstHeld = performance.now();
    for (let i = 0; i < MAX_HANDSHAKES; i++) holders.push(await challenged());
    const oldestGone = answers(holders[0]).then(() => performance.now());
    const newcomer = await challenged();
    const admitted = performance.now();
    holders.push(newcomer);
    assert.ok(
      admitted - firstHeld >= heldMs,
      `the newcomer was challenged ${admitted - firstHeld} ms after the oldest, before ${heldMs}`,
    );
    assert.ok((await oldestGone) <= admitted, "the oldest handshake was not the one dropped");
  } finally {
    holders.forEach(closeQuietly);
    await worker.stop();
  }
});

Deno.test("before the proof, a frame other than AUTH is refused from its header alone", async () => {
  const key = await importKey(new TextEncoder().encode("a shared key of the chain"), "test");
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, { key });
  try {
    const conn = await dial(worker.address);
    // A RUN header announcing the largest payload, and no payload: the worker must not wait for it.
    const header = new Uint8Array(HEADER_BYTES);
    const words = new DataView(header.buffer);
    [Op.Run, 0, 0xffff_ffff, 0, 0].forEach((w, i) => words.setUint32(i * 4, w, true));
    await writeAll(conn, encodeGreeting(freshNonce(), MAGIC));
    await writeAll(conn, header);
    const frames = await answers(conn);
    closeQuietly(conn);
    assert.equal(frames[0]?.op, Op.Challenge);
    const last = frames.at(-1);
    assert.ok(last?.op === Op.Error, JSON.stringify(last));
    assert.equal(last.code, ErrorCode.Malformed);
    assert.match(last.message, /it is op Run, expected Auth here/);
  } finally {
    await worker.stop();
  }
});

Deno.test("authenticated newcomers past the waiting places are answered Busy, none dropped", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const holder = await connectRemoteStage(worker.address, { local: head, model });
  try {
    const newcomer = async () => {
      const conn = await dial(worker.address);
      await writeAll(conn, encodeGreeting(freshNonce(), MAGIC));
      await writeAll(conn, encodeFrame({ op: Op.Auth, proof: NO_PROOF }));
      const frames = await answers(conn);
      closeQuietly(conn);
      return frames.at(-1);
    };
    const replies = await Promise.all(Array.from({ length: 20 }, newcomer));
    for (const reply of replies) {
      assert.ok(reply?.op === Op.Error, JSON.stringify(reply));
      assert.equal(reply.code, ErrorCode.Busy);
      assert.match(reply.message, /takes one client at a time/);
    }
  } finally {
    holder.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("seeded mutated greetings and AUTH frames are each refused or dropped; the head still gets in", async () => {
  const key = await importKey(new TextEncoder().encode("a shared key of the chain"), "test");
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, {
    key,
    handshakeTimeoutMs: 300,
  });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const seed = fuzzSeed(0x4e110);
  const r = new Random(seed);
  const greeting = () => encodeGreeting(freshNonce(), MAGIC);
  const auth = encodeFrame({ op: Op.Auth, proof: NO_PROOF });
  const inputs = Array.from({ length: fuzzRuns(300) }, () => {
    switch (r.int(5)) {
      case 0:
        return r.bytes(r.int(80));
      case 1:
        return r.mutate(greeting(), 4);
      case 2:
        return concat(greeting(), r.mutate(auth, HEADER_BYTES));
      case 3:
        return concat(greeting(), r.mutate(auth));
      default:
        return concat(greeting(), auth).subarray(0, r.int(GREETING_BYTES + auth.length));
    }
  });
  try {
    let next = 0;
    const codes = new Set<number>();
    await Promise.all(Array.from({ length: 8 }, async () => {
      while (next < inputs.length) {
        const i = next++;
        const conn = await dial(worker.address);
        await writeAll(conn, inputs[i]).catch(() => undefined);
        const frames = await answers(conn);
        closeQuietly(conn);
        const what = `seed ${seed} input ${i}: ${JSON.stringify(frames)}`;
        // A challenge (for a whole greeting), then at most an ERROR; never a HELLO without the key.
        const rest = frames[0]?.op === Op.Challenge ? frames.slice(1) : frames;
        assert.ok(rest.length <= 1, what);
        if (rest[0]) {
          assert.ok(rest[0].op === Op.Error, what);
          codes.add(rest[0].code);
        }
      }
    }));
    for (
      const code of [ErrorCode.Malformed, ErrorCode.Version, ErrorCode.Auth, ErrorCode.Timeout]
    ) {
      assert.ok(codes.has(code), `code ${code} never seen: ${[...codes]}`);
    }
    const remote = await connectRemoteStage(worker.address, { local: head, model, key });
    const hidden = await head.run(0, { kind: "ids", ids: Uint32Array.of(3, 1) }, 2, 0);
    assert.equal((await remote.run(0, hidden, 2, 0, { topk: 1 })).kind, "ids");
    remote.close();
  } finally {
    head.close();
    await worker.stop();
  }
});

Deno.test("a RUN starts while the one before it still runs; replies keep request order", async () => {
  const hp = readHParams(model.metadata);
  const options = { first: 1, end: hp.nLayer, slots: 2, ctx: CTX };
  const inner = await openReferenceStage(model, options);
  const direct = await openReferenceStage(model, options);
  // Slot 0's run waits for `gate`; `started` records each run as the worker begins it.
  const gate = Promise.withResolvers<void>();
  const started: number[] = [];
  const slot1Started = Promise.withResolvers<void>();
  const stage: Stage = new Proxy(inner, {
    get(target, key) {
      if (key !== "run") return Reflect.get(target, key, target);
      return async (...args: Parameters<Stage["run"]>) => {
        started.push(args[0]);
        if (args[0] === 1) slot1Started.resolve();
        if (args[0] === 0) await gate.promise;
        return await target.run(...args);
      };
    },
  });
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const server = serveStage(listener, { stage, fingerprint: await modelFingerprint(model) });
  const peer = await connectPeer(`127.0.0.1:${(listener.addr as Deno.NetAddr).port}`, undefined);
  try {
    const rows = (seed: number) =>
      Float32Array.from({ length: 2 * hp.D }, (_, i) => Math.sin(seed + i));
    const order: number[] = [];
    const runs = [0, 1].map((slot) =>
      peer.run(slot, rows(slot), 2, 0, { topk: 4 }).then((r) => (order.push(slot), r))
    );
    // Slot 1's run begins while slot 0's is held: the worker read it without waiting.
    const overlapped = await Promise.race([
      slot1Started.promise.then(() => true),
      new Promise<boolean>((r) => setTimeout(() => r(false), 2000)),
    ]);
    gate.resolve();
    const got = await Promise.all(runs);
    assert.ok(overlapped, `runs started in order ${started.join(", ")} only after slot 0's ended`);
    assert.deepEqual(order, [0, 1]);
    for (const slot of [0, 1]) {
      const want = await direct.run(slot, { kind: "hidden", rows: rows(slot) }, 2, 0, { topk: 4 });
      assert.ok(want.kind === "ids");
      assert.deepEqual(got[slot].ids, want.ids);
      assert.deepEqual(got[slot].top, want.top);
    }
  } finally {
    gate.resolve();
    peer.close();
    server.close();
    await server.finished;
    inner.close();
    direct.close();
  }
});

Deno.test("a client lost without a close gives its place to a newcomer; one awaiting a reply keeps it", async () => {
  const hp = readHParams(model.metadata);
  const inner = await openReferenceStage(model, { first: 1, end: hp.nLayer, slots: 1, ctx: CTX });
  // The first run waits for `gate`: a request the worker is still working on.
  const gate = Promise.withResolvers<void>();
  let runs = 0;
  const stage: Stage = new Proxy(inner, {
    get(target, key) {
      if (key !== "run") return Reflect.get(target, key, target);
      return async (...args: Parameters<Stage["run"]>) => {
        if (runs++ === 0) await gate.promise;
        return await target.run(...args);
      };
    },
  });
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const lines: string[] = [];
  const lostClientMs = 200;
  const server = serveStage(listener, {
    stage,
    fingerprint: await modelFingerprint(model),
    lostClientMs,
    log: (line) => lines.push(line),
  });
  const address = `127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
  const rows = Float32Array.from({ length: 2 * hp.D }, (_, i) => Math.cos(i));
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  const first = await connectPeer(address, undefined);
  let second: Peer | undefined;
  try {
    // Silent past the limit while it waits for its reply: its place is kept.
    const reply = first.run(0, rows, 2, 0, {});
    await sleep(2 * lostClientMs);
    const refused = await connectPeer(address, undefined).then(() => undefined, (e) => e);
    assert.ok(refused instanceof StageUnavailableError, `${refused}`);
    assert.equal(refused.code, ErrorCode.Busy);
    gate.resolve();
    await reply;
    // Then silent with nothing outstanding, as a head whose close never crossed a cut network:
    // gone, so the next newcomer is served in its place.
    await sleep(2 * lostClientMs);
    second = await connectPeer(address, undefined);
    assert.match((await first.ended).reason, /it closed the connection/);
    assert.equal((await second.run(0, rows, 2, 0, {})).ids.length, 2);
    assert.ok(
      lines.some((l) =>
        /^dropped \S+: it sent nothing for 0\.\d s with nothing outstanding/.test(l)
      ),
      lines.join("\n"),
    );
  } finally {
    gate.resolve();
    first.close();
    second?.close();
    server.close();
    await server.finished;
    inner.close();
  }
});
