// The scheduler on real stages: split-driver overlap against a worker process, cancellation in
// prefill, queued sequences equal to their solo runs, prompt chunks that shrink to a step budget.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type {
  LastOutput,
  Stage,
  StageInput,
  StageOutput,
  StageRunOptions,
} from "../engine/stage.ts";
import { StageLink } from "../lib/scheduler/link.ts";
import {
  MIN_SHARED_CHUNK,
  OverloadedError,
  Scheduler,
  sharedChunk,
} from "../lib/scheduler/scheduler.ts";
import type { SequenceEvent, SequenceRequest } from "../lib/scheduler/sequence.ts";
import { tinyModel } from "./_head.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFingerprint } from "../lib/wire/hello.ts";
import { remoteStageAfter } from "../lib/wire/remote_stage.ts";
import { startWorker } from "./_workers.ts";

interface Span {
  readonly slot: number;
  readonly n: number;
  readonly start: number;
  readonly end: number;
}

/** A stage that records when each run starts and ends, and can act before a run. */
class RecordingStage implements Stage {
  readonly spans: Span[] = [];
  beforeRun: ((slot: number, base: number) => void) | undefined;
  /** How long each run waits after its work, as a GPU stage waits for its step to finish. */
  waitMs = 0;
  /** And how long more for each of its positions. */
  waitMsPerPosition = 0;
  constructor(readonly inner: Stage) {}
  get first() {
    return this.inner.first;
  }
  get end() {
    return this.inner.end;
  }
  get nLayer() {
    return this.inner.nLayer;
  }
  get nEmbd() {
    return this.inner.nEmbd;
  }
  get slots() {
    return this.inner.slots;
  }
  get ctx() {
    return this.inner.ctx;
  }
  get maxBatch() {
    return this.inner.maxBatch;
  }
  get snapshots() {
    return this.inner.snapshots;
  }
  get maxRewind() {
    return this.inner.maxRewind;
  }
  async run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options?: StageRunOptions,
  ): Promise<StageOutput> {
    this.beforeRun?.(slot, base);
    const start = performance.now();
    const out = await this.inner.run(slot, input, n, base, options);
    const wait = this.waitMs + this.waitMsPerPosition * n;
    if (wait) await new Promise((r) => setTimeout(r, wait));
    this.spans.push({ slot, n, start, end: performance.now() });
    return out;
  }
  save(slot: number, idx: number) {
    return this.inner.save(slot, idx);
  }
  restore(slot: number, idx: number) {
    return this.inner.restore(slot, idx);
  }
  rewind(slot: number, pos: number) {
    return this.inner.rewind(slot, pos);
  }
  close() {
    this.inner.close();
  }
}

/** A StageLink that records each remote round trip. */
class RecordingLink extends StageLink {
  readonly spans: Span[] = [];
  override async run(
    slot: number,
    rows: Float32Array,
    n: number,
    base: number,
    options: StageRunOptions,
  ): Promise<LastOutput> {
    const start = performance.now();
    const out = await super.run(slot, rows, n, base, options);
    this.spans.push({ slot, n, start, end: performance.now() });
    return out;
  }
}

const modelPath = await tinyModel();

function request(prompt: number[], maxTokens: number): SequenceRequest {
  return {
    prompt,
    maxTokens,
    sampling: { temperature: 0, topK: 40, topP: 1, seed: 1n },
  };
}

/** The ids a sequence generated, and how it ended (undefined: closed without an end). */
async function drain(events: ReadableStream<SequenceEvent>) {
  const ids: number[] = [];
  let end: string | undefined;
  for await (const e of events) {
    if (e.type === "token") ids.push(e.id);
    if (e.type === "end") end = e.reason;
    if (e.type === "error") throw e.error;
  }
  return { ids, end };
}

Deno.test("split driver: one slot's local layers run while the other's frame is on the worker", async () => {
  const model = await openGguf(modelPath);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const worker = await startWorker({
    model: modelPath,
    layers: "2:4",
    slots: 2,
    ctx: 128,
    extra: ["--backend", "reference"],
  });
  const local = new RecordingStage(
    await openReferenceStage(model, { first: 0, end: 2, slots: 2, ctx: 128 }),
  );
  const link = new RecordingLink(
    remoteStageAfter(worker.address, local, await modelFingerprint(model)),
  );
  const scheduler = new Scheduler({ local, link, tokenizer, slots: 2, queue: 0, snapshots: 0 });
  try {
    const prompts = [tokenizer.encode("The river runs"), tokenizer.encode("Seven small stones")];
    const solo = [];
    for (const p of prompts) {
      solo.push((await drain((await scheduler.admit(request(p, 30))).events)).ids);
    }
    local.spans.length = 0;
    link.spans.length = 0;
    const both = await Promise.all(
      prompts.map(async (p) => (await drain((await scheduler.admit(request(p, 30))).events)).ids),
    );
    assert.deepEqual(both, solo);
    const steps = local.spans.filter((s) => s.n === 1);
    const overlapped = steps.filter((s) =>
      link.spans.some((r) => r.slot !== s.slot && r.start < s.end && s.start < r.end)
    );
    // Nearly every step of one slot should run while the other's round trip is out (a serial
    // driver gives none); half is a margin for a busy machine. Overlapping, not contained: on a
    // loaded 2-core box a step starting a moment before the other's frame left counted as serial
    // (28 of 58 once, in the full suite).
    assert.ok(
      overlapped.length >= steps.length / 2,
      `${overlapped.length} of ${steps.length} local steps overlapped a remote round trip`,
    );
  } finally {
    await scheduler.close();
    link.close();
    local.close();
    model.close();
    await worker.stop();
  }
});

Deno.test("the lane starts one slot's step while another's still waits on its stage", async () => {
  const model = await openGguf(modelPath);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const local = new RecordingStage(
    await openReferenceStage(model, { first: 0, end: 4, slots: 2, ctx: 128 }),
  );
  const scheduler = new Scheduler({ local, tokenizer, slots: 2, queue: 0, snapshots: 0 });
  try {
    const prompts = [tokenizer.encode("The river runs"), tokenizer.encode("Seven small stones")];
    const sampled = (p: number[]) => ({
      ...request(p, 12),
      sampling: { temperature: 0.8, topK: 40, topP: 0.9, seed: 7n },
    });
    const solo = [];
    for (const p of prompts) {
      solo.push((await drain((await scheduler.admit(sampled(p))).events)).ids);
    }
    local.spans.length = 0;
    local.waitMs = 15;
    const both = await Promise.all(
      prompts.map(async (p) => (await drain((await scheduler.admit(sampled(p))).events)).ids),
    );
    assert.deepEqual(both, solo);
    // A lane that held each job until its wait ended would give no two slots' runs in common.
    const steps = local.spans.filter((s) => s.n === 1);
    const overlapped = steps.filter((s) =>
      local.spans.some((o) => o.slot !== s.slot && o.start < s.end && s.start < o.end)
    );
    assert.ok(
      overlapped.length >= steps.length / 2,
      `${overlapped.length} of ${steps.length} steps overlapped the other slot's`,
    );
  } finally {
    await scheduler.close();
    local.close();
    model.close();
  }
});

Deno.test("cancelling in prefill stops before the next chunk and frees the slot", async () => {
  const model = await openGguf(modelPath);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const local = new RecordingStage(
    await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: 128, maxBatch: 4 }),
  );
  const scheduler = new Scheduler({ local, tokenizer, slots: 1, queue: 1, snapshots: 0 });
  try {
    const prompt = tokenizer.encode("word ".repeat(20));
    assert.ok(prompt.length >= 20);
    const seq = await scheduler.admit(request(prompt, 5));
    let runs = 0;
    local.beforeRun = () => {
      if (++runs === 2) seq.cancel();
    };
    const result = await drain(seq.events);
    assert.equal(result.end, undefined);
    assert.deepEqual(result.ids, []);
    while (scheduler.busy) await new Promise((r) => setTimeout(r, 5));
    assert.equal(local.spans.length, 2, "the chunk in flight finished, no later one started");
    assert.equal(scheduler.stats.sequences.cancelled, 1);
    local.beforeRun = undefined;

    // The slot is free again, and a queued sequence that is cancelled never runs.
    const next = await scheduler.admit(request(tokenizer.encode("Hello"), 3));
    const queued = await scheduler.admit(request(tokenizer.encode("Bye"), 3));
    await assert.rejects(
      scheduler.admit(request(tokenizer.encode("Too many"), 3)),
      OverloadedError,
    );
    queued.cancel();
    const done = await drain(next.events);
    assert.equal(done.end, "max_tokens");
    assert.equal(done.ids.length, 3);
    assert.equal(scheduler.queued, 0);
    assert.equal(scheduler.stats.sequences.cancelled, 2);
  } finally {
    await scheduler.close();
    local.close();
    model.close();
  }
});

Deno.test("sequences queued behind busy slots run in turn and match their solo runs", async () => {
  const model = await openGguf(modelPath);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 2, ctx: 96 });
  const scheduler = new Scheduler({ local: stage, tokenizer, slots: 2, queue: 2, snapshots: 0 });
  try {
    const prompts = ["One fish", "Two birds sing", "Three", "Four quiet trees"].map((t) =>
      tokenizer.encode(t)
    );
    const solo = [];
    for (const p of prompts) {
      solo.push((await drain((await scheduler.admit(request(p, 12))).events)).ids);
    }
    const seqs = [];
    for (const p of prompts) seqs.push(await scheduler.admit(request(p, 12)));
    assert.equal(scheduler.busy + scheduler.queued, 4);
    const all = await Promise.all(seqs.map(async (s) => (await drain(s.events)).ids));
    assert.deepEqual(all, solo);
    assert.ok(
      new Set(solo.map((ids) => ids.join())).size > 1,
      "distinct prompts, distinct replies",
    );
  } finally {
    await scheduler.close();
    stage.close();
    model.close();
  }
});

Deno.test("sharedChunk() fits a step budget at the measured cost and settles where the step takes it", () => {
  assert.equal(sharedChunk(256, 80), 256, "no cost measured yet: the most");
  assert.equal(sharedChunk(256, 0, 10), 256, "no budget: the most");
  assert.equal(sharedChunk(256, 80, 0.5), 160);
  assert.equal(sharedChunk(256, 80, 0.1), 256, "never past the most");
  assert.equal(sharedChunk(256, 80, 40), MIN_SHARED_CHUNK, "never under MIN_SHARED_CHUNK");
  assert.equal(sharedChunk(8, 80, 40), 8, "nor past a most below it");
  // A step of n positions at 1 ms each beside 20 ms of other rows: the cost a position measured
  // includes those 20 ms, and the chunk still settles where the whole step takes 80 ms.
  let n = 256;
  for (let i = 0; i < 12; i++) n = sharedChunk(256, 80, (20 + n) / n);
  assert.ok(Math.abs(n - 60) <= 1, `settled at ${n} positions, expected ~60`);
});

Deno.test("a prompt beside a generating sequence runs chunks that fit the step budget, its tokens as alone", async () => {
  const model = await openGguf(modelPath);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const inner = await openReferenceStage(model, { first: 0, end: 4, slots: 2, ctx: 256 });
  const local = new RecordingStage(inner);
  const prompt = tokenizer.encode("word ".repeat(150));
  assert.ok(prompt.length >= 150);
  const alone = new Scheduler({ local: inner, tokenizer, slots: 1, queue: 0, snapshots: 0 });
  let solo: number[];
  try {
    solo = (await drain((await alone.admit(request(prompt, 3))).events)).ids;
  } finally {
    await alone.close();
  }
  // 2 ms a position: a chunk of --prefill-chunk 64 would take ~130 ms, past the 40 ms budget.
  local.waitMsPerPosition = 2;
  const scheduler = new Scheduler({
    local,
    tokenizer,
    slots: 2,
    queue: 0,
    snapshots: 0,
    prefillChunk: 64,
    prefillStepMs: 40,
  });
  try {
    const streaming = await scheduler.admit(request(tokenizer.encode("Hello"), 60));
    const reader = streaming.events.getReader();
    while ((await reader.read()).value?.type !== "token");
    const long = await scheduler.admit(request(prompt, 3));
    const { ids } = await drain(long.events);
    assert.deepEqual(ids, solo, "the chunked prompt's tokens are its tokens alone");
    // Even the first: the other sequence's prompt already cost ~2 ms a position.
    const chunks = local.spans.filter((s) => s.slot === 1 && s.n > 1).map((s) => s.n);
    assert.ok(chunks.length >= 5, `the prompt ran in short chunks: ${chunks.join(" ")}`);
    assert.ok(
      chunks.slice(0, -1).every((n) => n >= MIN_SHARED_CHUNK && n <= 32),
      `its chunks fit 40 ms at ~2 ms a position: ${chunks.join(" ")}`,
    );
    streaming.cancel();
  } finally {
    await scheduler.close();
    local.close();
    model.close();
  }
});
