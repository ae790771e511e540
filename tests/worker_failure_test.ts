// Worker processes dying mid-generation: the client gets an error within a second, a restarted
// worker serves the next sequence, and a middle worker reports its dead next stage and reconnects.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { startWorker } from "./_workers.ts";
import { ErrorCode } from "../lib/wire/frame.ts";
import { StageUnavailableError } from "../lib/wire/peer.ts";
import { connectRemoteStage, type RemoteStage } from "../lib/wire/remote_stage.ts";
import { chainScheduler, complete, completeOnce, greedy } from "../lib/scheduler/complete.ts";
import type { Scheduler } from "../lib/scheduler/scheduler.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { testModel } from "./_models.ts";

const path = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
const CTX = 32;
const PROMPT = [11, 12, 13, 14];
/** Greedy, ignoring end-of-generation ids. */
const run = (n: number) => greedy(PROMPT, { maxTokens: n, stopIds: new Set() });

async function wholeIds(model: GgufModel): Promise<number[]> {
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    const tokenizer = TextTokenizer.fromGguf(model.metadata);
    return (await completeOnce({ local: whole, tokenizer }, run(4))).ids;
  } finally {
    whole.close();
  }
}

/** One slot over `head` and `remote`, whose link the caller closes. */
function schedule(model: GgufModel, head: Stage, remote: RemoteStage): Scheduler {
  return chainScheduler({
    local: head,
    next: remote,
    tokenizer: TextTokenizer.fromGguf(model.metadata),
  });
}

/**
 * Prefills PROMPT and decodes a few tokens through the scheduler (on slot 0), then starts one
 * more step by hand and kills `victim`.
 */
async function killMidGeneration(
  scheduler: Scheduler,
  head: Stage,
  remote: RemoteStage,
  victim: Deno.ChildProcess,
): Promise<{ error: unknown; ms: number }> {
  const { ids } = await complete(scheduler, run(3));
  const pos = PROMPT.length + 2;
  const hidden = await head.run(0, { kind: "ids", ids: Uint32Array.of(ids[2]) }, 1, pos);
  const step = remote.run(0, hidden, 1, pos);
  const t0 = performance.now();
  victim.kill("SIGKILL");
  const error = await step.then(() => undefined, (e) => e);
  return { error, ms: performance.now() - t0 };
}

Deno.test("a killed worker fails the client within a second; a restarted one serves", async () => {
  const model = await openGguf(path);
  const expected = await wholeIds(model);
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
  const worker = await startWorker({ model: path, layers: "2:4", ctx: CTX });
  const port = Number(worker.address.split(":")[1]);
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  const scheduler = schedule(model, head, remote);
  let restarted;
  try {
    const { error, ms } = await killMidGeneration(scheduler, head, remote, worker.child);
    await worker.stop();
    assert.ok(error instanceof StageUnavailableError, `${error}`);
    assert.ok(ms < 1000, `the error took ${ms.toFixed(0)} ms`);
    // The dead connection is gone for good; the next sequence reconnects to the new process.
    restarted = await startWorker({ model: path, layers: "2:4", ctx: CTX, port });
    assert.deepEqual((await complete(scheduler, run(4))).ids, expected);
    assert.equal(remote.epoch, 2);
  } finally {
    await scheduler.close();
    scheduler.link?.close();
    head.close();
    model.close();
    await worker.stop();
    await restarted?.stop();
  }
});

Deno.test("a middle worker reports its dead next stage and reconnects after a restart", async () => {
  const model = await openGguf(path);
  const expected = await wholeIds(model);
  const head = await openReferenceStage(model, { first: 0, end: 1, slots: 1, ctx: CTX });
  const last = await startWorker({ model: path, layers: "3:4", ctx: CTX });
  const port = Number(last.address.split(":")[1]);
  const middle = await startWorker({ model: path, layers: "1:3", ctx: CTX, next: last.address });
  const remote = await connectRemoteStage(middle.address, { local: head, model });
  const scheduler = schedule(model, head, remote);
  let restarted;
  try {
    const { error, ms } = await killMidGeneration(scheduler, head, remote, last.child);
    await last.stop();
    assert.ok(error instanceof StageUnavailableError, `${error}`);
    assert.equal(error.code, ErrorCode.Downstream);
    assert.equal(error.address, middle.address);
    assert.match(error.reason, new RegExp(`^Cannot use the stage at ${last.address}: `));
    assert.ok(ms < 1000, `the error took ${ms.toFixed(0)} ms`);
    // While the last stage is down, the middle one refuses the hello with the reason.
    const down = await complete(scheduler, run(1)).then(() => 0, (e) => e);
    assert.match(`${down}`, /cannot connect: Connection refused/);
    restarted = await startWorker({ model: path, layers: "3:4", ctx: CTX, port });
    assert.deepEqual((await complete(scheduler, run(4))).ids, expected);
  } finally {
    await scheduler.close();
    scheduler.link?.close();
    head.close();
    model.close();
    await middle.stop();
    await last.stop();
    await restarted?.stop();
  }
});
