// Tests of lib/wire/frame_stream.ts: frames reassembled from any split of the byte stream, the
// greeting's early answer, caps before allocation, and end of stream mid-frame.

import assert from "node:assert/strict";
import {
  encodeFrame,
  encodeGreeting,
  type Frame,
  type FrameLimits,
  HEADER_BYTES,
  MAGIC,
  Op,
} from "./frame.ts";
import { type ByteSource, FrameReader, writeAll } from "./frame_stream.ts";

/** Serves `data` in chunks of the given sizes (cycled); then end of stream. Counts bytes taken. */
class ChunkedSource implements ByteSource {
  taken = 0;
  #at = 0;
  #turn = 0;
  constructor(readonly data: Uint8Array, readonly sizes: readonly number[]) {}

  read(p: Uint8Array): Promise<number | null> {
    if (this.#at >= this.data.length) return Promise.resolve(null);
    const size = this.sizes[this.#turn++ % this.sizes.length];
    const n = Math.min(size, p.length, this.data.length - this.#at);
    p.set(this.data.subarray(this.#at, this.#at + n));
    this.#at += n;
    this.taken += n;
    return Promise.resolve(n);
  }
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  parts.reduce((at, p) => (out.set(p, at), at + p.length), 0);
  return out;
}

const D = 256;
const LIMITS: FrameLimits = { nEmbd: D, maxBatch: 100 };

function runFrame(n: number, base: number): Frame {
  const rows = Float32Array.from({ length: n * D }, (_, i) => (i % 97) - 48.5);
  return { op: Op.Run, slot: 1, base, n, topk: 2, rows, kind: n > 1 ? "prompt" : "decode" };
}

Deno.test("frames come out whole however the bytes are split, large payloads included", async () => {
  // 80 rows of 256 f32 = 80 KiB: larger than the reader's buffer, so the direct path runs too.
  const frames: Frame[] = [runFrame(1, 0), { op: Op.Save, slot: 0, idx: 3 }, runFrame(80, 1), {
    op: Op.Close,
  }];
  const data = concat(frames.map((f) => encodeFrame(f, D)));
  for (const sizes of [[1], [7, 1, 13], [HEADER_BYTES], [65536], [data.length]]) {
    const reader = new FrameReader(new ChunkedSource(data, sizes));
    for (const frame of frames) assert.deepEqual(await reader.readFrame(LIMITS), frame);
    assert.equal(await reader.readFrame(LIMITS), null, `sizes ${sizes}: end of stream`);
  }
});

Deno.test("the end of the stream inside a header or a payload drops the partial frame", async () => {
  const whole = encodeFrame(runFrame(2, 0), D);
  for (const cut of [0, 5, HEADER_BYTES, HEADER_BYTES + 100, whole.length - 1]) {
    const reader = new FrameReader(new ChunkedSource(whole.subarray(0, cut), [3]));
    assert.equal(await reader.readFrame(LIMITS), null, `cut at ${cut}`);
  }
});

Deno.test("an oversize header is refused after its 20 bytes, before the payload is read", async () => {
  const header = encodeFrame(runFrame(1, 0), D).subarray(0, HEADER_BYTES);
  new DataView(header.buffer).setUint32(8, 0x4000_0000, true);
  const source = new ChunkedSource(concat([header, new Uint8Array(1000)]), [HEADER_BYTES]);
  await assert.rejects(new FrameReader(source).readFrame(LIMITS), /n is 1073741824/);
  assert.equal(source.taken, HEADER_BYTES);
});

Deno.test("a greeting of another version is answered after its first 4 bytes", async () => {
  const good = new Uint8Array(32).fill(4);
  const ok = await new FrameReader(new ChunkedSource(encodeGreeting(good), [5])).readGreeting(
    MAGIC,
  );
  assert.deepEqual(ok, { magic: MAGIC, nonce: good });
  // The seed's "qkp3" client sends only its 4-byte magic and then waits for an answer.
  const old = new ChunkedSource(Uint8Array.of(0x33, 0x70, 0x6b, 0x71), [4]);
  const greeting = await new FrameReader(old).readGreeting(MAGIC);
  assert.equal(greeting?.magic, 0x716b7033);
  assert.equal(
    await new FrameReader(new ChunkedSource(encodeGreeting(good).subarray(0, 20), [36]))
      .readGreeting(MAGIC),
    null,
  );
});

Deno.test("writeAll finishes partial writes", async () => {
  const written: number[] = [];
  const sink = {
    write(p: Uint8Array) {
      const n = Math.min(3, p.length);
      written.push(...p.subarray(0, n));
      return Promise.resolve(n);
    },
  };
  const data = Uint8Array.from({ length: 50 }, (_, i) => i);
  await writeAll(sink, data);
  assert.deepEqual(written, [...data]);
});
