// Sequences on the head: bounded admission, slots, prefix cache, and the split driver that runs
// each slot's steps through the local stage and then the rest of the chain.
//
// Every active slot runs its own loop: local layers (started one at a time, through `Lane`) →
// remote layers (frames pipelined on the one connection) → sample → next step. While slot A's
// frame is on the worker, slot B takes the lane for its local layers, so with two or more active
// slots neither the head nor the worker waits for the other's round trip.
//
// A sequence that loses its next stage (the worker died, restarted, or the connection broke)
// waits for the stage to answer again, replays its prompt and the tokens it generated so far on
// every stage, and carries on with its sampler where it was: the client sees no difference.

import { ErrorCode } from "../wire/frame.ts";
import { StageUnavailableError } from "../wire/peer.ts";
import {
  type FusedOptions,
  type LastOutput,
  MAX_TOPK,
  type Stage,
  type StageRunOptions,
} from "../../engine/stage.ts";
import { checkChainLink, checkFirstStage, checkRows } from "../../engine/stage_checks.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import {
  type Drafter,
  DraftGate,
  type DraftMode,
  DraftRecord,
  draftsOf,
  lookupDraft,
} from "./draft.ts";
import type { StageLink } from "./link.ts";
import { PrefixCache } from "./prefix_cache.ts";
import { CancelledError, type Candidates, Sequence, type SequenceRequest } from "./sequence.ts";
import { SchedulerStats, StageTimes } from "./stats.ts";

export interface SchedulerOptions {
  /** Layers [0, k) in this process: the whole model when `link` is absent. */
  readonly local: Stage;
  /** Layers [k, n) behind a worker. */
  readonly link?: StageLink;
  readonly tokenizer: TextTokenizer;
  /** Sequences run at once (at most the stages' slots). */
  readonly slots: number;
  /** Admitted sequences that may wait for a slot; more are refused as overloaded. */
  readonly queue: number;
  /** Snapshot places the prefix cache may use on every stage; 0 turns the cache off. */
  readonly snapshots: number;
  /**
   * How long a sequence that lost its next stage waits for it to answer again before it ends
   * with an error, ms (it then resumes where it was). 0 still tries one new connection at once.
   * Default 30 000.
   */
  readonly restartGraceMs?: number;
  /**
   * Most prompt positions a sequence runs in one step while other sequences generate: its chunks
   * share steps with their tokens, and a shorter chunk holds their next tokens back less.
   * Default DEFAULT_PREFILL_CHUNK; a sequence alone runs chunks of the stages' maxBatch.
   */
  readonly prefillChunk?: number;
  /**
   * How long a step holding a sequence's prompt chunk may take while other sequences generate,
   * ms: each chunk takes the positions that fit, at what its last chunk (before its first: any
   * sequence's last) cost a position, between MIN_SHARED_CHUNK and prefillChunk. Deep in a long
   * prompt a position costs more (attention over all before it), so its chunks shrink and the
   * others' tokens keep coming. Default DEFAULT_PREFILL_STEP_MS; 0: chunks of prefillChunk
   * whatever they cost.
   */
  readonly prefillStepMs?: number;
  /**
   * Speculative decoding of sequences without grammar, logprobs or logit changes, greedy or
   * sampled (lib/scheduler/draft.ts): "off" (default), "auto"
   * (AUTO_DRAFTS a step while they pay and the sequence runs alone) or that many drafts a step,
   * each verified in one rewindable run; every stage must keep drafts + 1 positions to rewind.
   */
  readonly draft?: DraftMode;
  /**
   * Where drafts come from: by default the model's MTP head where the last stage runs it
   * (Stage.draft: the local stage's, or the chain's over the link), else lookupDraft (the
   * sequence's own earlier tokens).
   */
  readonly drafter?: Drafter;
  readonly log?: (line: string) => void;
  /** Sees every admitted sequence (the head's access log follows them to their end). */
  readonly onAdmit?: (sequence: Sequence) => void;
}

export interface StageHealth {
  readonly layers: string;
  readonly where: string;
  readonly up: boolean | null;
  readonly lastRttMs: number | null;
  readonly lastAnswerAgoMs: number | null;
  readonly decodeMsPerToken: number | null;
  readonly error: string | null;
}

/** One slot: idle, or the sequence it runs (`task` numbers sequences in admission order). */
export interface SlotState {
  readonly slot: number;
  readonly running?: { readonly task: number; readonly sequence: Sequence };
}

export interface Health {
  readonly ok: boolean;
  readonly stages: readonly StageHealth[];
  readonly slots: number;
  readonly busy: number;
  readonly queued: number;
  readonly cachedPrefixes: number;
}

/** Admission is full (or the scheduler is closing): the client should retry after a while. */
export class OverloadedError extends Error {
  override name = "OverloadedError";
  /** Seconds to wait before retrying. */
  readonly retryAfter = 1;
}

/**
 * Prompt positions a step takes from a sequence while others generate (SchedulerOptions
 * .prefillChunk): at the ~5000 tok/s a prefill runs on an H100, a 256-position chunk holds the
 * others' next tokens back ~50 ms, a handful of decode steps. Not yet tuned on the box (issue 23,
 * point 4: a long prompt beside live streams, `deno task bench --only long`).
 */
export const DEFAULT_PREFILL_CHUNK = 256;

/**
 * SchedulerOptions.prefillStepMs when not told: off. On the H100 a 256-position chunk at position
 * 30720 of the bench model took 333 ms, and streams beside a 32768-token prompt waited ~311 ms at
 * p99 between tokens against 29 ms without it; a budget of 80 ms brought them to 115 against 22
 * beside a 16384-token prompt, but its first token to 3.65× alone (7eb9437): chunks of a few dozen
 * positions run the products at a quarter of their speed at 2048 (docs/PERFORMANCE-NOTES.md, "A long
 * prompt beside live streams"). A deployment that values smooth streams over a long prompt's
 * first token turns it on (--prefill-step-ms).
 */
export const DEFAULT_PREFILL_STEP_MS = 0;

/** Fewest prompt positions a chunk takes while others generate, however slow a position. */
export const MIN_SHARED_CHUNK = 16;

/**
 * Positions of a sequence's next prompt chunk while others generate: `most` (the stages'
 * maxBatch and SchedulerOptions.prefillChunk) until its cost a position is known, then what fits
 * `stepMs` at that cost, at least MIN_SHARED_CHUNK. The measured cost includes the other rows of
 * the step, so the chunk settles where the whole step takes stepMs.
 */
export function sharedChunk(most: number, stepMs: number, msPerPosition?: number): number {
  if (stepMs === 0 || msPerPosition === undefined || !(msPerPosition > 0)) return most;
  const fits = Math.floor(stepMs / msPerPosition);
  return Math.min(most, Math.max(MIN_SHARED_CHUNK, fits));
}

/** The candidates of a fused greedy step: none were read back. */
const NO_TOP: Candidates = { top: [], lse: NaN };

/** How long lane jobs may hold the thread before timers and I/O must get a turn, ms. */
const STARVE_MS = 5;
/**
 * Greedy steps per readback when the head runs the whole model: on Deno's builtin WebGPU every
 * readback waits ≥ 11 ms, so one per token would cost more than the step itself. Also the most
 * tokens a stream emits in one burst, and how long other slots may wait for the lane.
 */
export const FUSED_STEPS = 8;
/**
 * Times a sequence may resume after losing its next stage without generating a token in
 * between; the next such loss ends it. A request that kills the worker each time it runs (or a
 * worker that dies on every start) ends this way instead of looping for the whole grace.
 */
export const MAX_STALLED_RESUMES = 3;
/** Wire refusals that a resumed sequence would meet again: none of them is about liveness. */
const PERMANENT = new Set([
  ErrorCode.Malformed,
  ErrorCode.Version,
  ErrorCode.Auth,
  ErrorCode.Range,
]);

/** What a sequence has done so far: kept across the attempts of a sequence that resumes. */
interface Progress {
  /** Every token the sequence accepted, in order: a resumed attempt replays them. */
  readonly generated: number[];
  /** The start event went out (with the first attempt's cached tokens). */
  begun: boolean;
}

/**
 * Starts jobs one at a time in call order: a job starts once the one before it has started and
 * returned its promise. A GPU stage records and submits its step synchronously when called and
 * then waits for the GPU, so the next slot's step is queued on the GPU behind it instead of
 * waiting out its readback; a CPU stage does all its work in that call, so its jobs still run
 * one at a time. A CPU-bound stage resolves its promise at once, so an unsplit generation loop
 * could run as microtasks alone and starve HTTP, timers and client cancellation; a split loop
 * turns the event loop on every network reply. So a job waits for a macrotask only when the
 * event loop has not turned for STARVE_MS: never in the split driver, where that wait would
 * delay one slot's local layers past the other's round trip.
 */
class Lane {
  #tail: Promise<unknown> = Promise.resolve();
  #ticked = true;
  #tickAt = 0;

  run<T>(job: () => Promise<T>): Promise<T> {
    const started = Promise.withResolvers<void>();
    const result = this.#tail.then(async () => {
      let running: Promise<T>;
      try {
        await this.#turn();
        running = job();
      } finally {
        started.resolve();
      }
      return await running;
    });
    this.#tail = started.promise;
    return result;
  }

  /**
   * Lets timers and I/O run before the next job: a reply's first token is then written to its
   * socket before the next step is recorded (fused greedy records 8 steps, ~35 ms of
   * synchronous work on the H200, which the token used to wait behind).
   */
  async giveTurn(): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, 0));
    this.#ticked = true;
  }

  async #turn(): Promise<void> {
    if (this.#ticked) {
      // The loop turned since the last tick fired; plant a new one.
      this.#ticked = false;
      this.#tickAt = performance.now();
      setTimeout(() => this.#ticked = true, 0);
      return;
    }
    if (performance.now() - this.#tickAt < STARVE_MS) return;
    // Timers run in order, so this one runs after the overdue tick.
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
}

function rangeOf(stage: { first: number; end: number }): string {
  return `${stage.first}:${stage.end}`;
}

/**
 * Runs one stage call of `tokens` positions of a prompt or of generated tokens, recording its
 * time, or an error, in `times`.
 */
async function timed<T>(
  times: StageTimes,
  tokens: number,
  phase: "prompt" | "decode",
  call: () => Promise<T>,
): Promise<T> {
  const t0 = performance.now();
  try {
    const result = await call();
    times.record(performance.now() - t0, tokens, phase);
    return result;
  } catch (e) {
    times.errors++;
    throw e;
  }
}

export class Scheduler {
  readonly slots: number;
  readonly ctx: number;
  readonly stats: SchedulerStats;
  readonly #local: Stage;
  readonly #link: StageLink | undefined;
  readonly #tokenizer: TextTokenizer;
  readonly #queueLimit: number;
  readonly #graceMs: number;
  readonly #prefillChunk: number;
  readonly #prefillStepMs: number;
  readonly #draft: DraftMode;
  /** Drafts a verify run takes at most (0: no speculation). */
  readonly #drafts: number;
  /** Drafts from the options; else the local stage's MTP head where it has one, else lookup. */
  readonly #drafter: Drafter | undefined;
  /** What drafting earned across this head's sequences, where each one's gate starts. */
  readonly #draftRecord = new DraftRecord();
  /** What a position of the last prompt chunk of any sequence cost, ms: a new prompt's start. */
  #promptMsPerPosition: number | undefined;
  readonly #cache: PrefixCache;
  readonly #log: (line: string) => void;
  readonly #onAdmit: ((sequence: Sequence) => void) | undefined;
  readonly #lane = new Lane();
  readonly #free: number[];
  readonly #queue: Sequence[] = [];
  readonly #running = new Map<Sequence, Promise<void>>();
  /** Running sequences still in their prompt (or a resumed one's replay): not generating. */
  readonly #prefilling = new Set<Sequence>();
  readonly #admittedAt = new WeakMap<Sequence, number>();
  readonly #tasks = new WeakMap<Sequence, number>();
  readonly #bySlot: (Sequence | undefined)[];
  #nextId = 1;
  #closed = false;

  constructor(options: SchedulerOptions) {
    const { local, link } = options;
    this.#local = local;
    this.#link = link;
    this.#tokenizer = options.tokenizer;
    this.#queueLimit = options.queue;
    this.#graceMs = options.restartGraceMs ?? 30_000;
    this.#prefillChunk = options.prefillChunk ?? DEFAULT_PREFILL_CHUNK;
    if (!Number.isInteger(this.#prefillChunk) || this.#prefillChunk < 1) {
      throw new RangeError(
        `Cannot prefill in chunks of ${options.prefillChunk} positions: expected a whole number ≥ 1`,
      );
    }
    this.#prefillStepMs = options.prefillStepMs ?? DEFAULT_PREFILL_STEP_MS;
    if (!(this.#prefillStepMs >= 0 && this.#prefillStepMs <= 60_000)) {
      throw new RangeError(
        `Cannot budget prompt steps of ${options.prefillStepMs} ms: expected 0 (off) to 60000`,
      );
    }
    this.#log = options.log ?? (() => undefined);
    this.#onAdmit = options.onAdmit;
    checkFirstStage(local);
    checkChainLink(local, link?.remote);
    this.#draft = options.draft ?? "off";
    this.#drafts = draftsOf(this.#draft);
    this.#drafter = options.drafter;
    const keeps = Math.min(local.maxRewind, link?.remote.maxRewind ?? Infinity);
    if (this.#drafts > 0 && this.#drafts + 1 > keeps) {
      throw new RangeError(
        `Cannot verify ${this.#drafts} drafts a step: the stages keep ${keeps} positions to ` +
          `rewind, and a step verifies its drafts and the token before them; open them with ` +
          `maxRewind ${this.#drafts + 1} (workers: --rewind ${this.#drafts + 1})`,
      );
    }
    const stageSlots = Math.min(local.slots, link?.remote.slots ?? Infinity);
    if (!Number.isInteger(options.slots) || options.slots < 1 || options.slots > stageSlots) {
      throw new RangeError(
        `Cannot run ${options.slots} slots: the stages were opened with ${stageSlots}`,
      );
    }
    this.slots = options.slots;
    this.ctx = Math.min(local.ctx, link?.remote.ctx ?? Infinity);
    this.#free = Array.from({ length: this.slots }, (_, i) => this.slots - 1 - i);
    this.#bySlot = new Array(this.slots).fill(undefined);
    // The worker's hello guarantees link.remote.snapshots places behind the link, so a save
    // within both counts never fails for want of a place.
    const stageSnapshots = Math.min(local.snapshots, link?.remote.snapshots ?? Infinity);
    if (
      !Number.isInteger(options.snapshots) || options.snapshots < 0 ||
      options.snapshots > stageSnapshots
    ) {
      throw new RangeError(
        `Cannot keep ${options.snapshots} cached prefixes: the stages were opened with ` +
          `${stageSnapshots} snapshot places`,
      );
    }
    this.#cache = new PrefixCache(options.snapshots);
    const stages = [new StageTimes(rangeOf(local), "local")];
    if (link) stages.push(new StageTimes(rangeOf(link.remote), link.remote.address));
    this.stats = new SchedulerStats(stages);
  }

  /** The next stage, when the model is split. */
  get link(): StageLink | undefined {
    return this.#link;
  }

  get busy(): number {
    return this.#running.size;
  }

  get queued(): number {
    return this.#queue.length;
  }

  /**
   * Admits a request, or throws OverloadedError when the slots and the queue are full, or
   * StageUnavailableError when the next stage does not answer. It runs when a slot frees.
   */
  async admit(request: SequenceRequest): Promise<Sequence> {
    this.#checkRoom();
    if (request.prompt.length === 0 || request.prompt.length > this.ctx) {
      throw new RangeError(
        `Cannot run a prompt of ${request.prompt.length} tokens: expected 1..${this.ctx}`,
      );
    }
    if (this.#link) await this.#link.ensureUp();
    this.#checkRoom();
    const task = this.#nextId++;
    const seq = new Sequence(`seq${task}`, request, this.#tokenizer);
    this.#tasks.set(seq, task);
    this.#admittedAt.set(seq, performance.now());
    this.#onAdmit?.(seq);
    this.#queue.push(seq);
    seq.signal.addEventListener("abort", () => this.#dequeue(seq), { once: true });
    this.#pump();
    return seq;
  }

  /** What each slot is doing now. */
  slotStates(): SlotState[] {
    return this.#bySlot.map((sequence, slot) =>
      sequence ? { slot, running: { task: this.#tasks.get(sequence)!, sequence } } : { slot }
    );
  }

  /**
   * Liveness of every stage; probes an idle next stage, or one known down, for a bounded while
   * (see StageLink.check).
   */
  async health(): Promise<Health> {
    const link = this.#link;
    await link?.check();
    // A restarted worker lost its snapshots: forget their entries now, not at the next lookup.
    this.#cache.dropStale(this.#epoch());
    const [local, remote] = this.stats.stages;
    const stages: StageHealth[] = [{
      layers: local.layers,
      where: local.where,
      up: true,
      lastRttMs: null,
      lastAnswerAgoMs: null,
      decodeMsPerToken: local.decodeMsPerToken,
      error: null,
    }];
    if (link) {
      const s = link.status();
      stages.push({
        layers: remote.layers,
        where: remote.where,
        up: s.up,
        lastRttMs: s.lastRttMs,
        lastAnswerAgoMs: s.lastAnswerAgoMs,
        decodeMsPerToken: remote.decodeMsPerToken,
        error: s.error,
      });
    }
    return {
      ok: stages.every((s) => s.up === true),
      stages,
      slots: this.slots,
      busy: this.busy,
      queued: this.queued,
      cachedPrefixes: this.#cache.size,
    };
  }

  /**
   * Ends every sequence with an overloaded error (clients retry it elsewhere or later), refuses
   * new ones, and waits for the slot loops to stop.
   */
  async close(): Promise<void> {
    this.#closed = true;
    const gone = new OverloadedError("Overloaded: the server is shutting down");
    for (const seq of [...this.#queue.splice(0), ...this.#running.keys()]) seq.fail(gone);
    await Promise.all(this.#running.values());
  }

  #checkRoom(): void {
    if (this.#closed) throw new OverloadedError("Overloaded: the server is shutting down");
    if (this.#running.size + this.#queue.length >= this.slots + this.#queueLimit) {
      throw new OverloadedError(
        `Overloaded: all ${this.slots} slots are busy and ${this.#queue.length} requests are ` +
          `waiting; retry shortly`,
      );
    }
  }

  #dequeue(seq: Sequence): void {
    const at = this.#queue.indexOf(seq);
    if (at !== -1) {
      this.#queue.splice(at, 1);
      this.stats.sequences.cancelled++;
    }
  }

  #pump(): void {
    while (this.#free.length > 0 && this.#queue.length > 0) {
      const seq = this.#queue.shift()!;
      const slot = this.#free.pop()!;
      this.#bySlot[slot] = seq;
      const task = this.#drive(seq, slot).finally(() => {
        this.#running.delete(seq);
        this.#bySlot[slot] = undefined;
        this.#free.push(slot);
        this.#pump();
      });
      this.#running.set(seq, task);
    }
  }

  /** One sequence on one slot, from cache restore to its last token. Never throws. */
  async #drive(seq: Sequence, slot: number): Promise<void> {
    try {
      await this.#generate(seq, slot);
      this.stats.sequences.finished++;
    } catch (e) {
      if (e instanceof CancelledError) {
        this.stats.sequences.cancelled++;
        this.#log(`${seq.id} cancelled on slot ${slot} after ${seq.outputTokens} tokens`);
        return;
      }
      this.stats.sequences.failed++;
      this.#log(`${seq.id} failed on slot ${slot}: ${(e as Error).message}`);
      seq.fail(e);
    }
  }

  /** Runs `seq`, resuming it after each loss of the next stage (see #awaitStage). */
  async #generate(seq: Sequence, slot: number): Promise<void> {
    const progress: Progress = { generated: [], begun: false };
    let stalled = 0;
    let resumedAt = -1;
    while (true) {
      try {
        return await this.#attempt(seq, slot, progress);
      } catch (e) {
        if (!this.#resumable(e)) throw e;
        stalled = progress.generated.length === resumedAt ? stalled + 1 : 0;
        if (stalled === MAX_STALLED_RESUMES) {
          throw new StageUnavailableError(
            e.address,
            `${e.reason}; the sequence lost this stage ${MAX_STALLED_RESUMES + 1} times in a ` +
              `row without generating a token, so it ends here`,
            e.code,
            { cause: e },
          );
        }
        await this.#awaitStage(seq, e, progress);
        resumedAt = progress.generated.length;
      }
    }
  }

  /** A failure of the next stage that the sequence may wait out and resume after. */
  #resumable(e: unknown): e is StageUnavailableError {
    return this.#link !== undefined && e instanceof StageUnavailableError &&
      (e.code === undefined || !PERMANENT.has(e.code));
  }

  /**
   * After the next stage failed `seq` (it died or restarted, the connection broke, or a new
   * connection no longer holds the sequence), waits up to the restart grace for the stage to
   * answer again. The client's stream stays open meanwhile and its keep-alive pings go on; past
   * the grace the sequence ends with a StageUnavailableError that says so.
   */
  async #awaitStage(
    seq: Sequence,
    lost: StageUnavailableError,
    progress: Progress,
  ): Promise<void> {
    const n = progress.generated.length;
    const grace = `${this.#graceMs / 1000} s`;
    this.#log(
      `${seq.id} lost the stage at ${lost.address} after ${n} tokens (${lost.reason}); ` +
        `waiting up to ${grace} for it`,
    );
    const t0 = performance.now();
    try {
      await this.#link!.reconnect(t0 + this.#graceMs, seq.signal);
    } catch (e) {
      if (!(e instanceof StageUnavailableError)) throw e; // The client left (CancelledError).
      throw new StageUnavailableError(
        lost.address,
        `it failed the sequence after ${n} generated tokens (${lost.reason}) and did not ` +
          `answer again within ${grace} (--restart-grace-s): ${e.reason}`,
        e.code,
        { cause: e },
      );
    }
    this.stats.resumes++;
    this.#log(
      `${seq.id} resumes after ${(performance.now() - t0).toFixed(0)} ms: replaying ` +
        `${seq.request.prompt.length} prompt and ${n} generated tokens`,
    );
  }

  /**
   * Runs `seq` to its end from its prompt plus the tokens it has generated so far: none on the
   * first attempt; after a lost stage, the replay puts every stage's slot back where the
   * sequence was, and the sequence's sampler, grammar and stop state simply carry on.
   */
  async #attempt(seq: Sequence, slot: number, progress: Progress): Promise<void> {
    const { prompt, cacheBoundary } = seq.request;
    const { generated } = progress;
    const tokens = generated.length === 0 ? prompt : [...prompt, ...generated];
    const topk = seq.topk(this.#tokenizer.vocabSize, MAX_TOPK);
    let pos = await this.#restorePrefix(seq, slot, tokens);
    const boundary = this.#cache.capacity > 0 && seq.request.cache !== false &&
        cacheBoundary !== undefined &&
        cacheBoundary > pos && cacheBoundary < prompt.length &&
        !this.#cache.has(prompt.slice(0, cacheBoundary), this.#epoch())
      ? cacheBoundary
      : undefined;
    if (!progress.begun) {
      progress.begun = true;
      this.stats.promptTokens += prompt.length;
      this.stats.cachedTokens += pos;
      seq.begin(pos, boundary === undefined ? 0 : boundary - pos);
    }
    const full = Math.min(this.#local.maxBatch, this.#link?.remote.maxBatch ?? Infinity);
    let out: LastOutput | undefined;
    // Only the prompt's last position is sampled from: earlier chunks skip the LM head, and the
    // last chunk computes the logits of its last position alone (as llama.cpp does). Chunks are
    // shorter while other sequences run beside this one: they share its steps.
    // A resumed sequence replays its generated tokens as the kind of rows they were generated
    // as, so that the tokens after them get the bits they would have got (engine/stage.ts
    // RowKind): chunks never straddle the prompt's end.
    // ms a position of this sequence's last chunk took, its step's other rows included; before
    // its first, the last chunk of any sequence's
    let msPerPosition = this.#promptMsPerPosition;
    // What drafting earned on this head says something of the model's MTP head, which drafts for
    // every prompt alike; prompt lookup's drafts are the prompt's own, so each gate starts fresh.
    const gate = new DraftGate(this.#mtpDrafts() ? this.#draftRecord : undefined);
    const mtp = () => this.#mtpOption(seq, gate);
    this.#prefilling.add(seq);
    try {
      while (pos < tokens.length) {
        // The step budget holds while another sequence generates: its next token waits for the
        // step. Prompts alone together keep chunks of prefillChunk, whose steps read the weights
        // for more rows.
        const most = Math.min(full, this.#prefillChunk);
        const chunk = this.#running.size === 1
          ? full
          : this.#running.size > this.#prefilling.size
          ? sharedChunk(most, this.#prefillStepMs, msPerPosition)
          : most;
        let end = Math.min(pos + chunk, tokens.length);
        if (boundary !== undefined && pos < boundary && end > boundary) end = boundary;
        if (pos < prompt.length && end > prompt.length) end = prompt.length;
        const rows = pos < prompt.length ? "prompt" : "decode";
        const last = end === tokens.length;
        const started = performance.now();
        out = await this.#forward(
          seq,
          slot,
          Uint32Array.from(tokens.slice(pos, end)),
          pos,
          last
            ? { topk, adjust: await seq.adjust(end, this.ctx), logits: "last", rows, ...mtp() }
            : { logits: "none", rows, ...mtp() },
        );
        msPerPosition = (performance.now() - started) / (end - pos);
        this.#promptMsPerPosition = msPerPosition;
        pos = end;
        if (pos === boundary) await this.#savePrefix(seq, slot, prompt.slice(0, pos));
      }
    } finally {
      this.#prefilling.delete(seq);
    }
    if (!out) return;
    if (generated.length === 0) {
      const admitted = this.#admittedAt.get(seq)!;
      this.stats.timeToFirstToken.observe((performance.now() - admitted) / 1000);
    }
    let id = seq.pick(out.ids[out.ids.length - 1], out.top);
    if (!this.#accept(seq, progress, id, out, pos)) return;
    if (generated.length === 1) await this.#lane.giveTurn();
    // What the sequence holds so far, for drafts: only kept when it may draft.
    const history = this.#drafts > 0 && this.#draftable(seq) ? [...tokens, id] : undefined;
    const sampled = seq.request.sampling.temperature > 0;
    while (true) {
      // A speculative step's cost, for the gate: drafting, verifying and rewinding.
      const drafting = performance.now();
      const drafts = history
        ? await this.#draftFor(seq, slot, id, gate, history, pos, generated.length)
        : [];
      if (drafts.length) {
        // The token and its drafts in one run of generated rows: each row's logits are what a
        // plain step gives after the rows before it. Greedy, the drafts that match the rows'
        // greedy ids are kept; sampled, each draft is kept with the probability the sampler
        // gives it (speculativeToken), so the tokens keep the sampler's distribution. The first
        // refused draft is replaced, or after the last kept one the model's own token follows,
        // and the slot is rewound to the last position kept.
        const verify = await this.#forward(seq, slot, Uint32Array.of(id, ...drafts), pos, {
          logits: "all",
          rows: "decode",
          rewindable: true,
          ...(sampled ? { topk, candidates: "every" as const } : {}),
        });
        const candidates = (j: number) => verify.tops?.[j] ?? [];
        let kept = 0;
        let next = -1;
        while (next < 0) {
          if (kept === drafts.length) {
            next = seq.pick(verify.ids[kept], candidates(kept));
          } else {
            const t = seq.pickDrafted(drafts[kept], verify.ids[kept], candidates(kept));
            if (t.kept) kept++;
            else next = t.id;
          }
        }
        if (kept < drafts.length) await this.#rewind(seq, slot, pos + kept + 1);
        gate.verified(performance.now() - drafting, drafts.length, kept, generated.length);
        this.stats.drafts.verifies++;
        this.stats.drafts.drafted += drafts.length;
        this.stats.drafts.accepted += kept;
        for (const [j, token] of [...drafts.slice(0, kept), next].entries()) {
          if (!this.#accept(seq, progress, token, NO_TOP, pos + j + 1)) return;
          history!.push(token);
        }
        pos += kept + 1;
        id = next;
        continue;
      }
      const started = performance.now();
      // Decided at every step: a sequence that starts alone stops fusing when another joins.
      // A bias alone rides along every fused step; penalties (undefined) go a step at a time.
      const fused = this.#fused(seq);
      const bias = fused && seq.stepBias();
      if (fused && bias) {
        // Several steps per readback, each step's argmax or draw fed to the next on the GPU:
        // the same ids as one step at a time (the stage's bit-exact contract, and the head's
        // sampler's arithmetic with the sequence's own draws), overshoot past a stop is dropped,
        // and the slot's extra positions are never continued from.
        const left = seq.request.maxTokens - seq.outputTokens;
        const steps = Math.max(
          1,
          Math.min(FUSED_STEPS, left, this.ctx - pos, this.#local.maxBatch),
        );
        // Sampled from no candidates is the argmax, as the head's sampler has it (which takes
        // its draw all the same).
        const draws = sampled ? seq.draws(steps) : undefined;
        const options: FusedOptions = {
          ...mtp(),
          bias,
          ...(draws && topk > 0 ? { topk, sampling: { params: seq.request.sampling, draws } } : {}),
        };
        const ids = await this.#fusedSteps(seq, slot, fused, id, pos, steps, options);
        gate.plain(performance.now() - started, steps);
        for (const [s, next] of ids.entries()) {
          if (!this.#accept(seq, progress, next, NO_TOP, pos + s + 1)) return;
          history?.push(next);
        }
        pos += steps;
        id = ids[steps - 1];
        continue;
      }
      out = await this.#forward(seq, slot, Uint32Array.of(id), pos, {
        topk,
        adjust: await seq.adjust(pos + 1, this.ctx),
        logits: "last",
        rows: "decode",
        ...mtp(),
      });
      gate.plain(performance.now() - started, 1);
      pos++;
      id = seq.pick(out.ids[out.ids.length - 1], out.top);
      if (!this.#accept(seq, progress, id, out, pos)) return;
      history?.push(id);
    }
  }

  /**
   * The drafts `seq` verifies at its next step from position `pos`, `generated` tokens in, to
   * follow `id` (none: a plain step): from the drafter, as many as the mode takes and its tokens
   * and context have room for; under "auto" only while it runs alone (together, sequences share
   * steps instead) and drafting pays.
   */
  async #draftFor(
    seq: Sequence,
    slot: number,
    id: number,
    gate: DraftGate,
    history: readonly number[],
    pos: number,
    generated: number,
  ): Promise<number[]> {
    if (this.#draft === "auto" && (this.#running.size > 1 || !gate.drafts(generated))) {
      return [];
    }
    const left = seq.request.maxTokens - seq.outputTokens;
    // Sampled, every row returns its candidates: a run holds 2·MAX_TOPK + 1 words of them.
    const k = seq.request.sampling.temperature > 0
      ? seq.topk(this.#tokenizer.vocabSize, MAX_TOPK)
      : 0;
    const rows = Math.floor((2 * MAX_TOPK + 1) / (2 * k + 1));
    const most = Math.min(this.#drafts, left - 1, this.ctx - pos - 1, rows - 1);
    if (most <= 0) return [];
    // The model's MTP head on the last stage first (the chain's over the link); where it has no
    // hidden row to start from (a restored slot), or there is none, prompt lookup.
    if (!this.#drafter) {
      const link = this.#link;
      const local = this.#local.draft?.bind(this.#local);
      const drafts = link ? await link.draft(slot, id, most) : local
        ? await this.#lane.run(() => {
          seq.checkCancelled();
          return local(slot, id, most);
        })
        : new Uint32Array();
      if (drafts.length) return [...drafts];
    }
    return (this.#drafter ?? lookupDraft)(history, most).slice(0, most);
  }

  /**
   * Whether `seq` picks each token from the model's logits as they are (no grammar, per-token
   * probabilities or logit changes, which apply to one position a run): what speculative
   * steps can verify drafts for, greedy or sampled.
   */
  #draftable(seq: Sequence): boolean {
    const { constraint, logprobs } = seq.request;
    return !constraint && logprobs === undefined && !seq.adjusting;
  }

  /** Whether drafts come from the model's MTP head (the local stage's, or the chain's). */
  #mtpDrafts(): boolean {
    if (this.#drafter) return false;
    return this.#link ? this.#link.remote.drafts : this.#local.draft !== undefined;
  }

  /**
   * The run option that spares a sequence the last stage's MTP block when it will not draft
   * again: it cannot draft at all, or under "auto" its gate's pause outlasts its token budget.
   * The block runs beside every other run (it must have seen every position a draft follows).
   */
  #mtpOption(seq: Sequence, gate: DraftGate): { readonly mtp?: false } {
    if (this.#drafts === 0) return {};
    const drafts = this.#draftable(seq) &&
      (this.#draft !== "auto" || gate.reaches(seq.request.maxTokens));
    return drafts ? {} : { mtp: false };
  }

  /** Takes `slot` back to `pos` inside its last (rewindable) run, on every stage. */
  async #rewind(seq: Sequence, slot: number, pos: number): Promise<void> {
    await this.#lane.run(() => {
      seq.checkCancelled();
      return this.#local.rewind(slot, pos);
    });
    await this.#link?.rewind(slot, pos);
  }

  /** Hands a generated token (to be placed at `pos`) to its sequence; false when it has ended. */
  #accept(
    seq: Sequence,
    progress: Progress,
    id: number,
    out: Candidates,
    pos: number,
  ): boolean {
    this.stats.outputTokens++;
    progress.generated.push(id);
    const stopIds = seq.request.stopIds ?? this.#tokenizer.eosIds;
    return seq.accept(id, out, stopIds.has(id), pos >= this.ctx);
  }

  /**
   * The local stage's fused decoding, when it may stand in for per-step runs: the head holds the
   * whole model, the sequence takes each step's argmax or draw as the stage makes it (no grammar
   * or per-token probabilities; the caller checks for penalties: Sequence.stepBias), and no other
   * sequence runs, whose steps its own would then not share.
   */
  #fused(seq: Sequence): Stage["decodeFused"] {
    const { constraint, logprobs } = seq.request;
    if (this.#link || constraint || logprobs !== undefined || this.#running.size > 1) {
      return undefined;
    }
    return this.#local.decodeFused?.bind(this.#local);
  }

  /** `steps` fused steps from `id` at `pos` on the lane (Stage.decodeFused); each step's token. */
  async #fusedSteps(
    seq: Sequence,
    slot: number,
    decode: NonNullable<Stage["decodeFused"]>,
    id: number,
    pos: number,
    steps: number,
    options: FusedOptions,
  ): Promise<Uint32Array> {
    const [localTimes] = this.stats.stages;
    return await this.#lane.run(() => {
      seq.checkCancelled();
      return timed(
        localTimes,
        steps,
        "decode",
        async () => (await decode(slot, id, pos, steps, options)).ids,
      );
    });
  }

  /**
   * Runs positions [base, base+n) through every stage; the last stage's ids (those
   * `options.logits` asks for) and top-k, after it applied `options.adjust` to the last
   * position's logits.
   */
  async #forward(
    seq: Sequence,
    slot: number,
    ids: Uint32Array,
    base: number,
    options: StageRunOptions,
  ): Promise<LastOutput> {
    const [localTimes, remoteTimes] = this.stats.stages;
    const phase = checkRows(options, ids.length);
    const out = await this.#lane.run(() => {
      seq.checkCancelled();
      return timed(
        localTimes,
        ids.length,
        phase,
        () => this.#local.run(slot, { kind: "ids", ids }, ids.length, base, options),
      );
    });
    if (out.kind === "ids") return out;
    seq.checkCancelled();
    return await timed(
      remoteTimes,
      ids.length,
      phase,
      () => this.#link!.run(slot, out.rows, ids.length, base, options, ids),
    );
  }

  #epoch(): number {
    return this.#link?.epoch ?? 0;
  }

  /** Restores the longest cached prefix of `tokens` on every stage; the position to continue from. */
  async #restorePrefix(seq: Sequence, slot: number, tokens: readonly number[]): Promise<number> {
    if (this.#cache.capacity === 0 || seq.request.cache === false) return 0;
    // A reconnect changes the epoch and so invalidates entries: settle the connection first.
    await this.#link?.connect();
    const entry = this.#cache.lookup(tokens, this.#epoch());
    if (!entry) return 0;
    try {
      const local = await this.#lane.run(() => {
        seq.checkCancelled();
        return this.#local.restore(slot, entry.idx);
      });
      const remote = this.#link ? await this.#link.restore(slot, entry.idx) : local;
      if (local !== entry.tokens.length || remote !== entry.tokens.length) {
        throw new RangeError(
          `Cannot restore snapshot ${entry.idx}: it holds ${entry.tokens.length} tokens, but ` +
            `the stages restored ${local} and ${remote}`,
        );
      }
      return entry.tokens.length;
    } finally {
      this.#cache.release(entry);
    }
  }

  /** Snapshots the slot on every stage and records it under `tokens`. */
  async #savePrefix(seq: Sequence, slot: number, tokens: number[]): Promise<void> {
    const idx = this.#cache.reserve();
    if (idx === undefined) return; // Every place is being restored right now; skip this one.
    const epoch = this.#epoch();
    let saved = false;
    try {
      await this.#lane.run(() => {
        seq.checkCancelled();
        return this.#local.save(slot, idx);
      });
      await this.#link?.save(slot, idx);
      saved = this.#epoch() === epoch;
    } finally {
      if (saved) this.#cache.insert({ idx, tokens, epoch });
      else this.#cache.abandon(idx);
    }
    if (saved) seq.cacheWritten(tokens.length);
  }
}
