// Frames between stages: the byte layout, encode and decode (pure, over DataView, little-endian).
// Used by lib/wire/frame_stream.ts (TCP bytes ↔ frames), lib/wire/peer.ts (head side), stage_server.ts.
//
// The connection opens with the client's 36-byte greeting (not a frame): u32 MAGIC, 32-byte
// nonce. Everything after it, both ways, is a frame: a 32-byte header of eight u32 words, then a
// payload whose length follows from the op and the header alone (so it is known, and capped,
// before a byte of it is read). Words an op does not use must be 0.
//
// | op   | name      | dir | slot | n            | base          | topk      | payload                          |
// |------|-----------|-----|------|--------------|---------------|-----------|----------------------------------|
// | 1    | RUN       | →   | slot | rows, 1..max | first pos.    | pairs     | n·D f32 hidden rows [base,base+n)|
// |      |           |     |      |              |               |           | then mask u32 words, then bias × |
// |      |           |     |      |              |               |           | (u32 id, f32 bias, repeat, subtr)|
// | 2    | CLOSE     | →   | 0    | 0            | 0             | 0         | none                             |
// | 3    | SAVE      | →   | slot | 0            | snapshot idx  | 0         | none                             |
// | 4    | RESTORE   | →   | slot | 0            | snapshot idx  | 0         | none                             |
// | 5    | AUTH      | →   | 0    | 0            | 0             | 0         | 32-byte HMAC proof (zeros: none) |
// | 7    | PING      | →   | 0    | 0            | 0             | 0         | none                             |
// | 8    | REWIND    | →   | slot | 0            | position      | 0         | none                             |
// | 9    | DRAFT     | →   | slot | drafts, 1..max| 0            | 0         | u32 id: the token at the slot's  |
// |      |           |     |      |              |               |           | position                         |
// | 0x81 | IDS       | ←   | slot | ids, 0..max  | first pos.    | pairs     | n u32 greedy ids, then topk ×    |
// |      |           |     |      |              |               |           | (u32 id, f32 logit), descending, |
// |      |           |     |      |              |               |           | then (topk > 0) f32 log-sum-exp  |
// | 0x83 | SAVED     | ←   | slot | 0            | snapshot idx  | 0         | none                             |
// | 0x84 | RESTORED  | ←   | slot | position     | snapshot idx  | 0         | none                             |
// | 0x89 | REWOUND   | ←   | slot | 0            | position      | 0         | none                             |
// | 0x8A | DRAFTED   | ←   | slot | ids, 0..max  | 0             | 0         | n u32 drafted ids                |
// | 0x87 | PONG      | ←   | 0    | 0            | 0             | 0         | none                             |
// | 0x88 | ALIVE     | ←   | 0    | 0            | 0             | 0         | none                             |
// | 0x85 | CHALLENGE | ←   | 0    | 0            | 0             | 0         | u32 MAGIC, u32 auth, 32-byte     |
// |      |           |     |      |              |               |           | nonce (40 bytes)                 |
// | 0x86 | HELLO     | ←   | 0    | 0            | 0             | 0         | 10 × u32 (first, end, nLayer,    |
// |      |           |     |      |              |               |           | nEmbd, slots, ctx, maxBatch,     |
// |      |           |     |      |              |               |           | snapshots, maxRewind, drafts),   |
// |      |           |     |      |              |               |           | 32-byte fingerprint, 32-byte     |
// |      |           |     |      |              |               |           | proof (104)                      |
// | 0xFF | ERROR     | ←   | 0    | message bytes| 0             | 0         | u32 code, then n bytes UTF-8     |
//
// The last three header words, `mask`, `bias` and `logits`, are used by RUN alone: the u32 words
// of its allowed-token mask (0: every token) and its bias record count, both applied to the last
// position's logits by the last stage (engine/stage.ts LogitAdjust), and in `logits` which
// positions the last stage computes logits for (engine/stage.ts LogitPositions: 0 all, 1 last,
// 2 none) in its low byte and, in bit 8 (ROWS_DECODE), that the rows are generated tokens rather
// than a prompt's (engine/stage.ts RowKind: which products compute them), in bit 9
// (ROWS_REWINDABLE) that every stage keeps what a REWIND into the run needs, in bit 10
// (EVERY_TOP) that the top-k of every position comes back, not only the last's, in bit 11
// (WITH_IDS) that the rows' n token ids follow them (for a last stage drafting with the model's
// MTP block, which embeds them; HELLO's drafts word says one does). IDS holds the
// greedy ids of those positions: n of a RUN's n rows, 1 or 0; with EVERY_TOP in its own logits
// word, the topk pairs of each of its n positions in turn, then the last one's log-sum-exp. REWIND takes the slot back into
// its last RUN on every stage behind the worker (engine/stage.ts Stage.rewind). DRAFT asks the
// last stage for up to n drafts after the slot's position (engine/stage.ts Stage.draft).
//
// → client to worker, ← worker to client. D (n_embd) and the largest n are the worker's, learnt
// by the client from HELLO. `end` in HELLO is one past the last layer served through that
// connection (the whole chain behind it). RESTORED's n is the position the slot continues from.
// PING asks the worker (and, through a middle stage, the chain behind it) for a PONG; it touches
// no slot. ALIVE is the worker's sign of life, unasked: it answers nothing and may come between
// any two frames (ALIVE_MS says how often).

import {
  BIAS_RECORD_BYTES,
  defaultRows,
  encodeBias,
  LOGIT_POSITIONS,
  type LogitAdjust,
  type LogitBias,
  type LogitPositions,
  MAX_BIAS_PAIRS,
  MAX_MASK_WORDS,
  MAX_TOPK,
  type RowKind,
  type StageShape,
  type TopEntry,
} from "../../engine/stage.ts";

/** Greeting magic: the bytes "TDM8" on the wire. Bump it on any change to this file's layout. */
export const MAGIC = 0x384d4454;
export const HEADER_BYTES = 32;
export const NONCE_BYTES = 32;
export const GREETING_BYTES = 4 + NONCE_BYTES;
export const PROOF_BYTES = 32;
export const FINGERPRINT_BYTES = 32;
/** Longest ERROR message in bytes; longer messages are cut by the encoder. */
export const MAX_MESSAGE_BYTES = 4096;
/**
 * Largest payload of any frame. A RUN of 512 rows of a 8192-wide model is 16 MiB; the cap keeps a
 * peer's HELLO (maxBatch, nEmbd are its own numbers) from sizing a larger read on the other side.
 */
export const MAX_PAYLOAD_BYTES = 256 * 1024 * 1024;
/**
 * A worker serving a client writes a frame at least this often, ALIVE when it has nothing else
 * to send, also while one step runs for seconds: a client that hears nothing for several times
 * this long knows the worker (or the network to it) has stopped, whatever the step's length.
 */
export const ALIVE_MS = 500;

const CHALLENGE_BYTES = 8 + NONCE_BYTES;
const HELLO_WORDS = 10;
const HELLO_BYTES = HELLO_WORDS * 4 + FINGERPRINT_BYTES + PROOF_BYTES;

export enum Op {
  Run = 1,
  Close = 2,
  Save = 3,
  Restore = 4,
  Auth = 5,
  Ping = 7,
  Rewind = 8,
  Draft = 9,
  Ids = 0x81,
  Saved = 0x83,
  Restored = 0x84,
  Challenge = 0x85,
  Hello = 0x86,
  Pong = 0x87,
  Alive = 0x88,
  Rewound = 0x89,
  Drafted = 0x8a,
  Error = 0xff,
}

/** Why a worker refused; the head maps these to its own errors. */
export enum ErrorCode {
  /** The bytes do not form a frame of this protocol (unknown op, bad field, short payload). */
  Malformed = 1,
  /** The greeting's magic is not MAGIC: the peer speaks another protocol version. */
  Version = 2,
  /** The client's key proof does not match. */
  Auth = 3,
  /** Another client holds the worker. */
  Busy = 4,
  /** A slot, position, length or snapshot index outside what the worker serves. */
  Range = 5,
  /** The next stage is down, refused the hello, or failed the request. */
  Downstream = 6,
  /** The stage engine failed. */
  Engine = 7,
  /** The client did not finish the handshake in time. */
  Timeout = 8,
}

/** 0: the worker takes anyone (loopback or --insecure); 1: HMAC-SHA256 challenge-response. */
export enum AuthMode {
  None = 0,
  HmacSha256 = 1,
}

/** What a worker (and the chain behind it) serves, as told in HELLO. */
export interface HelloInfo extends StageShape {
  /** Snapshot places 0..snapshots-1 that SAVE and RESTORE accept on every stage behind it. */
  readonly snapshots: number;
  /** The chain's last stage drafts with the model's MTP block: RUN carries token ids to it. */
  readonly drafts: boolean;
  readonly fingerprint: Uint8Array;
}

export type Frame =
  | {
    readonly op: Op.Run;
    readonly slot: number;
    readonly base: number;
    readonly n: number;
    readonly topk: number;
    readonly rows: Float32Array;
    readonly adjust?: LogitAdjust;
    /** Absent: "all". */
    readonly logits?: LogitPositions;
    /** What the rows are; absent when encoding: defaultRows(n); always set when decoded. */
    readonly kind?: RowKind;
    /** Keep what a REWIND into the run needs (engine/stage.ts StageRunOptions.rewindable). */
    readonly rewindable?: boolean;
    /** engine/stage.ts StageRunOptions.candidates; absent: "last". */
    readonly candidates?: "last" | "every";
    /** The tokens at the rows' positions (WITH_IDS), for a last stage that drafts. */
    readonly ids?: Uint32Array;
  }
  | { readonly op: Op.Close | Op.Ping | Op.Pong | Op.Alive }
  | { readonly op: Op.Save | Op.Restore; readonly slot: number; readonly idx: number }
  | { readonly op: Op.Rewind | Op.Rewound; readonly slot: number; readonly position: number }
  | { readonly op: Op.Draft; readonly slot: number; readonly id: number; readonly k: number }
  | { readonly op: Op.Drafted; readonly slot: number; readonly ids: Uint32Array }
  | { readonly op: Op.Auth; readonly proof: Uint8Array }
  | {
    readonly op: Op.Ids;
    readonly slot: number;
    readonly base: number;
    readonly ids: Uint32Array;
    readonly top: readonly TopEntry[];
    /** The log-sum-exp of the last position's logits: NaN (not sent) when top is empty. */
    readonly lse: number;
    /** Every position's top-k, the last one's being `top` (a RUN with EVERY_TOP). */
    readonly tops?: readonly (readonly TopEntry[])[];
  }
  | { readonly op: Op.Saved; readonly slot: number; readonly idx: number }
  | {
    readonly op: Op.Restored;
    readonly slot: number;
    readonly idx: number;
    readonly position: number;
  }
  | {
    readonly op: Op.Challenge;
    readonly magic: number;
    readonly auth: AuthMode;
    readonly nonce: Uint8Array;
  }
  | { readonly op: Op.Hello; readonly info: HelloInfo; readonly proof: Uint8Array }
  | { readonly op: Op.Error; readonly code: ErrorCode; readonly message: string };

/** The eight header words as sent. */
export interface Header {
  readonly op: number;
  readonly slot: number;
  readonly n: number;
  readonly base: number;
  readonly topk: number;
  readonly mask: number;
  readonly bias: number;
  /** RUN's LogitPositions as its index in LOGIT_POSITIONS. */
  readonly logits: number;
}

const HEADER_FIELDS = ["op", "slot", "n", "base", "topk", "mask", "bias", "logits"] as const;
/** The header words every op but RUN leaves at 0. */
const RUN_FIELDS = ["mask", "bias", "logits"] as const;

/** Sizes that bound a frame: the D of RUN rows and the largest n of RUN and IDS. */
export interface FrameLimits {
  readonly nEmbd: number;
  readonly maxBatch: number;
}

const U32_MAX = 0xffff_ffff;

// Hidden rows (megabytes per prefill chunk) are copied as raw bytes, which is little-endian
// f32 exactly when the host is; every platform Deno ships for is.
if (new Uint8Array(Uint16Array.of(1).buffer)[0] !== 1) {
  throw new Error("Cannot use the tandem wire on a big-endian host: frames carry raw LE f32 rows");
}
const utf8 = new TextEncoder();
const utf8Strict = new TextDecoder("utf-8", { fatal: true });

export function decodeHeader(bytes: Uint8Array): Header {
  if (bytes.length !== HEADER_BYTES) {
    throw new SyntaxError(
      `Cannot decode frame header: got ${bytes.length} bytes, expected ${HEADER_BYTES}`,
    );
  }
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const word = (i: number) => v.getUint32(4 * i, true);
  return {
    op: word(0),
    slot: word(1),
    n: word(2),
    base: word(3),
    topk: word(4),
    mask: word(5),
    bias: word(6),
    logits: word(7),
  };
}

/** An op's name for messages (Run, Hello, …), or its hex value when it is not one. */
export function opName(op: number): string {
  return Op[op] ?? `0x${op.toString(16)}`;
}

function requireZero(h: Header, fields: readonly (keyof Header)[]): void {
  for (const f of fields) {
    if (h[f] !== 0) {
      throw new SyntaxError(
        `Cannot decode ${opName(h.op)} frame: header field ${f} is ${h[f]}, expected 0`,
      );
    }
  }
}

function requireRunFields(h: Header): void {
  if (h.mask > MAX_MASK_WORDS || h.bias > MAX_BIAS_PAIRS) {
    throw new RangeError(
      `Cannot decode ${opName(h.op)} frame: mask is ${h.mask} words and bias ${h.bias} records, ` +
        `expected at most ${MAX_MASK_WORDS} and ${MAX_BIAS_PAIRS}`,
    );
  }
  const flags = ROWS_DECODE | ROWS_REWINDABLE | EVERY_TOP | WITH_IDS;
  if ((h.logits & ~(flags | 0xff)) !== 0 || (h.logits & 0xff) >= LOGIT_POSITIONS.length) {
    throw new SyntaxError(
      `Cannot decode ${opName(h.op)} frame: logits is ${h.logits}, expected ` +
        LOGIT_POSITIONS.map((p, i) => `${i} (${p})`).join(", ") +
        `, plus ${ROWS_DECODE} for generated tokens' rows, ${ROWS_REWINDABLE} for a rewindable run ` +
        `, ${EVERY_TOP} for every position's candidates and ${WITH_IDS} for the rows' token ids`,
    );
  }
}

/** RUN's n, and IDS's (0 answers a RUN that asked for no logits), against their caps. */
function requireCount(h: Header, limits: FrameLimits, least: 0 | 1): void {
  if (h.n < least || h.n > limits.maxBatch) {
    throw new RangeError(
      `Cannot decode ${opName(h.op)} frame: n is ${h.n}, expected ${least}..${limits.maxBatch} ` +
        `(split longer runs into chunks of at most ${limits.maxBatch})`,
    );
  }
  if (h.topk > MAX_TOPK) {
    throw new RangeError(
      `Cannot decode ${opName(h.op)} frame: topk is ${h.topk}, expected at most ${MAX_TOPK}`,
    );
  }
  if (h.base + h.n > U32_MAX) {
    throw new RangeError(
      `Cannot decode ${opName(h.op)} frame: positions ${h.base}+${h.n} overflow a u32`,
    );
  }
}

function requirePayload(h: Header, bytes: number, what: string): number {
  if (bytes > MAX_PAYLOAD_BYTES) {
    throw new RangeError(
      `Cannot decode ${opName(h.op)} frame: its payload (${what} = ${bytes} bytes) is over the ` +
        `${MAX_PAYLOAD_BYTES}-byte frame limit; use a smaller --max-batch`,
    );
  }
  return bytes;
}

/**
 * Payload bytes that follow `h`, after checking every header word against the op and `limits`.
 * Throws SyntaxError (unknown op, nonzero unused word) or RangeError (a count above its cap), so
 * nothing is ever allocated from an unchecked number.
 */
export function payloadLength(h: Header, limits: FrameLimits): number {
  switch (h.op) {
    case Op.Run:
      requireCount(h, limits, 1);
      requireRunFields(h);
      return requirePayload(
        h,
        h.n * limits.nEmbd * 4 + idsBytes(h) + h.mask * 4 + h.bias * BIAS_RECORD_BYTES,
        `n ${h.n} × D ${limits.nEmbd} × 4 + ids ${
          idsBytes(h)
        } + mask ${h.mask} × 4 + bias ${h.bias} × ${BIAS_RECORD_BYTES}`,
      );
    case Op.Ids: {
      requireCount(h, limits, 0);
      requireZero(h, ["mask", "bias"]);
      if (h.logits !== 0 && h.logits !== EVERY_TOP) {
        throw new SyntaxError(
          `Cannot decode Ids frame: header field logits is ${h.logits}, expected 0 or ${EVERY_TOP}`,
        );
      }
      const tops = h.logits === EVERY_TOP ? h.n : 1;
      return requirePayload(
        h,
        h.n * 4 + tops * h.topk * 8 + (h.topk > 0 ? 4 : 0),
        `n ${h.n} × 4 + ${tops} × topk ${h.topk} × 8`,
      );
    }
    case Op.Close:
    case Op.Ping:
    case Op.Pong:
    case Op.Alive:
      requireZero(h, ["slot", "n", "base", "topk", ...RUN_FIELDS]);
      return 0;
    case Op.Draft:
    case Op.Drafted:
      requireCount(h, limits, h.op === Op.Draft ? 1 : 0);
      requireZero(h, ["base", "topk", ...RUN_FIELDS]);
      return h.op === Op.Draft ? 4 : 4 * h.n;
    case Op.Challenge:
    case Op.Hello:
      requireZero(h, ["slot", "n", "base", "topk", ...RUN_FIELDS]);
      return h.op === Op.Challenge ? CHALLENGE_BYTES : HELLO_BYTES;
    case Op.Auth:
      requireZero(h, ["slot", "n", "base", "topk", ...RUN_FIELDS]);
      return PROOF_BYTES;
    case Op.Save:
    case Op.Restore:
    case Op.Saved:
    case Op.Rewind:
    case Op.Rewound:
      requireZero(h, ["n", "topk", ...RUN_FIELDS]);
      return 0;
    case Op.Restored:
      requireZero(h, ["topk", ...RUN_FIELDS]);
      return 0;
    case Op.Error:
      requireZero(h, ["slot", "base", "topk", ...RUN_FIELDS]);
      if (h.n > MAX_MESSAGE_BYTES) {
        throw new RangeError(
          `Cannot decode Error frame: message is ${h.n} bytes, expected at most ${MAX_MESSAGE_BYTES}`,
        );
      }
      return 4 + h.n;
    default:
      throw new SyntaxError(`Cannot decode frame: unknown op ${opName(h.op)}`);
  }
}

function decodeRows(payload: Uint8Array, n: number, nEmbd: number): Float32Array {
  const rows = new Float32Array(n * nEmbd);
  new Uint8Array(rows.buffer).set(payload);
  for (let i = 0; i < rows.length; i++) {
    if (!Number.isFinite(rows[i])) {
      throw new SyntaxError(
        `Cannot decode Run frame: hidden value ${i % nEmbd} of row ${Math.floor(i / nEmbd)} is ${
          rows[i]
        }; a stage only passes finite activations`,
      );
    }
  }
  return rows;
}

function decodeHello(v: DataView, bytes: Uint8Array): Frame {
  const w = (i: number) => v.getUint32(i * 4, true);
  const at = HELLO_WORDS * 4;
  return {
    op: Op.Hello,
    info: {
      first: w(0),
      end: w(1),
      nLayer: w(2),
      nEmbd: w(3),
      slots: w(4),
      ctx: w(5),
      maxBatch: w(6),
      snapshots: w(7),
      maxRewind: w(8),
      drafts: decodeFlag(w(9), "drafts"),
      fingerprint: bytes.slice(at, at + FINGERPRINT_BYTES),
    },
    proof: bytes.slice(at + FINGERPRINT_BYTES, HELLO_BYTES),
  };
}

/** A HELLO word that is 0 or 1. */
function decodeFlag(word: number, name: string): boolean {
  if (word > 1) {
    throw new SyntaxError(`Cannot decode Hello frame: ${name} is ${word}, expected 0 or 1`);
  }
  return word === 1;
}

/** Bytes of RUN's token ids: n u32 with WITH_IDS, else none. */
function idsBytes(h: Header): number {
  return h.op === Op.Run && h.logits & WITH_IDS ? 4 * h.n : 0;
}

/** n u32 words from byte `at`. */
function decodeWords(v: DataView, at: number, n: number): Uint32Array {
  const words = new Uint32Array(n);
  for (let i = 0; i < n; i++) words[i] = v.getUint32(at + 4 * i, true);
  return words;
}

/**
 * RUN's mask words and bias records after its rows; their numbers must be finite (the last stage
 * checks their ranges). A record's repeat 1 and subtract 0 are left out, as encodeBias reads them.
 */
function decodeAdjust(v: DataView, at: number, h: Header): LogitAdjust {
  const mask = new Uint32Array(h.mask);
  for (let i = 0; i < h.mask; i++) mask[i] = v.getUint32(at + 4 * i, true);
  const bias: LogitBias[] = [];
  for (let i = 0; i < h.bias; i++) {
    const p = at + 4 * h.mask + BIAS_RECORD_BYTES * i;
    const [b, repeat, subtract] = [4, 8, 12].map((o) => v.getFloat32(p + o, true));
    if (![b, repeat, subtract].every(Number.isFinite)) {
      throw new SyntaxError(
        `Cannot decode Run frame: bias record ${i} holds ${b}, ${repeat}, ${subtract}; ` +
          `expected finite numbers`,
      );
    }
    bias.push({
      id: v.getUint32(p, true),
      bias: b,
      ...(repeat !== 1 ? { repeat } : {}),
      ...(subtract !== 0 ? { subtract } : {}),
    });
  }
  return { ...(h.mask ? { mask } : {}), ...(h.bias ? { bias } : {}) };
}

/** Decodes the payload of a header already checked by payloadLength. */
export function decodePayload(h: Header, payload: Uint8Array, limits: FrameLimits): Frame {
  const expected = payloadLength(h, limits);
  if (payload.length !== expected) {
    throw new SyntaxError(
      `Cannot decode ${
        opName(h.op)
      } frame: payload is ${payload.length} bytes, expected ${expected}`,
    );
  }
  const v = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  switch (h.op) {
    case Op.Run: {
      const rowBytes = h.n * limits.nEmbd * 4;
      const frame = {
        op: Op.Run,
        slot: h.slot,
        base: h.base,
        n: h.n,
        topk: h.topk,
        rows: decodeRows(payload.subarray(0, rowBytes), h.n, limits.nEmbd),
      } as const;
      const positions = h.logits & 0xff;
      const logits = positions ? { logits: LOGIT_POSITIONS[positions] } : {};
      const kind: RowKind = h.logits & ROWS_DECODE ? "decode" : "prompt";
      const flags = {
        ...(h.logits & ROWS_REWINDABLE ? { rewindable: true } : {}),
        ...(h.logits & EVERY_TOP ? { candidates: "every" as const } : {}),
        ...(h.logits & WITH_IDS ? { ids: decodeWords(v, rowBytes, h.n) } : {}),
      };
      if (h.mask === 0 && h.bias === 0) return { ...frame, ...logits, kind, ...flags };
      const adjust = decodeAdjust(v, rowBytes + idsBytes(h), h);
      return { ...frame, adjust, ...logits, kind, ...flags };
    }
    case Op.Ids: {
      const ids = decodeWords(v, 0, h.n);
      const every = h.logits === EVERY_TOP;
      const tops: TopEntry[][] = [];
      for (let t = 0; t < (every ? h.n : 1); t++) {
        const top: TopEntry[] = [];
        for (let i = 0; i < h.topk; i++) {
          const at = h.n * 4 + (t * h.topk + i) * 8;
          top.push({ id: v.getUint32(at, true), logit: v.getFloat32(at + 4, true) });
        }
        tops.push(top);
      }
      const lseAt = h.n * 4 + tops.length * h.topk * 8;
      const lse = h.topk > 0 ? v.getFloat32(lseAt, true) : NaN;
      const top = tops.at(-1) ?? [];
      const frame = { op: Op.Ids, slot: h.slot, base: h.base, ids, top, lse } as const;
      return every ? { ...frame, tops } : frame;
    }
    case Op.Close:
    case Op.Ping:
    case Op.Pong:
    case Op.Alive:
      return { op: h.op };
    case Op.Save:
    case Op.Restore:
      return { op: h.op, slot: h.slot, idx: h.base };
    case Op.Saved:
      return { op: Op.Saved, slot: h.slot, idx: h.base };
    case Op.Restored:
      return { op: Op.Restored, slot: h.slot, idx: h.base, position: h.n };
    case Op.Rewind:
    case Op.Rewound:
      return { op: h.op, slot: h.slot, position: h.base };
    case Op.Draft:
      return { op: Op.Draft, slot: h.slot, id: v.getUint32(0, true), k: h.n };
    case Op.Drafted:
      return { op: Op.Drafted, slot: h.slot, ids: decodeWords(v, 0, h.n) };
    case Op.Auth:
      return { op: Op.Auth, proof: payload.slice() };
    case Op.Challenge: {
      const auth = v.getUint32(4, true);
      if (auth !== AuthMode.None && auth !== AuthMode.HmacSha256) {
        throw new SyntaxError(`Cannot decode Challenge frame: unknown auth mode ${auth}`);
      }
      return { op: Op.Challenge, magic: v.getUint32(0, true), auth, nonce: payload.slice(8) };
    }
    case Op.Hello:
      return decodeHello(v, payload);
    default: {
      // payloadLength admitted only the ops above and Error.
      let message: string;
      try {
        message = utf8Strict.decode(payload.subarray(4));
      } catch {
        throw new SyntaxError("Cannot decode Error frame: the message is not valid UTF-8");
      }
      return { op: Op.Error, code: v.getUint32(0, true), message };
    }
  }
}

/** Decodes exactly one frame from `bytes`; a short buffer or trailing bytes are errors. */
export function decodeFrame(bytes: Uint8Array, limits: FrameLimits): Frame {
  if (bytes.length < HEADER_BYTES) {
    throw new SyntaxError(
      `Cannot decode frame: got ${bytes.length} bytes, shorter than the ${HEADER_BYTES}-byte header`,
    );
  }
  const h = decodeHeader(bytes.subarray(0, HEADER_BYTES));
  const length = payloadLength(h, limits);
  if (bytes.length !== HEADER_BYTES + length) {
    const what = bytes.length < HEADER_BYTES + length ? "short" : "followed by trailing bytes";
    throw new SyntaxError(
      `Cannot decode ${opName(h.op)} frame: ${bytes.length} bytes is ${what}; ` +
        `the header announces ${HEADER_BYTES + length}`,
    );
  }
  return decodePayload(h, bytes.subarray(HEADER_BYTES), limits);
}

function headerOf(f: Frame, messageBytes: number): Header {
  const zero = { slot: 0, n: 0, base: 0, topk: 0, mask: 0, bias: 0, logits: 0 };
  switch (f.op) {
    case Op.Run:
      return {
        op: f.op,
        slot: f.slot,
        n: f.n,
        base: f.base,
        topk: f.topk,
        mask: f.adjust?.mask?.length ?? 0,
        bias: f.adjust?.bias?.length ?? 0,
        logits: logitsWord(f.logits) |
          ((f.kind ?? defaultRows(f.n)) === "decode" ? ROWS_DECODE : 0) |
          (f.rewindable ? ROWS_REWINDABLE : 0) | (f.candidates === "every" ? EVERY_TOP : 0) |
          (f.ids ? WITH_IDS : 0),
      };
    case Op.Ids:
      return {
        ...zero,
        op: f.op,
        slot: f.slot,
        n: f.ids.length,
        base: f.base,
        topk: f.top.length,
        logits: f.tops ? EVERY_TOP : 0,
      };
    case Op.Save:
    case Op.Restore:
    case Op.Saved:
      return { ...zero, op: f.op, slot: f.slot, base: f.idx };
    case Op.Restored:
      return { ...zero, op: f.op, slot: f.slot, n: f.position, base: f.idx };
    case Op.Rewind:
    case Op.Rewound:
      return { ...zero, op: f.op, slot: f.slot, base: f.position };
    case Op.Draft:
      return { ...zero, op: f.op, slot: f.slot, n: f.k };
    case Op.Drafted:
      return { ...zero, op: f.op, slot: f.slot, n: f.ids.length };
    case Op.Error:
      return { ...zero, op: f.op, n: messageBytes };
    default:
      return { ...zero, op: f.op };
  }
}

/** RUN's logits word: its rows are generated tokens' (engine/stage.ts RowKind "decode"). */
export const ROWS_DECODE = 0x100;
/** RUN's logits word: keep what a REWIND into the run needs. */
export const ROWS_REWINDABLE = 0x200;
/** RUN's logits word: every position's candidates; IDS's: they follow, each position's in turn. */
export const EVERY_TOP = 0x400;
/** RUN's logits word: the rows' token ids follow them (for a last stage that drafts). */
export const WITH_IDS = 0x800;

/** RUN's logits word's low byte: the index of its LogitPositions. */
function logitsWord(logits: LogitPositions | undefined): number {
  const word = LOGIT_POSITIONS.indexOf(logits ?? "all");
  if (word < 0) {
    throw new RangeError(
      `Cannot encode Run frame: logits is ${JSON.stringify(logits)}, expected one of ` +
        LOGIT_POSITIONS.join(", "),
    );
  }
  return word;
}

/** The UTF-8 bytes of an error message, cut at a character boundary to MAX_MESSAGE_BYTES. */
function messageBytesOf(message: string): Uint8Array {
  const bytes = utf8.encode(message);
  if (bytes.length <= MAX_MESSAGE_BYTES) return bytes;
  let end = MAX_MESSAGE_BYTES;
  while ((bytes[end] & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
}

function checkFixed(what: string, bytes: Uint8Array, length: number): void {
  if (bytes.length !== length) {
    throw new RangeError(`Cannot encode ${what}: it is ${bytes.length} bytes, expected ${length}`);
  }
}

/**
 * Encodes a frame. `nEmbd` is D for RUN rows. Throws RangeError for values that do not fit the
 * layout (a row count that is not n·D, a fingerprint of the wrong size).
 */
export function encodeFrame(f: Frame, nEmbd = 0): Uint8Array {
  const message = f.op === Op.Error ? messageBytesOf(f.message) : new Uint8Array();
  const h = headerOf(f, message.length);
  for (const [k, x] of Object.entries(h)) {
    if (!Number.isInteger(x) || x < 0 || x > U32_MAX) {
      throw new RangeError(`Cannot encode ${opName(h.op)} frame: ${k} is ${x}, not a u32`);
    }
  }
  const length = payloadLength(h, { nEmbd, maxBatch: U32_MAX });
  if (f.op === Op.Run && f.rows.length !== f.n * nEmbd) {
    throw new RangeError(
      `Cannot encode Run frame: ${f.rows.length} values is not n·D = ${f.n}·${nEmbd}`,
    );
  }
  const bytes = new Uint8Array(HEADER_BYTES + length);
  const v = new DataView(bytes.buffer);
  HEADER_FIELDS.forEach((k, i) => v.setUint32(i * 4, h[k], true));
  const p = HEADER_BYTES;
  switch (f.op) {
    case Op.Run: {
      bytes.set(new Uint8Array(f.rows.buffer, f.rows.byteOffset, f.rows.byteLength), p);
      if (f.ids && f.ids.length !== f.n) {
        throw new RangeError(`Cannot encode Run frame: ${f.ids.length} token ids for ${f.n} rows`);
      }
      f.ids?.forEach((id, i) => v.setUint32(p + f.rows.byteLength + 4 * i, id, true));
      const at = p + f.rows.byteLength + 4 * (f.ids?.length ?? 0);
      f.adjust?.mask?.forEach((w, i) => v.setUint32(at + 4 * i, w, true));
      if (f.adjust?.bias) bytes.set(encodeBias(f.adjust.bias), at + 4 * h.mask);
      break;
    }
    case Op.Draft:
      v.setUint32(p, f.id, true);
      break;
    case Op.Drafted:
      f.ids.forEach((id, i) => v.setUint32(p + i * 4, id, true));
      break;
    case Op.Ids: {
      f.ids.forEach((id, i) => v.setUint32(p + i * 4, id, true));
      const tops = f.tops ?? [f.top];
      const k = f.top.length;
      if (tops.length !== (f.tops ? f.ids.length : 1) || tops.some((t) => t.length !== k)) {
        throw new RangeError(
          `Cannot encode Ids frame: expected ${f.ids.length} candidate lists of ${k}, one a position`,
        );
      }
      tops.forEach((top, t) =>
        top.forEach((e, i) => {
          const at = p + f.ids.length * 4 + (t * k + i) * 8;
          v.setUint32(at, e.id, true);
          v.setFloat32(at + 4, e.logit, true);
        })
      );
      if (k) v.setFloat32(p + f.ids.length * 4 + tops.length * k * 8, f.lse, true);
      break;
    }
    case Op.Auth:
      checkFixed("Auth proof", f.proof, PROOF_BYTES);
      bytes.set(f.proof, p);
      break;
    case Op.Challenge:
      checkFixed("Challenge nonce", f.nonce, NONCE_BYTES);
      v.setUint32(p, f.magic, true);
      v.setUint32(p + 4, f.auth, true);
      bytes.set(f.nonce, p + 8);
      break;
    case Op.Hello:
      bytes.set(encodeHelloInfo(f.info), p);
      checkFixed("Hello proof", f.proof, PROOF_BYTES);
      bytes.set(f.proof, p + HELLO_BYTES - PROOF_BYTES);
      break;
    case Op.Error:
      v.setUint32(p, f.code, true);
      bytes.set(message, p + 4);
      break;
  }
  return bytes;
}

/** HELLO's payload without the proof: the bytes the worker's proof signs. */
export function encodeHelloInfo(info: HelloInfo): Uint8Array {
  checkFixed("Hello fingerprint", info.fingerprint, FINGERPRINT_BYTES);
  const bytes = new Uint8Array(HELLO_BYTES - PROOF_BYTES);
  const v = new DataView(bytes.buffer);
  const words = [
    info.first,
    info.end,
    info.nLayer,
    info.nEmbd,
    info.slots,
    info.ctx,
    info.maxBatch,
    info.snapshots,
    info.maxRewind,
    info.drafts ? 1 : 0,
  ];
  words.forEach((x, i) => {
    if (!Number.isInteger(x) || x < 0 || x > U32_MAX) {
      throw new RangeError(`Cannot encode Hello frame: word ${i} is ${x}, not a u32`);
    }
    v.setUint32(i * 4, x, true);
  });
  bytes.set(info.fingerprint, HELLO_WORDS * 4);
  return bytes;
}

/** A magic word for messages: hex and its four bytes as text, e.g. `0x354d4454 ("TDM5")`. */
export function magicName(magic: number): string {
  const bytes = new Uint8Array(4);
  new DataView(bytes.buffer).setUint32(0, magic, true);
  const text = String.fromCharCode(...bytes).replace(/[^\x20-\x7e]/g, "?");
  return `0x${magic.toString(16).padStart(8, "0")} ("${text}")`;
}

/** The client's greeting: MAGIC and a fresh nonce. */
export function encodeGreeting(nonce: Uint8Array, magic = MAGIC): Uint8Array {
  checkFixed("greeting nonce", nonce, NONCE_BYTES);
  const bytes = new Uint8Array(GREETING_BYTES);
  new DataView(bytes.buffer).setUint32(0, magic, true);
  bytes.set(nonce, 4);
  return bytes;
}
