// The head's view of its next stage: liveness (an idle PING, the connection's end seen at once),
// last round trip, reconnect with backoff. Wraps lib/wire/remote_stage.ts for the scheduler;
// /health and /metrics read its status.

import type { LastOutput, StageRunOptions } from "../../engine/stage.ts";
import { deadline } from "../wire/deadline.ts";
import { StageUnavailableError } from "../wire/peer.ts";
import { LostStateError, type RemoteStage } from "../wire/remote_stage.ts";

export interface LinkStatus {
  readonly address: string;
  readonly first: number;
  readonly end: number;
  /** Null before the first contact. */
  readonly up: boolean | null;
  /** Round trip of the last one-position frame or PING (a decode step or a probe), ms. */
  readonly lastRttMs: number | null;
  /** Milliseconds since the stage last answered. */
  readonly lastAnswerAgoMs: number | null;
  readonly error: string | null;
  /** Connections made so far; remote state (slots, snapshots) belongs to the current one. */
  readonly epoch: number;
}

export interface LinkOptions {
  readonly log?: (line: string) => void;
  /** First reconnect delay after a failure; doubles up to maxBackoffMs. Default 100. */
  readonly minBackoffMs?: number;
  /** Default 2000. */
  readonly maxBackoffMs?: number;
  /**
   * A stage silent this long is probed with a PING: in the background, and before a request is
   * admitted. Default 1000.
   */
  readonly idleMs?: number;
  /** An idle PING unanswered this long ends the connection. Default 1000. */
  readonly pingTimeoutMs?: number;
}

/** How often the background check looks for an idle stage, ms. */
const HEARTBEAT_MS = 250;
/**
 * The longest a health check waits for the stage to answer, ms: a stage back from an outage
 * answers a new connection in a few round trips, while a silent one would hold the check for the
 * whole connect timeout. Past it, the check reports what the link knows.
 */
const HEALTH_WAIT_MS = 1000;

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Every call that reaches the worker goes through here, and the connection reports its own end
 * (a worker killed or restarted while idle included), so a failure anywhere marks the stage down
 * at once; a background loop then reconnects with backoff while new requests fail fast. A stage
 * silent for idleMs gets a PING, so one that hangs without closing is down within
 * idleMs + pingTimeoutMs (2 s by default).
 */
export class StageLink {
  readonly remote: RemoteStage;
  readonly #log: (line: string) => void;
  readonly #minBackoff: number;
  readonly #maxBackoff: number;
  readonly #idleMs: number;
  readonly #pingTimeoutMs: number;
  readonly #heartbeat: ReturnType<typeof setInterval>;
  #up: boolean | null = null;
  #lastAnswer: number | null = null;
  #lastRtt: number | null = null;
  #error: string | null = null;
  /** Requests sent and not yet answered. */
  #inFlight = 0;
  #attempting: { readonly since: number; readonly done: Promise<void> } | undefined;
  #retrying = false;
  /** The idle PING in flight, which the heartbeat and ensureUp share. */
  #probing: Promise<void> | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #wake: (() => void) | undefined;
  #closed = false;

  constructor(remote: RemoteStage, options: LinkOptions = {}) {
    this.remote = remote;
    this.#log = options.log ?? (() => undefined);
    this.#minBackoff = options.minBackoffMs ?? 100;
    this.#maxBackoff = options.maxBackoffMs ?? 2000;
    this.#idleMs = options.idleMs ?? 1000;
    this.#pingTimeoutMs = options.pingTimeoutMs ?? 1000;
    remote.onLost((failure) => {
      if (!this.#closed) this.#down(failure);
    });
    this.#heartbeat = setInterval(() => this.#beat(), HEARTBEAT_MS);
  }

  get epoch(): number {
    return this.remote.epoch;
  }

  get up(): boolean | null {
    return this.#up;
  }

  status(): LinkStatus {
    return {
      address: this.remote.address,
      first: this.remote.first,
      end: this.remote.end,
      up: this.#up,
      lastRttMs: this.#lastRtt,
      lastAnswerAgoMs: this.#lastAnswer === null ? null : performance.now() - this.#lastAnswer,
      error: this.#error,
      epoch: this.remote.epoch,
    };
  }

  /**
   * Runs positions [base, base+n) of `slot` on the rest of the chain; `ids`, the tokens at those
   * positions, go along where its last stage drafts.
   */
  async run(
    slot: number,
    rows: Float32Array,
    n: number,
    base: number,
    options: StageRunOptions,
    ids?: Uint32Array,
  ): Promise<LastOutput> {
    const t0 = performance.now();
    const out = await this.#watch(
      this.remote.run(slot, { kind: "hidden", rows, ...(ids ? { ids } : {}) }, n, base, options),
    );
    if (out.kind !== "ids") {
      throw new TypeError(`Stage ${this.remote.address} returned hidden rows, not ids`);
    }
    if (n === 1) this.#lastRtt = performance.now() - t0;
    return out;
  }

  save(slot: number, idx: number): Promise<void> {
    return this.#watch(this.remote.save(slot, idx));
  }

  restore(slot: number, idx: number): Promise<number> {
    return this.#watch(this.remote.restore(slot, idx));
  }

  rewind(slot: number, pos: number): Promise<void> {
    return this.#watch(this.remote.rewind(slot, pos));
  }

  /** The chain's last stage's drafts (RemoteStage.draft): none where it does not draft. */
  draft(slot: number, id: number, k: number): Promise<Uint32Array> {
    return this.#watch(this.remote.draft(slot, id, k));
  }

  /**
   * Makes sure the stage answers before a request is admitted: a stage known to be down gets a
   * reconnect attempt now (one that began before this call and failed is followed by a fresh
   * one, so a worker that just came back is found), and one silent for longer than idleMs is
   * probed with a PING through the whole chain (answered within pingTimeoutMs; one already in
   * flight is joined). Throws StageUnavailableError when it does not answer; a refused
   * connection fails at once, an unreachable host after the connect timeout.
   */
  async ensureUp(): Promise<void> {
    if (this.#up === false || this.#up === null) {
      await this.#freshConnect();
      return;
    }
    if (this.#lastAnswer !== null && performance.now() - this.#lastAnswer < this.#idleMs) return;
    // A request in flight reports a failure itself; a PING would only queue behind it.
    if (this.#inFlight > 0 && !this.#probing) return;
    try {
      await this.#idleProbe();
    } catch (e) {
      if (!(e instanceof StageUnavailableError)) throw e;
      // The connection was dead (the worker may have restarted while idle): one fresh try.
      await this.#freshConnect();
    }
  }

  /**
   * ensureUp for a health check: waits at most `waitMs` (the attempt goes on behind it) and
   * never throws for the stage; status() then says what is known.
   */
  async check(waitMs = HEALTH_WAIT_MS): Promise<void> {
    const late = () => new StageUnavailableError(this.remote.address, "no answer yet");
    try {
      await deadline(this.ensureUp(), waitMs, late);
    } catch (e) {
      if (!(e instanceof StageUnavailableError)) throw e;
    }
  }

  /** The live connection, opening one (a new epoch) if there is none. */
  async connect(): Promise<void> {
    await this.#watch(this.remote.connect());
  }

  /**
   * A PING through the chain; its round trip becomes lastRttMs. No PONG within `timeoutMs`
   * (default: the connection's reply timeout) ends the connection.
   */
  async probe(timeoutMs?: number): Promise<void> {
    const t0 = performance.now();
    await this.#watch(this.remote.ping(timeoutMs));
    this.#lastRtt = performance.now() - t0;
  }

  /**
   * Waits for the stage to answer again after it failed a sequence: a connection attempt that
   * starts now, then more with backoff, until one succeeds, `until` (a performance.now() time)
   * passes (the last StageUnavailableError is thrown), or `signal` aborts (its reason is). An
   * attempt still waiting for a silent stage's hello at `until` is waited for no longer (it goes
   * on behind), so the caller hears at `until`, not a connect timeout later; only a first
   * attempt that starts at or after `until` (no grace at all) runs to its end.
   */
  async reconnect(until: number, signal?: AbortSignal): Promise<void> {
    let delay = this.#minBackoff;
    while (true) {
      signal?.throwIfAborted();
      try {
        // Measured before the attempt starts: its synchronous start may run past `until`, and an
        // attempt begun within the grace must still end with it, not at the connect timeout.
        const left = until - performance.now();
        const attempt = this.#freshConnect();
        const late = () =>
          new StageUnavailableError(this.remote.address, "a new connection got no answer yet");
        await (left > 0 ? deadline(attempt, left, late) : attempt);
        return;
      } catch (e) {
        const left = until - performance.now();
        if (!(e instanceof StageUnavailableError) || left <= 0) throw e;
        await sleep(Math.min(delay, left), signal);
        // A wait that used up the grace ends here: no attempt starts past `until`.
        if (performance.now() >= until) throw e;
        delay = Math.min(delay * 2, this.#maxBackoff);
      }
    }
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#heartbeat);
    clearTimeout(this.#timer);
    this.#wake?.();
    this.remote.close();
  }

  /** Joins the connection attempt in flight, or starts one. */
  #attempt(): { readonly since: number; readonly done: Promise<void> } {
    this.#attempting ??= {
      since: performance.now(),
      done: this.#watch(this.remote.connect())
        .then(() => undefined)
        .finally(() => this.#attempting = undefined),
    };
    return this.#attempting;
  }

  /** A connection attempt that started no earlier than this call. */
  async #freshConnect(): Promise<void> {
    const called = performance.now();
    const attempt = this.#attempt();
    try {
      await attempt.done;
    } catch (e) {
      if (attempt.since >= called) throw e;
      await this.#attempt().done;
    }
  }

  /** A PING within pingTimeoutMs; joins the one in flight. */
  #idleProbe(): Promise<void> {
    this.#probing ??= this.probe(this.#pingTimeoutMs).finally(() => this.#probing = undefined);
    return this.#probing;
  }

  /** Probes a stage that has been silent for idleMs with nothing in flight. */
  #beat(): void {
    if (this.#up !== true || this.#inFlight > 0 || this.#closed) return;
    if (this.#lastAnswer !== null && performance.now() - this.#lastAnswer < this.#idleMs) return;
    this.#idleProbe().catch((e) => {
      // A StageUnavailableError is recorded by #watch (and the connection's end).
      if (!(e instanceof StageUnavailableError)) {
        this.#log(`probing ${this.remote.address} failed: ${(e as Error).message}`);
      }
    });
  }

  async #watch<T>(work: Promise<T>): Promise<T> {
    this.#inFlight++;
    try {
      const out = await work;
      this.#answered();
      return out;
    } catch (e) {
      // Lost state is refused locally; the connection itself is fine.
      if (e instanceof StageUnavailableError && !(e instanceof LostStateError)) this.#down(e);
      throw e;
    } finally {
      this.#inFlight--;
    }
  }

  #answered(): void {
    this.#lastAnswer = performance.now();
    if (this.#up !== true) {
      if (this.#up === false) {
        this.#log(`stage ${this.remote.address} is back (epoch ${this.epoch})`);
      }
      this.#up = true;
      this.#error = null;
    }
  }

  #down(e: StageUnavailableError): void {
    this.#error = e.reason;
    if (this.#up !== false) this.#log(`stage ${this.remote.address} is down: ${e.reason}`);
    this.#up = false;
    if (!this.#retrying && !this.#closed) this.#retry();
  }

  /** Reconnects in the background, doubling the delay, until the stage answers or close. */
  async #retry(): Promise<void> {
    this.#retrying = true;
    let delay = this.#minBackoff;
    try {
      while (this.#up === false && !this.#closed) {
        await new Promise<void>((resolve) => {
          this.#wake = resolve;
          this.#timer = setTimeout(resolve, delay);
        });
        if (this.#up !== false || this.#closed) break;
        delay = Math.min(delay * 2, this.#maxBackoff);
        try {
          await this.#attempt().done;
        } catch (e) {
          // A StageUnavailableError is the expected "still down"; #watch recorded it.
          if (!(e instanceof StageUnavailableError)) {
            this.#log(`reconnecting to ${this.remote.address} failed: ${(e as Error).message}`);
          }
        }
      }
    } finally {
      this.#retrying = false;
    }
  }
}
