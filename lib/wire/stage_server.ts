// The worker's side of the wire: runs every newcomer's handshake apart from the one client it
// serves, then answers that client's RUN / SAVE / RESTORE / PING frames with its stage (plus the
// rest of the chain behind `next`). Started by worker.ts; every failure becomes an ERROR frame and
// a clean close, never a crash.

import type { Stage } from "../../engine/stage.ts";
import { checkChainLink } from "../../engine/stage_checks.ts";
import { deadline } from "./deadline.ts";
import { AuthMode, ErrorCode, type Frame, type HelloInfo, MAGIC, magicName, Op } from "./frame.ts";
import { FrameReader, writeFrame } from "./frame_stream.ts";
import { freshNonce, NO_PROOF, verifyClientProof, workerProof } from "./hello.ts";
import { FrameWriter } from "./liveness.ts";
import { StageUnavailableError } from "./peer.ts";
import type { RemoteStage } from "./remote_stage.ts";

export interface StageServerOptions {
  /** This worker's own layers. */
  readonly stage: Stage;
  readonly fingerprint: Uint8Array;
  /** When set, clients must prove they hold it (and this worker proves it to them). */
  readonly key?: CryptoKey;
  /** The rest of the chain, for a stage that does not own the last layer. */
  readonly next?: RemoteStage;
  /** Time a new client has to finish the handshake. Default HANDSHAKE_MS. */
  readonly handshakeTimeoutMs?: number;
  /**
   * How long the client may send nothing while none of its requests is outstanding before an
   * authenticated newcomer may take its place. Default LOST_CLIENT_MS.
   */
  readonly lostClientMs?: number;
  readonly log?: (line: string) => void;
}

export interface StageServer {
  /** What HELLO tells clients. */
  readonly info: HelloInfo;
  /** Settles when the listener has closed and the last client is gone. */
  readonly finished: Promise<void>;
  /** Closes the listener and the current client. */
  close(): void;
}

/** A refusal carries its code to the ERROR frame. */
class Refusal extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.code = code;
  }
}

/** The client being served, and how long it has owed this worker a sign that it is there. */
interface Served {
  readonly conn: Deno.TcpConn;
  /** Its requests read and not yet answered. */
  pending: number;
  /** Since when it has sent nothing while none of its requests was pending. */
  quietSince: number;
  /** Dropped as lost for a newcomer; its serve() is winding down. */
  dropped: boolean;
}

/** Per-connection state: what each slot has seen, and which snapshots this client saved. */
interface Session {
  readonly seen: number[];
  readonly saved: Map<number, number>;
}

const REFUSAL_MS = 1000;
/** Socket errors that mean the client is gone (or this side closed it): nothing to answer. */
const GONE = [
  Deno.errors.BrokenPipe,
  Deno.errors.ConnectionReset,
  Deno.errors.Interrupted,
  Deno.errors.BadResource,
];
/**
 * How long a newcomer has for greeting, challenge and proof. A head on a LAN needs a few ms; the
 * bound is what a stranger's silent socket costs: one handshake place, for this long.
 */
export const HANDSHAKE_MS = 2000;
/**
 * Handshakes in flight at once. A newcomer past it takes the place of the oldest one, so silent
 * sockets cannot keep a head out, once that one has had a quarter of the handshake deadline: a
 * younger one is never dropped. Dropping at once let strangers that reconnect as soon as they are
 * dropped churn through every place faster than a head, sharing their event loop or CPU, finished
 * its three messages (CI saw it). Meanwhile the newcomer waits, unaccepted, in the listener's
 * backlog, in arrival order, so a head dialling in takes the next place that ages out.
 */
export const MAX_HANDSHAKES = 64;
/** The share of the handshake deadline during which a handshake place cannot be taken over. */
const HANDSHAKE_HELD_SHARE = 0.25;
/** How long an authenticated newcomer waits for the current client to finish before it is busy. */
const BUSY_GRACE_MS = 1000;
/**
 * A client that has sent nothing for this long while it waited for nothing is gone, though no
 * close reached this worker (its box lost the connection across a cut network, which its close
 * could not cross): a live head PINGs an idle worker every second or so. An authenticated
 * newcomer takes its place instead of being refused as busy until TCP gives up, minutes later.
 */
const LOST_CLIENT_MS = 5000;
/** Authenticated newcomers waiting at once; more are refused as busy straight away. */
const MAX_WAITING = 8;

function chainInfo(options: StageServerOptions): HelloInfo {
  const { stage, next } = options;
  checkChainLink(stage, next);
  return {
    first: stage.first,
    end: stage.nLayer,
    nLayer: stage.nLayer,
    nEmbd: stage.nEmbd,
    slots: stage.slots,
    ctx: stage.ctx,
    maxBatch: stage.maxBatch,
    snapshots: stage.snapshots,
    maxRewind: stage.maxRewind,
    // A middle stage tells its next hop's, once connected (serve).
    drafts: !next && stage.draft !== undefined,
    fingerprint: options.fingerprint,
  };
}

function nameOf(conn: Deno.Conn): string {
  const a = conn.remoteAddr as Deno.NetAddr;
  return `${a.hostname}:${a.port}`;
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch (e) {
    if (!(e instanceof Deno.errors.BadResource)) throw e;
  }
}

/**
 * Sends ERROR, then (with `drain`) half-closes and reads until the client closes, at most 1 s,
 * so the ERROR is not lost to a reset caused by unread bytes; then closes.
 */
async function refuse(
  conn: Deno.Conn,
  refusal: Refusal,
  drain: boolean,
  log: (line: string) => void,
): Promise<void> {
  const scratch = new Uint8Array(4096);
  const limit = () => new Error("the client did not take the refusal in time");
  const frame: Frame = { op: Op.Error, code: refusal.code, message: refusal.message };
  try {
    await deadline(writeFrame(conn, frame), REFUSAL_MS, limit);
    if (drain) {
      await conn.closeWrite();
      await deadline(
        (async () => {
          while (await conn.read(scratch) !== null);
        })(),
        REFUSAL_MS,
        limit,
      );
    }
  } catch (e) {
    log(`could not deliver the refusal to ${nameOf(conn)}: ${(e as Error).message}`);
  } finally {
    closeQuietly(conn);
  }
}

/**
 * True when `answer` settles before `read` does (or both already have): the reply is written
 * first, so a client that waits for it before sending more is never kept waiting.
 */
async function firstIsOlder(answer: Promise<unknown>, read: Promise<unknown>): Promise<boolean> {
  const settled = (p: Promise<unknown>) => p.then(() => true, () => true);
  return await Promise.race([settled(answer), settled(read).then(() => false)]);
}

function refusalOf(e: unknown): Refusal {
  if (e instanceof Refusal) return e;
  if (e instanceof StageUnavailableError) return new Refusal(ErrorCode.Downstream, e.message);
  if (e instanceof SyntaxError) return new Refusal(ErrorCode.Malformed, e.message);
  if (e instanceof RangeError) return new Refusal(ErrorCode.Range, e.message);
  return new Refusal(ErrorCode.Engine, `The stage failed: ${(e as Error)?.message ?? e}`);
}

/** Starts serving `listener`. */
export function serveStage(
  listener: Deno.Listener<Deno.TcpConn>,
  options: StageServerOptions,
): StageServer {
  const info = chainInfo(options);
  const log = options.log ?? (() => undefined);
  const handshakeMs = options.handshakeTimeoutMs ?? HANDSHAKE_MS;
  const lostClientMs = options.lostClientMs ?? LOST_CLIENT_MS;
  const limits = { nEmbd: info.nEmbd, maxBatch: info.maxBatch };
  const heldMs = handshakeMs * HANDSHAKE_HELD_SHARE;
  /** Connections in their handshake, oldest first, with their names and start times. */
  const handshakes = new Map<Deno.TcpConn, { who: string; since: number }>();
  /** Settled whenever a handshake place frees up (or the server closes), then renewed. */
  let placeFreed = Promise.withResolvers<void>();
  let client: Served | undefined;
  let idle = Promise.withResolvers<void>();
  let waiting = 0;
  let closed = false;

  /** Greeting, challenge and the client's proof; the two nonces, or null if the client left. */
  async function handshake(
    conn: Deno.Conn,
    reader: FrameReader,
  ): Promise<{ nonceC: Uint8Array; nonceS: Uint8Array } | null> {
    const greeting = await reader.readGreeting(MAGIC);
    if (greeting === null) return null;
    if (greeting.magic !== MAGIC) {
      throw new Refusal(
        ErrorCode.Version,
        `Cannot accept the client: its greeting starts with ${magicName(greeting.magic)}, ` +
          `expected ${magicName(MAGIC)}; run the same tandem version on both sides`,
      );
    }
    const nonceS = freshNonce();
    const auth = options.key ? AuthMode.HmacSha256 : AuthMode.None;
    await writeFrame(conn, { op: Op.Challenge, magic: MAGIC, auth, nonce: nonceS });
    // Only AUTH's 32 bytes are read before the proof: a stranger's RUN header sizes nothing.
    const reply = await reader.readFrame(limits, Op.Auth);
    if (reply?.op !== Op.Auth) return null;
    const nonceC = greeting.nonce;
    if (options.key && !await verifyClientProof(options.key, nonceC, nonceS, reply.proof)) {
      throw new Refusal(
        ErrorCode.Auth,
        "Cannot accept the client: its key proof does not match this worker's key; give both " +
          "sides the same --key-file",
      );
    }
    return { nonceC, nonceS };
  }

  async function answer(frame: Frame, session: Session): Promise<Frame | undefined> {
    const { stage, next } = options;
    const checkSlot = (slot: number) => {
      if (slot >= info.slots) {
        throw new RangeError(`Cannot use slot ${slot}: this worker has slots 0..${info.slots - 1}`);
      }
    };
    switch (frame.op) {
      case Op.Run: {
        const { slot, base, n, topk, adjust, logits, kind, rewindable, candidates } = frame;
        checkSlot(slot);
        if (base + n > info.ctx) {
          throw new RangeError(
            `Cannot run positions ${base}..${base + n} of slot ${slot}: the context is ${info.ctx}`,
          );
        }
        if (base !== 0 && base !== session.seen[slot]) {
          throw new RangeError(
            `Cannot run slot ${slot} from position ${base}: it has seen ${session.seen[slot]} ` +
              `positions on this connection; send each position once, in order, or restart at base 0`,
          );
        }
        // Counted now, before the run: a RUN read while this one is on the GPU is checked
        // against it.
        session.seen[slot] = base + n;
        const run = { topk, adjust, logits, rows: kind, rewindable, candidates };
        const tokens = frame.ids ? { ids: frame.ids } : {};
        let out = await stage.run(
          slot,
          { kind: "hidden", rows: frame.rows, ...tokens },
          n,
          base,
          run,
        );
        if (out.kind === "hidden" && next) {
          out = await next.run(slot, { kind: "hidden", rows: out.rows, ...tokens }, n, base, run);
        }
        if (out.kind !== "ids") {
          throw new TypeError(`Stage ${stage.first}..${stage.end} returned hidden rows, not ids`);
        }
        const { ids, top, lse, tops } = out;
        return { op: Op.Ids, slot, base, ids, top, lse, ...(tops ? { tops } : {}) };
      }
      case Op.Save: {
        checkSlot(frame.slot);
        await Promise.all([stage.save(frame.slot, frame.idx), next?.save(frame.slot, frame.idx)]);
        session.saved.set(frame.idx, session.seen[frame.slot]);
        return { op: Op.Saved, slot: frame.slot, idx: frame.idx };
      }
      case Op.Restore: {
        const { slot, idx } = frame;
        checkSlot(slot);
        const expected = session.saved.get(idx);
        if (expected === undefined) {
          throw new RangeError(
            `Cannot restore snapshot ${idx}: it was not saved on this connection`,
          );
        }
        const [position, behind] = await Promise.all([
          stage.restore(slot, idx),
          next?.restore(slot, idx),
        ]);
        if (position !== expected || (behind !== undefined && behind !== position)) {
          throw new TypeError(
            `Cannot restore snapshot ${idx}: it was saved at position ${expected}, but this stage ` +
              `restored ${position}${behind === undefined ? "" : ` and the next stage ${behind}`}`,
          );
        }
        session.seen[slot] = position;
        return { op: Op.Restored, slot, idx, position };
      }
      case Op.Rewind: {
        const { slot, position } = frame;
        checkSlot(slot);
        // The next stage rewinds after this one has accepted: a refusal changes nothing.
        await stage.rewind(slot, position);
        await next?.rewind(slot, position);
        session.seen[slot] = position;
        return { op: Op.Rewound, slot, position };
      }
      case Op.Draft: {
        const { slot, id, k } = frame;
        checkSlot(slot);
        const drafter = next ?? stage;
        const ids = drafter.draft ? await drafter.draft(slot, id, k) : new Uint32Array();
        return { op: Op.Drafted, slot, ids };
      }
      case Op.Ping:
        // A middle stage answers for the whole chain, as RUN does: a dead hop behind it then
        // shows at the head's idle probe, not at its next request.
        await next?.ping();
        return { op: Op.Pong };
      case Op.Close:
        return undefined;
      default:
        throw new SyntaxError(`Cannot answer op ${frame.op}: it is not a request`);
    }
  }

  /**
   * Logs and answers a failure on `conn` (nothing for a client that is gone), then closes it.
   * `reading`: a read is still pending on `conn`, so there is nothing to drain.
   */
  async function fail(conn: Deno.Conn, who: string, e: unknown, reading = false): Promise<void> {
    if (GONE.some((kind) => e instanceof kind)) {
      log(`${who} went away: ${(e as Error).message}`);
      return closeQuietly(conn);
    }
    const refusal = refusalOf(e);
    log(`refused ${who}: ${refusal.message}`);
    // After a timeout a read is still pending on `conn` too.
    await refuse(conn, refusal, !reading && refusal.code !== ErrorCode.Timeout, log);
  }

  /**
   * Runs the handshake of a newcomer in one of MAX_HANDSHAKES places, apart from the client being
   * served, so a stranger that never proves the key holds nothing the head needs. Only a client
   * that passed it goes on to admit().
   */
  async function greet(conn: Deno.TcpConn): Promise<void> {
    const who = nameOf(conn);
    if (handshakes.size >= MAX_HANDSHAKES) {
      const [oldest, { who: oldestName }] = handshakes.entries().next().value!;
      handshakes.delete(oldest);
      log(`dropped ${oldestName}: ${MAX_HANDSHAKES} handshakes are in flight and it is the oldest`);
      closeQuietly(oldest);
    }
    handshakes.set(conn, { who, since: performance.now() });
    conn.setNoDelay(true);
    conn.setKeepAlive(true);
    const reader = new FrameReader(conn);
    let nonces: { nonceC: Uint8Array; nonceS: Uint8Array } | null;
    try {
      nonces = await deadline(
        handshake(conn, reader),
        handshakeMs,
        () =>
          new Refusal(
            ErrorCode.Timeout,
            `Cannot accept the client: no hello within ${handshakeMs} ms`,
          ),
      );
    } catch (e) {
      // A connection dropped for a newer one is already closed: its read fails, nothing to say.
      if (!handshakes.has(conn)) return;
      leavePlace(conn);
      return await fail(conn, who, e);
    }
    leavePlace(conn);
    if (nonces === null) {
      log(`${who} left during the hello`);
      return closeQuietly(conn);
    }
    await admit(conn, reader, nonces);
  }

  /**
   * Serves an authenticated client: HELLO, then its requests until it leaves. Replies go out in
   * request order, but a RUN starts as soon as it is read, while the ones before it still run
   * (up to one per slot): a head driving several sequences through this worker finds the next
   * one's step queued on the GPU behind the last, instead of waiting for its reply to be
   * written and the next frame read. Other requests are answered alone, after everything
   * before them and before anything after them.
   */
  async function serve(
    served: Served,
    reader: FrameReader,
    nonces: { nonceC: Uint8Array; nonceS: Uint8Array },
  ): Promise<void> {
    const { conn } = served;
    const who = nameOf(conn);
    /** The next frame being read, while it is. */
    let reading: Promise<Frame | null> | undefined;
    let writer: FrameWriter | undefined;
    try {
      const behind = await options.next?.connect();
      // Whether the chain drafts is its last stage's to say.
      const hello = behind ? { ...info, drafts: behind.drafts } : info;
      const proof = options.key
        ? await workerProof(options.key, nonces.nonceC, nonces.nonceS, hello)
        : NO_PROOF;
      // From the hello on, ALIVE goes out whenever nothing else has for a while (liveness.ts).
      writer = new FrameWriter(conn);
      await writer.send({ op: Op.Hello, info: hello, proof });
      log(`${who} connected`);
      const session: Session = { seen: new Array(info.slots).fill(0), saved: new Map() };
      /** Answers not yet written, in request order. */
      const answering: Promise<Frame | undefined>[] = [];
      /** Writes the oldest answer; false once the client closed. */
      const reply = async (): Promise<boolean> => {
        const frame = await answering.shift()!;
        if (--served.pending === 0) served.quietSince = performance.now();
        if (frame === undefined) {
          log(`${who} closed`);
          return false;
        }
        await writer!.send(frame);
        return true;
      };
      while (true) {
        if (!reading && answering.length < info.slots) {
          reading = reader.readFrame(limits);
          // Settled through `reading` below; a read cut short by a failure is nobody's error.
          reading.catch(() => {});
        }
        if (answering.length && (!reading || await firstIsOlder(answering[0], reading))) {
          if (!await reply()) return;
          continue;
        }
        const next = reading!;
        reading = undefined;
        let frame: Frame | null;
        try {
          frame = await next;
          served.quietSince = performance.now();
        } catch (e) {
          // The requests read before a bad frame are answered before the refusal,
          while (answering.length) if (!await reply()) return;
          throw e;
        }
        if (frame === null) {
          // and those read before the end of the input before the close.
          while (answering.length) if (!await reply()) return;
          log(`${who} went away`);
          return;
        }
        const alone = frame.op !== Op.Run;
        if (alone) {
          while (answering.length) if (!await reply()) return;
        }
        const answered = answer(frame, session);
        // Settled through `answering` by reply(); its failure is caught there.
        answered.catch(() => {});
        answering.push(answered);
        served.pending++;
        if (alone && !await reply()) return;
      }
    } catch (e) {
      // The refusal is written after the frames queued before it, and no ALIVE follows it.
      await writer?.stop();
      await fail(conn, who, e, reading !== undefined);
    } finally {
      await writer?.stop();
      options.next?.disconnect();
      closeQuietly(conn);
    }
  }

  /**
   * Serves an authenticated `conn` once no other client is served. A client that just closed is
   * usually still being wound down here when its successor (its own reconnect) arrives, so a
   * newcomer waits up to BUSY_GRACE_MS for the current client to finish before it is refused.
   * A client lost without a close (see LOST_CLIENT_MS) is dropped for the newcomer.
   */
  async function admit(
    conn: Deno.TcpConn,
    reader: FrameReader,
    nonces: { nonceC: Uint8Array; nonceS: Uint8Array },
  ): Promise<void> {
    if (client) {
      const busy = () =>
        new Refusal(
          ErrorCode.Busy,
          `Cannot accept the client: this worker serves ${nameOf(client!.conn)} and takes one ` +
            `client at a time`,
        );
      if (waiting >= MAX_WAITING) return await fail(conn, nameOf(conn), busy());
      waiting++;
      try {
        const until = Date.now() + BUSY_GRACE_MS;
        while (client && Date.now() < until) {
          const silent = performance.now() - client.quietSince;
          if (!client.dropped && client.pending === 0 && silent >= lostClientMs) {
            log(
              `dropped ${nameOf(client.conn)}: it sent nothing for ${
                (silent / 1000).toFixed(1)
              } s ` +
                `with nothing outstanding, so it is gone; ${nameOf(conn)} takes its place`,
            );
            client.dropped = true;
            closeQuietly(client.conn);
          }
          const late = () => new Error("busy");
          await deadline(idle.promise, until - Date.now(), late).catch(() => undefined);
        }
        if (client) return await fail(conn, nameOf(conn), busy());
      } finally {
        waiting--;
      }
    }
    if (closed) return closeQuietly(conn);
    client = { conn, pending: 0, quietSince: performance.now(), dropped: false };
    idle = Promise.withResolvers<void>();
    try {
      await serve(client, reader, nonces);
    } finally {
      client = undefined;
      idle.resolve();
    }
  }

  function leavePlace(conn: Deno.TcpConn): void {
    handshakes.delete(conn);
    placeFreed.resolve();
    placeFreed = Promise.withResolvers<void>();
  }

  /** Waits until a newcomer may have a handshake place: a free one, or the oldest held long enough. */
  async function placeForNewcomer(): Promise<void> {
    while (!closed && handshakes.size >= MAX_HANDSHAKES) {
      const [{ since }] = handshakes.values();
      const wait = since + heldMs - performance.now();
      if (wait <= 0) return;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const aged = new Promise<void>((resolve) => timer = setTimeout(resolve, wait));
      await Promise.race([aged, placeFreed.promise]);
      clearTimeout(timer);
    }
  }

  async function acceptAll(): Promise<void> {
    const running = new Set<Promise<void>>();
    try {
      for (;;) {
        await placeForNewcomer();
        if (closed) break;
        const conn = await listener.accept();
        const task = greet(conn).finally(() => running.delete(task));
        running.add(task);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.BadResource)) throw e;
    }
    await Promise.all(running);
  }

  const finished = acceptAll();
  return {
    info,
    finished,
    close() {
      closed = true;
      try {
        listener.close();
      } catch (e) {
        if (!(e instanceof Deno.errors.BadResource)) throw e;
      }
      if (client) closeQuietly(client.conn);
      for (const conn of handshakes.keys()) closeQuietly(conn);
      placeFreed.resolve();
    },
  };
}
