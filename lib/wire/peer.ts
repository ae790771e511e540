// Client side of one connection to the next stage: connect, hello checks, then RUN / SAVE /
// RESTORE / PING frames with replies in order. Used by remote_stage.ts (head, generate, middle workers).

import { greedyCount, type LastOutput, type StageRunOptions } from "../../engine/stage.ts";
import { deadline } from "./deadline.ts";
import {
  AuthMode,
  encodeFrame,
  encodeGreeting,
  ErrorCode,
  type Frame,
  type FrameLimits,
  type HelloInfo,
  MAGIC,
  magicName,
  Op,
} from "./frame.ts";
import { FrameReader, writeAll } from "./frame_stream.ts";
import { DEFAULT_SILENCE_MS, SilenceWatch } from "./liveness.ts";
import {
  type ChainExpectation,
  clientProof,
  freshNonce,
  helloMismatch,
  NO_PROOF,
  verifyWorkerProof,
} from "./hello.ts";

/**
 * The next stage cannot serve: unreachable, refused the hello, sent an error, timed out or
 * closed the connection. `code` is the worker's ErrorCode when it sent one; `reason` is the
 * worker's (or this side's) explanation without the address prefix.
 */
export class StageUnavailableError extends Error {
  override name = "StageUnavailableError";
  readonly address: string;
  readonly reason: string;
  readonly code: ErrorCode | undefined;

  constructor(address: string, reason: string, code?: ErrorCode, options?: ErrorOptions) {
    super(`Cannot use the stage at ${address}: ${reason}`, options);
    this.address = address;
    this.reason = reason;
    this.code = code;
  }
}

export interface PeerOptions {
  /** The shared secret, when the worker runs with --key-file. */
  readonly key?: CryptoKey;
  /** TCP connect plus handshake. Default 10 s. */
  readonly connectTimeoutMs?: number;
  /**
   * Waiting for one reply, however often the worker says it is alive. Default 10 min: a long
   * prefill on the CPU reference is slow.
   */
  readonly replyTimeoutMs?: number;
  /**
   * Once connected, a worker that sends nothing (no reply, no ALIVE) for this long has stopped,
   * or the network to it has: the connection ends and every pending request fails. Default
   * DEFAULT_SILENCE_MS.
   */
  readonly silenceMs?: number;
}

export type RunReply = LastOutput;

/** Parses "host:port" or "[v6]:port". */
export function parseAddress(text: string): { hostname: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:\[\]]+)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port < 1 || port > 65535) {
    throw new TypeError(`Cannot parse address "${text}": expected host:port, e.g. 10.0.0.2:9000`);
  }
  return { hostname: m[1] ?? m[2], port };
}

const HANDSHAKE_LIMITS: FrameLimits = { nEmbd: 0, maxBatch: 0 };

/** Reads one frame that is not ERROR; ERROR, EOF and bad bytes become StageUnavailableError. */
async function readReply(
  reader: FrameReader,
  limits: FrameLimits,
  address: string,
): Promise<Frame> {
  let frame: Frame | null;
  try {
    frame = await reader.readFrame(limits);
  } catch (e) {
    const reason = e instanceof Deno.errors.Interrupted || e instanceof Deno.errors.BadResource
      ? "the connection was closed by this side"
      : `reading its reply failed: ${(e as Error).message}`;
    throw new StageUnavailableError(address, reason, undefined, { cause: e });
  }
  if (frame === null) throw new StageUnavailableError(address, "it closed the connection");
  if (frame.op === Op.Error) throw new StageUnavailableError(address, frame.message, frame.code);
  return frame;
}

async function handshake(
  conn: Deno.Conn,
  reader: FrameReader,
  address: string,
  key: CryptoKey | undefined,
): Promise<HelloInfo> {
  const fail = (reason: string) => new StageUnavailableError(address, reason);
  const nonceC = freshNonce();
  await writeAll(conn, encodeGreeting(nonceC));
  const challenge = await readReply(reader, HANDSHAKE_LIMITS, address);
  if (challenge.op !== Op.Challenge) {
    throw fail(`it sent op ${challenge.op} instead of a challenge`);
  }
  if (challenge.magic !== MAGIC) {
    throw fail(
      `it speaks wire version ${magicName(challenge.magic)}, this side ${magicName(MAGIC)}; ` +
        `run the same tandem version on both`,
    );
  }
  if (challenge.auth === AuthMode.HmacSha256 && !key) {
    throw fail("it requires a shared key; pass --key-file with the worker's key");
  }
  if (challenge.auth === AuthMode.None && key) {
    throw fail(
      "it checks no key (it runs without --key-file) but this side has one; start the worker " +
        "with the same --key-file",
    );
  }
  const proof = key ? await clientProof(key, nonceC, challenge.nonce) : NO_PROOF;
  await writeAll(conn, encodeFrame({ op: Op.Auth, proof }));
  const hello = await readReply(reader, HANDSHAKE_LIMITS, address);
  if (hello.op !== Op.Hello) throw fail(`it sent op ${hello.op} instead of a hello`);
  if (key && !await verifyWorkerProof(key, nonceC, challenge.nonce, hello.info, hello.proof)) {
    throw fail("its hello is not signed with this side's key; both sides need the same key file");
  }
  return hello.info;
}

/**
 * Opens a connection, runs the handshake and checks the worker's HELLO against `want` (a probe
 * passes none and takes any hello). Every failure, a mismatch included, is a
 * StageUnavailableError whose reason names both values.
 */
export async function connectPeer(
  address: string,
  want: ChainExpectation | undefined,
  options: PeerOptions = {},
): Promise<Peer> {
  const { hostname, port } = parseAddress(address);
  const ms = options.connectTimeoutMs ?? 10_000;
  const abort = new AbortController();
  const connecting = Deno.connect({ hostname, port, signal: abort.signal });
  let conn: Deno.TcpConn;
  try {
    conn = await deadline(connecting, ms, () => new Error(`no answer within ${ms} ms`));
  } catch (e) {
    abort.abort();
    // A connection that lands after the deadline is closed rather than leaked.
    connecting.then((late) => late.close(), () => undefined);
    throw new StageUnavailableError(address, `cannot connect: ${(e as Error).message}`, undefined, {
      cause: e,
    });
  }
  conn.setNoDelay(true);
  conn.setKeepAlive(true);
  const reader = new FrameReader(conn);
  try {
    const info = await deadline(
      handshake(conn, reader, address, options.key),
      ms,
      () => new StageUnavailableError(address, `no hello within ${ms} ms`),
    );
    const mismatch = want && helloMismatch(info, want);
    if (mismatch) throw new StageUnavailableError(address, mismatch);
    return new Peer(address, conn, reader, info, {
      replyTimeoutMs: options.replyTimeoutMs ?? 600_000,
      silenceMs: options.silenceMs ?? DEFAULT_SILENCE_MS,
    });
  } catch (e) {
    conn.close();
    if (e instanceof StageUnavailableError) throw e;
    throw new StageUnavailableError(
      address,
      `the hello failed: ${(e as Error).message}`,
      undefined,
      {
        cause: e,
      },
    );
  }
}

/** A request waiting for its reply; replies come in request order. */
interface Waiter {
  readonly resolve: (frame: Frame) => void;
  readonly reject: (failure: StageUnavailableError) => void;
  readonly timeoutMs: number;
  timer?: ReturnType<typeof setTimeout>;
}

/**
 * One live connection. Requests may overlap: frames go out in call order and replies are
 * matched in the same order. A read is always open, even while no reply is due, so a worker
 * that dies or restarts while idle ends the connection at once (`ended`) instead of at the next
 * request, and one that goes silent (stopped, asleep, cut off) ends it after the silence limit:
 * a worker sends ALIVE while it works, so no step is too long for it. Any failure (an ERROR
 * frame included: the worker closes after it) ends the connection, and every pending and later
 * request rejects with the same error.
 */
export class Peer {
  readonly address: string;
  readonly info: HelloInfo;
  readonly #conn: Deno.Conn;
  readonly #reader: FrameReader;
  readonly #replyTimeoutMs: number;
  readonly #limits: FrameLimits;
  readonly #waiting: Waiter[] = [];
  readonly #silence: SilenceWatch;
  readonly #ended = Promise.withResolvers<StageUnavailableError>();
  #writes: Promise<void> = Promise.resolve();
  #failure: StageUnavailableError | undefined;

  constructor(
    address: string,
    conn: Deno.Conn,
    reader: FrameReader,
    info: HelloInfo,
    timeouts: { readonly replyTimeoutMs: number; readonly silenceMs: number },
  ) {
    this.address = address;
    this.info = info;
    this.#conn = conn;
    this.#reader = reader;
    this.#replyTimeoutMs = timeouts.replyTimeoutMs;
    this.#limits = { nEmbd: info.nEmbd, maxBatch: info.maxBatch };
    this.#silence = new SilenceWatch(timeouts.silenceMs, (ms) =>
      this.#fail(
        new StageUnavailableError(
          address,
          `it sent nothing for ${(ms / 1000).toFixed(1)} s (--silence-s ` +
            `${timeouts.silenceMs / 1000}): the worker is stopped, asleep or hung, or the ` +
            `network to it is cut`,
        ),
      ));
    this.#readReplies();
  }

  /** True once the connection has failed or been closed; a new Peer is needed then. */
  get closed(): boolean {
    return this.#failure !== undefined;
  }

  /** Settles, with the reason, when the connection ends: a failure or this side's close. */
  get ended(): Promise<StageUnavailableError> {
    return this.#ended.promise;
  }

  /**
   * Runs positions [base, base+n) of `slot` through the chain; the greedy ids of the positions
   * `options.logits` asks for, plus `options.topk` candidates of the last position, after
   * `options.adjust`.
   */
  async run(
    slot: number,
    rows: Float32Array,
    n: number,
    base: number,
    options: StageRunOptions = {},
    tokens?: Uint32Array,
  ): Promise<RunReply> {
    if (n > this.info.maxBatch) {
      throw new RangeError(
        `Cannot send ${n} rows to ${this.address}: it takes at most ${this.info.maxBatch} per frame`,
      );
    }
    const { topk = 0, adjust, logits, rows: kind, rewindable, candidates } = options;
    const reply = await this.#exchange({
      op: Op.Run,
      slot,
      base,
      n,
      topk,
      rows,
      adjust,
      logits,
      kind,
      rewindable,
      candidates,
      ...(tokens ? { ids: tokens } : {}),
    });
    if (
      reply.op !== Op.Ids || reply.slot !== slot || reply.base !== base ||
      reply.ids.length !== greedyCount(logits, n) || reply.top.length > topk
    ) {
      throw this.#fail(`it answered Run (slot ${slot}, base ${base}, n ${n}) with op ${reply.op}`);
    }
    const every = candidates === "every" && topk > 0;
    if (every !== (reply.tops !== undefined)) {
      throw this.#fail(
        `it answered Run (slot ${slot}, base ${base}, n ${n}) ${
          every ? "without" : "with"
        } every position's candidates`,
      );
    }
    const { ids, top, lse, tops } = reply;
    return { ids, top, lse, ...(tops ? { tops } : {}) };
  }

  /** Snapshots `slot` into `idx` on every stage behind this connection. */
  async save(slot: number, idx: number): Promise<void> {
    const reply = await this.#exchange({ op: Op.Save, slot, idx });
    if (reply.op !== Op.Saved || reply.slot !== slot || reply.idx !== idx) {
      throw this.#fail(`it answered Save (slot ${slot}, idx ${idx}) with op ${reply.op}`);
    }
  }

  /** Restores snapshot `idx` into `slot`; the position the slot continues from. */
  async restore(slot: number, idx: number): Promise<number> {
    const reply = await this.#exchange({ op: Op.Restore, slot, idx });
    if (reply.op !== Op.Restored || reply.slot !== slot || reply.idx !== idx) {
      throw this.#fail(`it answered Restore (slot ${slot}, idx ${idx}) with op ${reply.op}`);
    }
    return reply.position;
  }

  /** Takes `slot` back to `position` inside its last run on every stage behind this connection. */
  async rewind(slot: number, position: number): Promise<void> {
    const reply = await this.#exchange({ op: Op.Rewind, slot, position });
    if (reply.op !== Op.Rewound || reply.slot !== slot || reply.position !== position) {
      throw this.#fail(
        `it answered Rewind (slot ${slot}, position ${position}) with op ${reply.op}`,
      );
    }
  }

  /**
   * Up to `k` drafts of the chain's last stage after `slot`'s position, `id` the token there
   * (engine/stage.ts Stage.draft); none where it drafts nothing.
   */
  async draft(slot: number, id: number, k: number): Promise<Uint32Array> {
    const reply = await this.#exchange({ op: Op.Draft, slot, id, k });
    if (reply.op !== Op.Drafted || reply.slot !== slot || reply.ids.length > k) {
      throw this.#fail(`it answered Draft (slot ${slot}, ${k} tokens) with op ${reply.op}`);
    }
    return reply.ids;
  }

  /**
   * Checks that the chain behind this connection answers, without touching any slot. Replies
   * come in request order, so a PING sent behind a long RUN waits for it. No PONG within
   * `timeoutMs` (default: the reply timeout) ends the connection.
   */
  async ping(timeoutMs?: number): Promise<void> {
    const reply = await this.#exchange({ op: Op.Ping }, timeoutMs);
    if (reply.op !== Op.Pong) throw this.#fail(`it answered Ping with op ${reply.op}`);
  }

  /** Sends CLOSE after the frames already queued (waiting at most 1 s) and closes the socket. */
  close(): void {
    const mine = new StageUnavailableError(this.address, "the connection was closed by this side");
    if (!this.#end(mine)) return;
    const bytes = encodeFrame({ op: Op.Close });
    const sent = this.#writes.then(() => writeAll(this.#conn, bytes));
    deadline(sent, 1000, () => new Error("CLOSE not sent in time"))
      .catch(() => undefined) // The worker treats a dropped connection like CLOSE.
      .finally(() => this.#conn.close());
  }

  #exchange(frame: Frame, timeoutMs = this.#replyTimeoutMs): Promise<Frame> {
    if (this.#failure) return Promise.reject(this.#failure);
    const bytes = encodeFrame(frame, this.info.nEmbd);
    const reply = new Promise<Frame>((resolve, reject) => {
      this.#waiting.push({ resolve, reject, timeoutMs });
    });
    if (this.#waiting.length === 1) this.#armFront();
    const sent = this.#writes.then(() => {
      if (this.#failure) throw this.#failure;
      return writeAll(this.#conn, bytes);
    });
    this.#writes = sent.catch((e) => {
      this.#fail(e);
    });
    return reply;
  }

  /**
   * Reads replies for as long as the connection lives, handing each to the oldest waiting
   * request. The end of the connection, or a frame nobody waits for, fails the connection.
   */
  async #readReplies(): Promise<void> {
    try {
      while (!this.#failure) {
        const frame = await readReply(this.#reader, this.#limits, this.address);
        this.#silence.heard();
        if (frame.op === Op.Alive) continue;
        const waiter = this.#waiting.shift();
        if (!waiter) throw this.#fail(`it sent op ${frame.op} while no reply was due`);
        clearTimeout(waiter.timer);
        this.#armFront();
        waiter.resolve(frame);
      }
    } catch (e) {
      this.#fail(e);
    }
  }

  /** The oldest waiting request's reply timeout runs from when it is next in line. */
  #armFront(): void {
    const front = this.#waiting[0];
    if (!front || front.timer !== undefined) return;
    front.timer = setTimeout(
      () =>
        this.#fail(
          new StageUnavailableError(this.address, `no reply within ${front.timeoutMs} ms`),
        ),
      front.timeoutMs,
    );
  }

  /** Records the connection's first end and rejects every waiting request; false if it had one. */
  #end(failure: StageUnavailableError): boolean {
    if (this.#failure) return false;
    this.#failure = failure;
    this.#silence.stop();
    for (const waiter of this.#waiting.splice(0)) {
      clearTimeout(waiter.timer);
      waiter.reject(failure);
    }
    this.#ended.resolve(failure);
    return true;
  }

  /** Ends the connection with its first failure and returns that failure. */
  #fail(cause: unknown): StageUnavailableError {
    const failure = cause instanceof StageUnavailableError ? cause : new StageUnavailableError(
      this.address,
      cause instanceof Error ? cause.message : String(cause),
      undefined,
      { cause },
    );
    if (this.#end(failure)) this.#conn.close();
    return this.#failure!;
  }
}
