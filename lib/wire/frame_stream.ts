// TCP bytes ↔ frames: a buffered reader that yields the greeting and whole frames, and writeAll.
// Sits between the socket and lib/wire/frame.ts for both ends (peer.ts, stage_server.ts).

import {
  decodeHeader,
  decodePayload,
  encodeFrame,
  type Frame,
  type FrameLimits,
  GREETING_BYTES,
  HEADER_BYTES,
  type Op,
  opName,
  payloadLength,
} from "./frame.ts";

/** The part of Deno.Conn the reader needs. */
export interface ByteSource {
  read(p: Uint8Array): Promise<number | null>;
}

/** The part of Deno.Conn the writer needs. */
export interface ByteSink {
  write(p: Uint8Array): Promise<number>;
}

/** The client's greeting, before anything is checked. */
export interface Greeting {
  readonly magic: number;
  readonly nonce: Uint8Array;
}

const BUFFER_BYTES = 64 * 1024;

/**
 * Reads frames off a byte source. Every allocation is sized by payloadLength, which checks the
 * header against the caps first. A `null` result means the other side closed the connection;
 * a partial frame before the close is dropped.
 */
export class FrameReader {
  readonly #source: ByteSource;
  readonly #buffer = new Uint8Array(BUFFER_BYTES);
  #start = 0;
  #end = 0;

  constructor(source: ByteSource) {
    this.#source = source;
  }

  /** Exactly `length` bytes, or null if the source ends first. */
  async readExact(length: number): Promise<Uint8Array | null> {
    const out = new Uint8Array(length);
    let filled = 0;
    while (filled < length) {
      if (this.#start === this.#end) {
        // Large payloads go straight into `out`; small reads are batched through the buffer.
        const direct = length - filled >= BUFFER_BYTES;
        const got = await this.#source.read(direct ? out.subarray(filled) : this.#buffer);
        if (got === null) return null;
        if (direct) {
          filled += got;
          continue;
        }
        this.#start = 0;
        this.#end = got;
      }
      const take = Math.min(length - filled, this.#end - this.#start);
      out.set(this.#buffer.subarray(this.#start, this.#start + take), filled);
      this.#start += take;
      filled += take;
    }
    return out;
  }

  /**
   * The 36-byte greeting. The magic is returned as soon as its 4 bytes arrive when it is not
   * `expected`, so a client of another protocol version gets its answer without sending more.
   */
  async readGreeting(expected: number): Promise<Greeting | null> {
    const head = await this.readExact(4);
    if (head === null) return null;
    const magic = new DataView(head.buffer).getUint32(0, true);
    if (magic !== expected) return { magic, nonce: new Uint8Array() };
    const nonce = await this.readExact(GREETING_BYTES - 4);
    return nonce === null ? null : { magic, nonce };
  }

  /**
   * One frame, checked against `limits`; SyntaxError or RangeError for a malformed one. With
   * `only`, a frame of another op is refused after its header, before any payload is read.
   */
  async readFrame(limits: FrameLimits, only?: Op): Promise<Frame | null> {
    const headerBytes = await this.readExact(HEADER_BYTES);
    if (headerBytes === null) return null;
    const header = decodeHeader(headerBytes);
    if (only !== undefined && header.op !== only) {
      throw new SyntaxError(
        `Cannot accept the frame: it is op ${opName(header.op)}, expected ${opName(only)} here`,
      );
    }
    const payload = await this.readExact(payloadLength(header, limits));
    if (payload === null) return null;
    return decodePayload(header, payload, limits);
  }
}

/** Writes all of `bytes` (Deno.Conn.write may take only part of a buffer). */
export async function writeAll(sink: ByteSink, bytes: Uint8Array): Promise<void> {
  let done = 0;
  while (done < bytes.length) done += await sink.write(bytes.subarray(done));
}

export function writeFrame(sink: ByteSink, frame: Frame, nEmbd = 0): Promise<void> {
  return writeAll(sink, encodeFrame(frame, nEmbd));
}
