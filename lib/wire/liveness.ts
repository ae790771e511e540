// Signs of life on a stage connection: the worker's side writes its frames one at a time and an
// ALIVE whenever it has written nothing for a while; the client's side ends a connection that
// has sent nothing for its silence limit. Used by stage_server.ts and peer.ts.

import { ALIVE_MS, type Frame, Op } from "./frame.ts";
import { type ByteSink, writeFrame } from "./frame_stream.ts";

/** The client's default silence limit: four ALIVE intervals, then the stage counts as gone. */
export const DEFAULT_SILENCE_MS = 4 * ALIVE_MS;
/** The shortest silence limit a client may set: three ALIVE intervals. */
export const MIN_SILENCE_MS = 3 * ALIVE_MS;
/** How often a client looks at the time since the worker last sent something. */
const WATCH_TICK_MS = 250;
/**
 * A gap this long between two of the client's own ticks means its event loop was held (a long
 * synchronous step, a stop of this process): frames that arrived meanwhile are still unread, so
 * the silence clock starts again instead of blaming the worker.
 */
const STALL_MS = 4 * WATCH_TICK_MS;

/**
 * The worker's writes to one client, in call order and never interleaved, plus an ALIVE each
 * time nothing has gone out for half of ALIVE_MS (checked every half ALIVE_MS), so the client
 * hears something at least every ALIVE_MS while the worker's event loop runs, however long a
 * step takes. ALIVE is only ever queued behind nothing: a client that stopped reading gets no
 * pile of them.
 */
export class FrameWriter {
  readonly #sink: ByteSink;
  readonly #nEmbd: number;
  readonly #timer: ReturnType<typeof setInterval>;
  #tail: Promise<void> = Promise.resolve();
  #queued = 0;
  #lastWrite = performance.now();
  #failure: unknown;
  #stopped = false;

  constructor(sink: ByteSink, nEmbd = 0) {
    this.#sink = sink;
    this.#nEmbd = nEmbd;
    this.#timer = setInterval(() => this.#beat(), ALIVE_MS / 2);
  }

  /** Writes `frame` after every frame sent before it; rejects with the first write failure. */
  send(frame: Frame): Promise<void> {
    if (this.#failure !== undefined) return Promise.reject(this.#failure);
    this.#queued++;
    const written = this.#tail.then(async () => {
      if (this.#failure !== undefined) throw this.#failure;
      this.#lastWrite = performance.now();
      try {
        await writeFrame(this.#sink, frame, this.#nEmbd);
      } catch (e) {
        this.#failure ??= e;
        throw e;
      } finally {
        this.#queued--;
      }
    });
    this.#tail = written.catch(() => undefined);
    return written;
  }

  /**
   * Stops the ALIVEs; settles once the frames already queued are written (or failed), so the
   * caller may write to the socket itself afterwards.
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    clearInterval(this.#timer);
    await this.#tail;
  }

  #beat(): void {
    if (this.#stopped || this.#queued > 0 || this.#failure !== undefined) return;
    if (performance.now() - this.#lastWrite < ALIVE_MS / 2) return;
    // A failed ALIVE is seen by the next reply's send or by the read loop: nothing to do here.
    this.send({ op: Op.Alive }).catch(() => undefined);
  }
}

/**
 * The client's watch over one connection: `heard()` on every frame that arrives; `onSilent` is
 * called once, with the silence in ms, when none has arrived for `limitMs`. Time during which
 * this side's own event loop could not run does not count against the worker.
 */
export class SilenceWatch {
  readonly #limitMs: number;
  readonly #onSilent: (silentMs: number) => void;
  readonly #timer: ReturnType<typeof setInterval>;
  #heard = performance.now();
  #tick = performance.now();

  constructor(limitMs: number, onSilent: (silentMs: number) => void) {
    this.#limitMs = limitMs;
    this.#onSilent = onSilent;
    this.#timer = setInterval(() => this.#check(), WATCH_TICK_MS);
  }

  heard(): void {
    this.#heard = performance.now();
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  #check(): void {
    const now = performance.now();
    if (now - this.#tick > STALL_MS) this.#heard = Math.max(this.#heard, now);
    this.#tick = now;
    const silent = now - this.#heard;
    if (silent < this.#limitMs) return;
    this.stop();
    this.#onSilent(silent);
  }
}
