// Tests of the client side over real loopback TCP against in-process stage servers: peer.ts,
// remote_stage.ts and stage_server.ts with reference stages of a tiny generated model.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import { openReferenceStage } from "../../engine/reference/reference_stage.ts";
import { runPipeline } from "../../engine/pipeline.ts";
import type { LogitAdjust, Stage } from "../../engine/stage.ts";
import { serveLocal } from "../../tests/_workers.ts";
import {
  checkEveryCandidates,
  checkLogitPositions,
  checkRewind,
} from "../../tests/_stage_gates.ts";
import { ErrorCode, Op } from "./frame.ts";
import { FrameReader } from "./frame_stream.ts";
import { importKey, modelFingerprint } from "./hello.ts";
import { StageUnavailableError } from "./peer.ts";
import { connectRemoteStage, RemoteStage } from "./remote_stage.ts";
import { testModel } from "../../tests/_models.ts";
import { chainScheduler, complete, completeOnce, greedy } from "../scheduler/complete.ts";
import type { Scheduler } from "../scheduler/scheduler.ts";
import { TextTokenizer } from "../tokenizer/tokenizer.ts";

const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
const fingerprint = await modelFingerprint(model);
const tokenizer = TextTokenizer.fromGguf(model.metadata);
const CTX = 32;

/** Greedy (ignoring end-of-generation ids) with each token's top 4. */
const run = (prompt: number[]) => greedy(prompt, { maxTokens: 5, stopIds: new Set(), nProbs: 4 });

/** A one-slot scheduler over `head` and the rest of the chain behind `remote`. */
function over(head: Stage, remote: RemoteStage): Scheduler {
  return chainScheduler({ local: head, next: remote, tokenizer });
}

/**
 * Greedy ids, top-k and log-probabilities through `scheduler` must equal the single stage's
 * exactly (both return f32 logits and log-sum-exp).
 */
async function assertSameAsWhole(scheduler: Scheduler, prompt: number[]): Promise<void> {
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    const want = await completeOnce({ local: whole, tokenizer }, run(prompt));
    const got = await complete(scheduler, run(prompt));
    assert.equal(got.probs.length, 5);
    assert.deepEqual(got, want);
  } finally {
    whole.close();
  }
}

/**
 * Only odd ids, token 3 raised, tokens 5 and 7 penalised: logit adjustments as a grammar and a
 * sampler's bias and repetition penalties send them.
 */
const ADJUST: LogitAdjust = {
  mask: new Uint32Array(8).fill(0xaaaa_aaaa),
  bias: [
    { id: 3, bias: 9 },
    { id: 5, bias: 0, repeat: 1.5, subtract: 0.25 },
    { id: 7, bias: 0.5, repeat: 2, subtract: -1 },
  ],
};

/** A forward pass of `stages` on `slot` with logit adjustments must equal the single stage's. */
async function assertAdjustedSameAsWhole(
  stages: readonly Stage[],
  prompt: number[],
  slot: number,
): Promise<void> {
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    const ids = Uint32Array.from(prompt);
    const wantAdjusted = await runPipeline([whole], 0, ids, 0, { topk: 6, adjust: ADJUST });
    const gotAdjusted = await runPipeline(stages, slot, ids, 0, { topk: 6, adjust: ADJUST });
    assert.deepEqual(gotAdjusted, wantAdjusted);
    assert.ok(Number.isFinite(gotAdjusted.lse));
    assert.equal(gotAdjusted.top[0].id, 3, "the bias lifts token 3 to the top");
    for (const t of gotAdjusted.top) assert.equal(t.id % 2, 1, `token ${t.id} is masked`);
  } finally {
    whole.close();
  }
}

/** Both checks on slot 0 of `head` and the chain behind `remote`. */
async function assertChainSameAsWhole(
  head: Stage,
  remote: RemoteStage,
  prompt: number[],
): Promise<void> {
  await assertSameAsWhole(over(head, remote), prompt);
  await assertAdjustedSameAsWhole([head, remote], prompt, 0);
}

Deno.test("a chain over the wire gives the whole model's ids and top-k, slots interleaved", async () => {
  // max batch 3 at the worker: the 7-token prompt crosses the wire in three frames.
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 2, ctx: CTX, maxBatch: 3 });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 2, ctx: CTX });
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  // Two slots: the two sequences run on slots 1 and 0 at once.
  const scheduler = chainScheduler({ local: head, next: remote, tokenizer, slots: 2 });
  try {
    await Promise.all([
      assertSameAsWhole(scheduler, [3, 14, 15, 92, 65, 35, 89]),
      assertSameAsWhole(scheduler, [27, 18, 28]),
    ]);
    await Promise.all([
      assertAdjustedSameAsWhole([head, remote], [3, 14, 15, 92, 65, 35, 89], 0),
      assertAdjustedSameAsWhole([head, remote], [27, 18, 28], 1),
    ]);
    assert.equal(remote.epoch, 1);
  } finally {
    await scheduler.close();
    remote.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("a chain over the wire returns the last position's logits alone, or none, as asked", async () => {
  // max batch 3 at the worker: a chunk of 7 crosses in three frames, the first two without logits.
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX, maxBatch: 3 });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  try {
    await checkLogitPositions(
      [head, remote],
      0,
      Uint32Array.of(3, 14, 15, 92, 65, 35, 89, 7, 9),
      7,
      3,
    );
    // The remote stage refuses it as a local one does, before a frame is sent.
    const rows = new Float32Array(head.nEmbd);
    await assert.rejects(
      () => remote.run(0, { kind: "hidden", rows }, 1, 0, { logits: "none", topk: 2 }),
      /logits "none": it computes no logits/,
    );
  } finally {
    remote.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("rewindable runs and rewinds reach every stage of a three-stage chain; a worker keeping fewer positions is refused", async () => {
  const rewind = { slots: 1, ctx: CTX, maxRewind: 4 };
  const last = await serveLocal(model, { first: 3, end: 4, ...rewind });
  const middleStage = await openReferenceStage(model, { first: 1, end: 3, ...rewind });
  const toLast = new RemoteStage(last.address, {
    first: 3,
    nLayer: 4,
    nEmbd: middleStage.nEmbd,
    snapshots: 0,
    ...rewind,
    fingerprint,
  });
  middleStage.close();
  const middle = await serveLocal(model, { first: 1, end: 3, ...rewind }, { next: toLast });
  const head = await openReferenceStage(model, { first: 0, end: 1, ...rewind });
  const remote = await connectRemoteStage(middle.address, { local: head, model });
  const greedier = await openReferenceStage(model, { first: 0, end: 1, ...rewind, maxRewind: 5 });
  try {
    await checkRewind([head, remote], 0, Uint32Array.of(11, 12, 13, 14, 15), 3, 6);
    await checkEveryCandidates([head, remote], 0, Uint32Array.of(11, 12, 13, 14, 15));
    // The worker takes one client at a time.
    remote.disconnect();
    await assert.rejects(
      () => connectRemoteStage(middle.address, { local: greedier, model }),
      /it keeps 4 positions to rewind, this stage verifies up to 5; start it with --rewind 5 or more/,
    );
  } finally {
    greedier.close();
    remote.close();
    head.close();
    await middle.stop();
    await last.stop();
  }
});

Deno.test("save and restore reach every stage of a three-stage chain", async () => {
  const last = await serveLocal(model, { first: 3, end: 4, slots: 1, ctx: CTX, snapshots: 2 });
  const middleStage = await openReferenceStage(model, { first: 1, end: 3, slots: 1, ctx: CTX });
  const toLast = new RemoteStage(last.address, {
    first: 3,
    nLayer: 4,
    nEmbd: middleStage.nEmbd,
    slots: 1,
    ctx: CTX,
    snapshots: 2,
    maxRewind: 0,
    fingerprint,
  });
  middleStage.close();
  const middle = await serveLocal(model, { first: 1, end: 3, slots: 1, ctx: CTX, snapshots: 2 }, {
    next: toLast,
  });
  const head = await openReferenceStage(model, {
    first: 0,
    end: 1,
    slots: 1,
    ctx: CTX,
    snapshots: 2,
    maxRewind: 0,
  });
  const remote = await connectRemoteStage(middle.address, { local: head, model });
  const stages = [head, remote];
  const scheduler = chainScheduler({ local: head, next: remote, tokenizer });
  try {
    assert.equal((await remote.connect()).snapshots, 2);
    await assertSameAsWhole(scheduler, [5, 6, 7, 8]);
    await assertAdjustedSameAsWhole(stages, [5, 6, 7, 8], 0);
    const prompt = [40, 41, 42, 43, 44];
    // Slot 0 holds the prompt after this (one generated token, not yet fed back).
    const first = await complete(scheduler, greedy(prompt, { maxTokens: 1 }));
    for (const s of stages) await s.save(0, 1);
    const step = async (id: number, pos: number) => {
      const hidden = await head.run(0, { kind: "ids", ids: Uint32Array.of(id) }, 1, pos);
      const out = await remote.run(0, hidden, 1, pos);
      return out.kind === "ids" ? out.ids[0] : -1;
    };
    const firstPass = [await step(first.ids[0], 5), await step(7, 6)];
    assert.deepEqual(await Promise.all(stages.map((s) => s.restore(0, 1))), [5, 5]);
    assert.deepEqual([await step(first.ids[0], 5), await step(7, 6)], firstPass);
    // The snapshot holds the state after the prompt, so the restored run is the whole model's.
    const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
    const ids = Uint32Array.from([...prompt, first.ids[0], 7]);
    const out = await whole.run(0, { kind: "ids", ids }, ids.length, 0);
    whole.close();
    assert.deepEqual(out.kind === "ids" ? [...out.ids.subarray(5)] : [], firstPass);
  } finally {
    remote.close();
    head.close();
    await middle.stop();
    await last.stop();
  }
});

Deno.test("a middle stage whose next hop has fewer snapshot places fails the hello", async () => {
  const head = await openReferenceStage(model, { first: 0, end: 1, slots: 1, ctx: CTX });
  const last = await serveLocal(model, { first: 3, end: 4, slots: 1, ctx: CTX, snapshots: 1 });
  const toLast = new RemoteStage(last.address, {
    first: 3,
    nLayer: 4,
    nEmbd: head.nEmbd,
    slots: 1,
    ctx: CTX,
    snapshots: 2,
    maxRewind: 0,
    fingerprint,
  });
  const middle = await serveLocal(model, { first: 1, end: 3, slots: 1, ctx: CTX, snapshots: 2 }, {
    next: toLast,
  });
  try {
    const e = await connectRemoteStage(middle.address, { local: head, model })
      .then(() => undefined, (e) => e);
    assert.ok(e instanceof StageUnavailableError, `expected a refusal, got ${e}`);
    assert.equal(e.code, ErrorCode.Downstream);
    assert.match(
      e.reason,
      new RegExp(`${last.address}: it has 1 snapshot places, this stage uses 2; start it with`),
    );
  } finally {
    head.close();
    await middle.stop();
    await last.stop();
  }
});

Deno.test("PING crosses a chain without touching any slot; a dead hop behind it fails it", async () => {
  const head = await openReferenceStage(model, { first: 0, end: 1, slots: 1, ctx: CTX });
  const chain = {
    nLayer: 4,
    nEmbd: head.nEmbd,
    slots: 1,
    ctx: CTX,
    snapshots: 0,
    maxRewind: 0,
    fingerprint,
  };
  const last = await serveLocal(model, { first: 3, end: 4, slots: 1, ctx: CTX });
  const middle = await serveLocal(model, { first: 1, end: 3, slots: 1, ctx: CTX }, {
    next: new RemoteStage(last.address, { ...chain, first: 3 }),
  });
  const remote = new RemoteStage(middle.address, { ...chain, first: 1 });
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    await remote.ping(); // Connects on first use, like a run.
    assert.equal(remote.epoch, 1);
    const prompt = Uint32Array.of(9, 8, 7, 6);
    const part = async (ids: Uint32Array, base: number) =>
      await remote.run(0, await head.run(0, { kind: "ids", ids }, ids.length, base), 2, base);
    await part(prompt.subarray(0, 2), 0);
    await remote.ping();
    // The slot continues at base 2 on every stage, as if no PING had been sent.
    const got = await part(prompt.subarray(2), 2);
    const want = await whole.run(0, { kind: "ids", ids: prompt }, 4, 0);
    assert.ok(got.kind === "ids" && want.kind === "ids");
    assert.deepEqual([...got.ids], [...want.ids.subarray(2)]);
    assert.equal(remote.epoch, 1);

    await last.stop();
    const e = await remote.ping().then(() => undefined, (e) => e);
    assert.ok(e instanceof StageUnavailableError, `expected a refusal, got ${e}`);
    assert.equal(e.code, ErrorCode.Downstream);
    assert.equal(e.address, middle.address);
    assert.match(e.reason, new RegExp(`^Cannot use the stage at ${last.address}: `));
  } finally {
    whole.close();
    remote.close();
    head.close();
    await middle.stop();
    await last.stop();
  }
});

Deno.test("keys: the right key connects, a wrong or missing one fails with its reason", async () => {
  const key = await importKey(new TextEncoder().encode("correct horse battery staple"), "a");
  const wrong = await importKey(new TextEncoder().encode("incorrect horse battery staple"), "b");
  const keyed = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, { key });
  const open = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  try {
    const good = await connectRemoteStage(keyed.address, { local: head, model, key });
    await assertChainSameAsWhole(head, good, [1, 2, 3]);
    good.close();
    const refusal = await connectRemoteStage(keyed.address, { local: head, model, key: wrong })
      .then(() => undefined, (e) => e);
    assert.ok(refusal instanceof StageUnavailableError);
    assert.equal(refusal.code, ErrorCode.Auth);
    assert.match(refusal.message, /its key proof does not match this worker's key/);
    await assert.rejects(
      connectRemoteStage(keyed.address, { local: head, model }),
      /it requires a shared key; pass --key-file/,
    );
    await assert.rejects(
      connectRemoteStage(open.address, { local: head, model, key }),
      /it checks no key \(it runs without --key-file\) but this side has one/,
    );
  } finally {
    head.close();
    await keyed.stop();
    await open.stop();
  }
});

Deno.test("a second client is refused as busy until the first one leaves", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  try {
    const first = await connectRemoteStage(worker.address, { local: head, model });
    const busy = await connectRemoteStage(worker.address, { local: head, model })
      .then(() => undefined, (e) => e);
    assert.ok(busy instanceof StageUnavailableError);
    assert.equal(busy.code, ErrorCode.Busy);
    assert.match(busy.message, /takes one client at a time/);
    // Connecting right after a close must not race the worker winding the first client down.
    first.close();
    const second = await connectRemoteStage(worker.address, { local: head, model });
    await assertChainSameAsWhole(head, second, [9, 8, 7]);
    second.close();
  } finally {
    head.close();
    await worker.stop();
  }
});

Deno.test("a new connection is a new epoch: older sequences and snapshots are refused", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX, snapshots: 1 });
  const head = await openReferenceStage(model, {
    first: 0,
    end: 2,
    slots: 1,
    ctx: CTX,
    snapshots: 1,
  });
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  try {
    const hidden = await head.run(0, { kind: "ids", ids: Uint32Array.of(1, 2) }, 2, 0);
    await remote.run(0, hidden, 2, 0);
    await remote.save(0, 0);
    remote.disconnect();
    const next = await head.run(0, { kind: "ids", ids: Uint32Array.of(3) }, 1, 2);
    await assert.rejects(
      remote.run(0, next, 1, 2),
      /slot 0's sequence was lost when the connection/,
    );
    await assert.rejects(remote.restore(0, 0), /snapshot 0 was lost when the connection/);
    assert.equal(remote.epoch, 2);
    // Refused here, the stale requests never reached the worker: the connection is still good.
    await assertChainSameAsWhole(head, remote, [1, 2, 3]);
    assert.equal(remote.epoch, 2);
  } finally {
    remote.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("a client that stalls in the hello is refused with a timeout; the next one is served", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX }, {
    handshakeTimeoutMs: 200,
  });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const [hostname, port] = worker.address.split(":");
  const stalled = await Deno.connect({ hostname, port: Number(port) });
  try {
    const reader = new FrameReader(stalled);
    const refusal = await reader.readFrame({ nEmbd: 0, maxBatch: 0 });
    assert.ok(refusal?.op === Op.Error, JSON.stringify(refusal));
    assert.equal(refusal.code, ErrorCode.Timeout);
    assert.match(refusal.message, /no hello within 200 ms/);
    assert.equal(await reader.readFrame({ nEmbd: 0, maxBatch: 0 }), null);
    const remote = await connectRemoteStage(worker.address, { local: head, model });
    await assertChainSameAsWhole(head, remote, [2, 4, 6]);
    remote.close();
  } finally {
    stalled.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("an idle connection sees the worker go at once; this side's own close is no loss", async () => {
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  const losses: StageUnavailableError[] = [];
  remote.onLost((e) => losses.push(e));
  try {
    // This side disconnecting, and then closing, loses nothing.
    remote.disconnect();
    await remote.ping();
    assert.equal(remote.epoch, 2);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(losses.length, 0);
    // Nothing is pending, yet the worker's close is seen without a request.
    const t0 = performance.now();
    await worker.stop();
    while (losses.length === 0 && performance.now() - t0 < 1000) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(losses.length, 1, "the worker's close went unnoticed");
    assert.equal(losses[0].reason, "it closed the connection");
    await assert.rejects(remote.ping(), /cannot connect/);
  } finally {
    remote.close();
    head.close();
    await worker.stop();
  }
});
