// Tests of the frame byte layout (lib/wire/frame.ts): bytes as the header table says, round trips,
// and every way a frame can be malformed: truncation, trailing bytes, bad fields, oversize, noise.

import assert from "node:assert/strict";
import {
  AuthMode,
  decodeFrame,
  encodeFrame,
  encodeGreeting,
  ErrorCode,
  type Frame,
  type FrameLimits,
  MAGIC,
  MAX_MESSAGE_BYTES,
  Op,
} from "./frame.ts";
import { MAX_BIAS_PAIRS, MAX_MASK_WORDS, MAX_TOPK } from "../../engine/stage.ts";
import { fuzzRuns, fuzzSeed, Random } from "../../tests/_fuzz.ts";

const D = 3;
const LIMITS: FrameLimits = { nEmbd: D, maxBatch: 8 };

function bytes(...words: number[]): number[] {
  return words.flatMap((w) => [w & 0xff, (w >>> 8) & 0xff, (w >>> 16) & 0xff, w >>> 24]);
}

/** One frame of every op, with values exactly representable in f32. */
const SAMPLES: Frame[] = [
  {
    op: Op.Run,
    slot: 1,
    base: 7,
    n: 2,
    topk: 4,
    rows: Float32Array.of(1, -2, 0.5, 3, 4.25, -0),
    kind: "prompt",
  },
  {
    op: Op.Run,
    slot: 0,
    base: 3,
    n: 1,
    topk: 2,
    rows: Float32Array.of(1, 2, 3),
    adjust: { mask: Uint32Array.of(0xffff_ffff, 5), bias: [{ id: 7, bias: -1.5 }] },
    kind: "decode",
  },
  {
    op: Op.Run,
    slot: 0,
    base: 3,
    n: 1,
    topk: 0,
    rows: Float32Array.of(1, 2, 3),
    adjust: { bias: [{ id: 1, bias: 100, subtract: 0.75 }, { id: 0, bias: -100, repeat: 2 }] },
    kind: "decode",
  },
  {
    op: Op.Run,
    slot: 1,
    base: 2,
    n: 2,
    topk: 3,
    rows: Float32Array.of(1, 2, 3, 4, 5, 6),
    adjust: { mask: Uint32Array.of(1) },
    logits: "last",
    kind: "prompt",
  },
  // A prompt of one position, and generated tokens replayed several at a time.
  {
    op: Op.Run,
    slot: 1,
    base: 0,
    n: 1,
    topk: 0,
    rows: Float32Array.of(1, 2, 3),
    logits: "none",
    kind: "prompt",
  },
  {
    op: Op.Run,
    slot: 1,
    base: 9,
    n: 2,
    topk: 0,
    rows: Float32Array.of(1, 2, 3, 4, 5, 6),
    logits: "none",
    kind: "decode",
  },
  // The tokens at the rows' positions, for a last stage that drafts, with and without adjustments.
  {
    op: Op.Run,
    slot: 1,
    base: 4,
    n: 2,
    topk: 1,
    rows: Float32Array.of(1, 2, 3, 4, 5, 6),
    kind: "decode",
    rewindable: true,
    ids: Uint32Array.of(17, 0xffff_fffe),
  },
  {
    op: Op.Run,
    slot: 0,
    base: 3,
    n: 1,
    topk: 2,
    rows: Float32Array.of(1, 2, 3),
    adjust: { mask: Uint32Array.of(7), bias: [{ id: 3, bias: 0.5 }] },
    kind: "decode",
    ids: Uint32Array.of(5),
  },
  { op: Op.Draft, slot: 1, id: 42, k: 3 },
  { op: Op.Drafted, slot: 1, ids: Uint32Array.of(43, 44, 45) },
  { op: Op.Drafted, slot: 0, ids: new Uint32Array() },
  { op: Op.Close },
  { op: Op.Save, slot: 3, idx: 9 },
  { op: Op.Restore, slot: 0, idx: 2 },
  { op: Op.Auth, proof: new Uint8Array(32).fill(7) },
  { op: Op.Ping },
  { op: Op.Pong },
  { op: Op.Alive },
  {
    op: Op.Ids,
    slot: 2,
    base: 11,
    ids: Uint32Array.of(5, 0xffff_fffe),
    top: [{ id: 5, logit: 2.5 }, { id: 1, logit: -1 }],
    lse: 3.25,
  },
  { op: Op.Ids, slot: 0, base: 1, ids: Uint32Array.of(9), top: [], lse: NaN },
  { op: Op.Ids, slot: 1, base: 6, ids: new Uint32Array(), top: [], lse: NaN },
  { op: Op.Saved, slot: 3, idx: 9 },
  { op: Op.Restored, slot: 1, idx: 2, position: 40 },
  {
    op: Op.Ids,
    slot: 0,
    base: 3,
    ids: Uint32Array.of(4, 5),
    top: [{ id: 5, logit: 1.5 }],
    lse: 2,
    tops: [[{ id: 4, logit: 0.5 }], [{ id: 5, logit: 1.5 }]],
  },
  { op: Op.Rewind, slot: 2, position: 17 },
  { op: Op.Rewound, slot: 2, position: 17 },
  { op: Op.Challenge, magic: MAGIC, auth: AuthMode.HmacSha256, nonce: new Uint8Array(32).fill(1) },
  {
    op: Op.Hello,
    info: {
      first: 2,
      end: 4,
      nLayer: 4,
      nEmbd: D,
      slots: 2,
      ctx: 64,
      maxBatch: 8,
      snapshots: 3,
      maxRewind: 4,
      drafts: true,
      fingerprint: new Uint8Array(32).fill(0xab),
    },
    proof: new Uint8Array(32).fill(0xcd),
  },
  { op: Op.Error, code: ErrorCode.Range, message: "Cannot use slot 9: ünïcode ✓" },
];

Deno.test("the greeting and a Run frame are laid out as the header table says", () => {
  assert.deepEqual(
    [...encodeGreeting(new Uint8Array(32).fill(9))],
    [0x54, 0x44, 0x4d, 0x38, ...new Array(32).fill(9)],
  );
  assert.equal(new TextDecoder().decode(encodeGreeting(new Uint8Array(32)).subarray(0, 4)), "TDM8");
  const run = encodeFrame(
    { op: Op.Run, slot: 2, base: 5, n: 1, topk: 3, rows: Float32Array.of(1.5, -2) },
    2,
  );
  // 1.5 = 0x3fc00000, -2 = 0xc0000000; one row and no kind given: a generated token's (0x100).
  assert.deepEqual(
    [...run],
    [...bytes(1, 2, 1, 5, 3, 0, 0, 0x100), ...bytes(0x3fc00000, 0xc0000000)],
  );
  // A one-row RUN (a generated token's: 0x100) of D 1 with `options`, as bytes.
  const oneRow = (options: Partial<Extract<Frame, { op: Op.Run }>>) => [
    ...encodeFrame({
      op: Op.Run,
      slot: 0,
      base: 0,
      n: 1,
      topk: 1,
      rows: Float32Array.of(0),
      ...options,
    }, 1),
  ];
  const adjusted = oneRow({
    adjust: { mask: Uint32Array.of(6), bias: [{ id: 2, bias: -2, repeat: 1.5 }] },
  });
  // A bias record is (id, bias, repeat, subtract): -2 = 0xc0000000, 1.5 = 0x3fc00000, 0 omitted.
  assert.deepEqual(
    adjusted,
    [...bytes(1, 0, 1, 0, 1, 1, 1, 0x100), ...bytes(0, 6, 2, 0xc0000000, 0x3fc00000, 0)],
  );
  // The eighth word is RUN's logits: 0 all, 1 last, 2 none; 0x100: generated tokens' rows.
  const last = encodeFrame({
    op: Op.Run,
    slot: 0,
    base: 0,
    n: 1,
    topk: 0,
    rows: Float32Array.of(0),
    logits: "last",
    kind: "prompt",
  }, 1);
  assert.deepEqual([...last], [...bytes(1, 0, 1, 0, 0, 0, 0, 1), ...bytes(0)]);
  // The logits word of a one-row RUN with `options`.
  const word = (options: Partial<Extract<Frame, { op: Op.Run }>>) => oneRow(options).slice(28, 32);
  assert.deepEqual(word({ logits: "none" }), bytes(0x102));
  // 0x200: every stage keeps what a REWIND into the run needs.
  assert.deepEqual(word({ rewindable: true }), bytes(0x300));
  // 0x400: every position's candidates; IDS then carries each position's in turn.
  assert.deepEqual(word({ candidates: "every" }), bytes(0x500));
  // 0x800: the rows' token ids follow the rows, before the mask and bias.
  assert.deepEqual(
    oneRow({ ids: Uint32Array.of(9), adjust: { mask: Uint32Array.of(6) } }),
    [...bytes(1, 0, 1, 0, 1, 1, 0, 0x900), ...bytes(0, 9, 6)],
  );
  // DRAFT: n drafts asked for, the token at the slot's position; DRAFTED: n ids.
  assert.deepEqual(
    [...encodeFrame({ op: Op.Draft, slot: 2, id: 7, k: 3 })],
    [...bytes(9, 2, 3, 0, 0, 0, 0, 0), ...bytes(7)],
  );
  assert.deepEqual(
    [...encodeFrame({ op: Op.Drafted, slot: 2, ids: Uint32Array.of(8, 9) })],
    [...bytes(0x8a, 2, 2, 0, 0, 0, 0, 0), ...bytes(8, 9)],
  );
  // IDS answering a RUN with logits "none": no ids.
  const empty = encodeFrame({
    op: Op.Ids,
    slot: 1,
    base: 4,
    ids: new Uint32Array(),
    top: [],
    lse: NaN,
  });
  assert.deepEqual([...empty], bytes(0x81, 1, 0, 4, 0, 0, 0, 0));
  const ids = encodeFrame({
    op: Op.Ids,
    slot: 1,
    base: 4,
    ids: Uint32Array.of(7),
    top: [{ id: 3, logit: 1.5 }],
    lse: -2,
  });
  assert.deepEqual([...ids], [
    ...bytes(0x81, 1, 1, 4, 1, 0, 0, 0),
    ...bytes(7, 3, 0x3fc00000, 0xc0000000),
  ]);
  const bare = encodeFrame({
    op: Op.Ids,
    slot: 1,
    base: 4,
    ids: Uint32Array.of(7),
    top: [],
    lse: NaN,
  });
  assert.deepEqual([...bare], [...bytes(0x81, 1, 1, 4, 0, 0, 0, 0), ...bytes(7)]);
  const error = encodeFrame({ op: Op.Error, code: ErrorCode.Busy, message: "no" });
  assert.deepEqual([...error], [...bytes(0xff, 0, 2, 0, 0, 0, 0, 0), ...bytes(4), 0x6e, 0x6f]);
  const restored = encodeFrame({ op: Op.Restored, slot: 1, idx: 6, position: 30 });
  assert.deepEqual([...restored], bytes(0x84, 1, 30, 6, 0, 0, 0, 0));
  assert.deepEqual([...encodeFrame({ op: Op.Ping })], bytes(7, 0, 0, 0, 0, 0, 0, 0));
  assert.deepEqual([...encodeFrame({ op: Op.Pong })], bytes(0x87, 0, 0, 0, 0, 0, 0, 0));
  assert.deepEqual([...encodeFrame({ op: Op.Alive })], bytes(0x88, 0, 0, 0, 0, 0, 0, 0));
});

Deno.test("every op survives encode → decode unchanged", () => {
  for (const frame of SAMPLES) {
    assert.deepEqual(decodeFrame(encodeFrame(frame, D), LIMITS), frame, Op[frame.op]);
  }
});

Deno.test("a frame cut short at any byte, or followed by one more byte, is a SyntaxError", () => {
  for (const frame of SAMPLES) {
    const whole = encodeFrame(frame, D);
    for (let cut = 0; cut < whole.length; cut++) {
      assert.throws(() => decodeFrame(whole.subarray(0, cut), LIMITS), SyntaxError);
    }
    const longer = new Uint8Array(whole.length + 1);
    longer.set(whole);
    assert.throws(() => decodeFrame(longer, LIMITS), /trailing bytes/);
  }
});

Deno.test("unknown ops and nonzero unused header words are refused", () => {
  const frame = (...words: number[]) => Uint8Array.from(bytes(...words));
  assert.throws(() => decodeFrame(frame(6, 0, 0, 0, 0, 0, 0, 0), LIMITS), /unknown op 0x6/);
  assert.throws(() => decodeFrame(frame(0, 0, 0, 0, 0, 0, 0, 0), LIMITS), SyntaxError);
  assert.throws(
    () => decodeFrame(frame(Op.Close, 0, 0, 1, 0, 0, 0, 0), LIMITS),
    /field base is 1, expected 0/,
  );
  assert.throws(() => decodeFrame(frame(Op.Save, 1, 2, 3, 0, 0, 0, 0), LIMITS), /field n is 2/);
  for (const op of [Op.Ping, Op.Pong, Op.Alive]) {
    assert.throws(
      () => decodeFrame(frame(op, 1, 0, 0, 0, 0, 0, 0), LIMITS),
      new RegExp(`Cannot decode ${Op[op]} frame: header field slot is 1, expected 0`),
    );
  }
  // Only RUN carries logit adjustments.
  assert.throws(() => decodeFrame(frame(Op.Ids, 0, 1, 0, 0, 1, 0, 0), LIMITS), /field mask is 1/);
  assert.throws(() => decodeFrame(frame(Op.Saved, 0, 0, 0, 0, 0, 2, 0), LIMITS), /field bias is 2/);
  assert.throws(() => decodeFrame(frame(Op.Ids, 0, 1, 0, 0, 0, 0, 1), LIMITS), /field logits is 1/);
  // RUN's logits word names one of three position sets and, in bits 8 and 9, the kind of rows
  // and whether the run is rewindable.
  assert.throws(
    () => decodeFrame(frame(Op.Run, 0, 1, 0, 0, 0, 0, 3), LIMITS),
    /Cannot decode Run frame: logits is 3, expected 0 \(all\), 1 \(last\), 2 \(none\), plus 256/,
  );
  assert.throws(
    () => decodeFrame(frame(Op.Run, 0, 1, 0, 0, 0, 0, 0x1001), LIMITS),
    /logits is 4097/,
  );
  assert.throws(() => decodeFrame(frame(Op.Rewind, 0, 1, 0, 0, 0, 0, 0), LIMITS), /field n is 1/);
  assert.throws(() => decodeFrame(frame(Op.Draft, 0, 1, 5, 0, 0, 0, 0), LIMITS), /field base is 5/);
  // HELLO's drafts word is 0 or 1.
  const hello = encodeFrame(SAMPLES.find((f) => f.op === Op.Hello)!);
  new DataView(hello.buffer).setUint32(32 + 36, 2, true);
  assert.throws(() => decodeFrame(hello, LIMITS), /Hello frame: drafts is 2, expected 0 or 1/);
});

Deno.test("counts above their caps are RangeErrors before any payload is read", () => {
  const header = (op: number, n: number, topk: number, mask = 0, bias = 0) =>
    Uint8Array.from(bytes(op, 0, n, 0, topk, mask, bias, 0));
  // Only the 28 header bytes are given: the cap check must fire before the payload is wanted.
  assert.throws(() => decodeFrame(header(Op.Run, 9, 0), LIMITS), /n is 9, expected 1\.\.8/);
  assert.throws(() => decodeFrame(header(Op.Run, 0, 0), LIMITS), RangeError);
  assert.throws(() => decodeFrame(header(Op.Run, 0xffff_ffff, 0), LIMITS), RangeError);
  assert.throws(() => decodeFrame(header(Op.Ids, 1, MAX_TOPK + 1), LIMITS), /topk is 1025/);
  // A DRAFT asks for 1..maxBatch drafts; a DRAFTED holds at most maxBatch.
  assert.throws(() => decodeFrame(header(Op.Draft, 0, 0), LIMITS), /n is 0, expected 1\.\.8/);
  assert.throws(() => decodeFrame(header(Op.Drafted, 9, 0), LIMITS), /n is 9, expected 0\.\.8/);
  assert.throws(
    () => decodeFrame(header(Op.Run, 1, 0, MAX_MASK_WORDS + 1), LIMITS),
    /mask is 65537 words/,
  );
  assert.throws(
    () => decodeFrame(header(Op.Run, 1, 0, 0, MAX_BIAS_PAIRS + 1), LIMITS),
    /bias 16385 records/,
  );
  assert.throws(() => decodeFrame(header(Op.Error, 0xffff_fff0, 0), LIMITS), RangeError);
  const end = Uint8Array.from(bytes(Op.Run, 0, 2, 0xffff_fffe, 0, 0, 0, 0));
  assert.throws(() => decodeFrame(end, LIMITS), /overflow/);
  // A peer's HELLO sets the limits a reader uses: its numbers cannot size a read past the cap.
  const wide = { nEmbd: 1 << 20, maxBatch: 0xffff_ffff };
  assert.throws(
    () => decodeFrame(header(Op.Run, 4096, 0), wide),
    /\(n 4096 × D 1048576 × 4 \+ ids 0 \+ mask 0 × 4 \+ bias 0 × 16 = 17179869184 bytes\) is over the 268435456-byte frame limit/,
  );
  assert.throws(() => decodeFrame(header(Op.Ids, 0xffff_fff0, 0), wide), /frame limit/);
});

Deno.test("non-finite hidden values and invalid UTF-8 messages are malformed", () => {
  for (const bad of [NaN, Infinity, -Infinity]) {
    const run = encodeFrame({
      op: Op.Run,
      slot: 0,
      base: 0,
      n: 1,
      topk: 0,
      rows: Float32Array.of(0, bad, 0),
    }, D);
    assert.throws(() => decodeFrame(run, LIMITS), /hidden value 1 of row 0 is/);
  }
  const error = Uint8Array.from([...bytes(Op.Error, 0, 2, 0, 0, 0, 0, 0), ...bytes(1), 0xc3, 0x28]);
  assert.throws(() => decodeFrame(error, LIMITS), /not valid UTF-8/);
  const biased = encodeFrame({
    op: Op.Run,
    slot: 0,
    base: 0,
    n: 1,
    topk: 0,
    rows: Float32Array.of(0, 0, 0),
    adjust: { bias: [{ id: 1, bias: NaN }] },
  }, D);
  assert.throws(() => decodeFrame(biased, LIMITS), /bias record 0 holds NaN, 1, 0/);
});

Deno.test("long error messages are cut to the cap at a character boundary", () => {
  const message = "é".repeat(MAX_MESSAGE_BYTES);
  const frame = decodeFrame(encodeFrame({ op: Op.Error, code: 1, message }), LIMITS);
  assert.equal(frame.op, Op.Error);
  if (frame.op !== Op.Error) return;
  assert.equal(frame.message, "é".repeat(MAX_MESSAGE_BYTES / 2));
});

Deno.test("the encoder refuses values that do not fit the layout", () => {
  assert.throws(
    () =>
      encodeFrame({ op: Op.Run, slot: 0, base: 0, n: 2, topk: 0, rows: new Float32Array(5) }, D),
    /5 values is not n·D/,
  );
  assert.throws(() => encodeFrame({ op: Op.Save, slot: -1, idx: 0 }), /slot is -1, not a u32/);
  const rows = Float32Array.of(0, 0, 0);
  assert.throws(
    // @ts-expect-error: a value from outside the types
    () => encodeFrame({ op: Op.Run, slot: 0, base: 0, n: 1, topk: 0, rows, logits: "first" }, D),
    /logits is "first", expected one of all, last, none/,
  );
  assert.throws(() => encodeFrame({ op: Op.Auth, proof: new Uint8Array(31) }), /31 bytes/);
  const top = Array.from({ length: MAX_TOPK + 1 }, (_, id) => ({ id, logit: 0 }));
  assert.throws(
    () => encodeFrame({ op: Op.Ids, slot: 0, base: 0, ids: Uint32Array.of(1), top, lse: 0 }),
    RangeError,
  );
});

Deno.test("random and mutated bytes decode or fail only with SyntaxError or RangeError", () => {
  const seed = fuzzSeed(12345);
  const r = new Random(seed);
  const runs = fuzzRuns(20_000);
  const encoded = SAMPLES.map((f) => encodeFrame(f, D));
  let decoded = 0;
  for (let i = 0; i < runs; i++) {
    const input = i % 2 === 0 ? r.bytes(r.int(80)) : r.mutate(r.pick(encoded));
    try {
      decodeFrame(input, LIMITS);
      decoded++;
    } catch (e) {
      assert.ok(e instanceof SyntaxError || e instanceof RangeError, `seed ${seed} run ${i}: ${e}`);
    }
  }
  // Mutations inside payloads leave many frames valid: the loop exercised both outcomes.
  assert.ok(decoded > 100 && decoded < runs, `decoded ${decoded}`);
});
