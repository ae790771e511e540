// Tests for engine/quant/dequant.ts: hand-built blocks of every format, expected values derived
// from the layouts of docs/model_arch.md §6 (element by element) plus literal spot values.

import assert from "node:assert/strict";
import { DEQUANT_TYPES, dequantize } from "./dequant.ts";
import { GgmlType } from "./ggml_types.ts";

/** kvalues_iq4nl as printed in docs/model_arch.md §6.1. */
const KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/** f16 bit patterns used below, with their values worked out by hand. */
const H = {
  one: 0x3c00, // 1
  half: 0x3800, // 0.5
  quarter: 0x3400, // 0.25
  eighth: 0x3000, // 0.125
  two: 0x4000, // 2
  minusOne: 0xbc00, // -1
  minusTwo: 0xc000, // -2
  three: 0x4200, // 3
  third: 0x3555, // 1365/4096 = 0.333251953125
  tiny: 0x0001, // 2^-24
};

/** A block of `size` zero bytes with the given little-endian u16 and byte fields set. */
function block(
  size: number,
  u16: [number, number][],
  fields: [number, number[]][] = [],
): Uint8Array {
  const b = new Uint8Array(size);
  for (const [at, v] of u16) {
    b[at] = v & 0xff;
    b[at + 1] = v >> 8;
  }
  for (const [at, bytes] of fields) b.set(bytes, at);
  return b;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function range(n: number, f: (i: number) => number): number[] {
  return Array.from({ length: n }, (_, i) => f(i));
}

/** Dequantizes and compares every element with Math.fround(expected(i)), bit for bit. */
function check(type: GgmlType, bytes: Uint8Array, n: number, expected: (i: number) => number) {
  const y = dequantize(type, bytes, n);
  assert.equal(y.length, n);
  for (let i = 0; i < n; i++) {
    const want = Math.fround(expected(i));
    assert.ok(Object.is(y[i], want), `${GgmlType[type]} element ${i}: got ${y[i]}, want ${want}`);
  }
  return y;
}

Deno.test("F32, F16 and BF16 decode bit for bit, from any byte offset", () => {
  const f32 = new Uint8Array(13);
  const view = new DataView(f32.buffer);
  view.setFloat32(1, 1.5, true);
  view.setFloat32(5, -0, true);
  view.setUint32(9, 0x7fc01234, true); // NaN with a payload
  const y = dequantize(GgmlType.F32, f32.subarray(1), 3);
  assert.equal(y[0], 1.5);
  assert.ok(Object.is(y[1], -0));
  assert.equal(new Uint32Array(y.buffer)[2], 0x7fc01234);

  const h = [0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x8000, 0x3555];
  const f16 = block(16, h.map((v, i) => [2 * i, v]));
  check(
    GgmlType.F16,
    f16,
    8,
    (i) => [1, -2, 2 ** -24, 65504, Infinity, -Infinity, -0, 1365 / 4096][i],
  );

  const b = [0x3f80, 0xc040, 0x0001, 0x7f80, 0x7fc1];
  const y16 = dequantize(GgmlType.BF16, block(10, b.map((v, i) => [2 * i, v])), 5);
  assert.deepEqual(Array.from(y16.subarray(0, 4)), [1, -3, 2 ** -133, Infinity]);
  assert.equal(new Uint32Array(y16.buffer)[4], 0x7fc10000);
});

Deno.test("Q4_0: y[j] = (low nibble − 8)·d, y[j+16] = (high nibble − 8)·d, two blocks", () => {
  const b0 = block(18, [[0, H.half]], [[2, range(16, (j) => j | ((15 - j) << 4))]]);
  const b1 = block(18, [[0, H.minusTwo]], [[2, range(16, () => 0x9a)]]);
  const y = check(GgmlType.Q4_0, concat(b0, b1), 64, (i) => {
    if (i < 16) return (i - 8) * 0.5;
    if (i < 32) return (15 - (i - 16) - 8) * 0.5;
    return i < 48 ? (10 - 8) * -2 : (9 - 8) * -2;
  });
  assert.deepEqual([y[0], y[15], y[16], y[31], y[32], y[63]], [-4, 3.5, 3.5, -4, -4, -2]);
});

Deno.test("Q4_1: y = nibble·d + m", () => {
  const b = block(20, [[0, H.quarter], [2, H.minusOne]], [[
    4,
    range(16, (j) => j | ((15 - j) << 4)),
  ]]);
  const y = check(GgmlType.Q4_1, b, 32, (i) => (i < 16 ? i : 31 - i) * 0.25 - 1);
  assert.deepEqual([y[0], y[15], y[16]], [-1, 2.75, 2.75]);
});

// qh = 0x80010021: bits 0, 5, 16 and 31 set, i.e. the fifth bit of elements 0, 5, 16 and 31.
const QH_BYTES = [0x21, 0x00, 0x01, 0x80];
const QH_SET = new Set([0, 5, 16, 31]);

Deno.test("Q5_0: fifth bit from qh (bit j for element j), offset −16", () => {
  const b = block(22, [[0, H.one]], [[2, QH_BYTES], [6, range(16, () => 0x21)]]);
  const y = check(GgmlType.Q5_0, b, 32, (i) => ((i < 16 ? 1 : 2) | (QH_SET.has(i) ? 16 : 0)) - 16);
  assert.deepEqual([y[0], y[1], y[5], y[15], y[16], y[17], y[31]], [1, -15, 1, -15, 2, -14, 2]);
});

Deno.test("Q5_1: fifth bit from qh, y = q·d + m", () => {
  const b = block(24, [[0, H.half], [2, H.three]], [[4, QH_BYTES], [8, range(16, () => 0x21)]]);
  const y = check(
    GgmlType.Q5_1,
    b,
    32,
    (i) => ((i < 16 ? 1 : 2) | (QH_SET.has(i) ? 16 : 0)) * 0.5 + 3,
  );
  assert.deepEqual([y[0], y[1], y[16], y[17]], [11.5, 3.5, 12, 4]);
});

Deno.test("Q8_0: signed bytes times d", () => {
  const b = block(34, [[0, H.eighth]], [[2, range(32, (j) => (8 * j - 128) & 0xff)]]);
  const y = check(GgmlType.Q8_0, b, 32, (i) => (8 * i - 128) * 0.125);
  assert.deepEqual([y[0], y[16], y[31]], [-16, 0, 15]);
});

Deno.test("IQ4_NL: d·kvalues[nibble], low nibbles first", () => {
  const b = block(18, [[0, H.two]], [[2, range(16, (j) => j | ((15 - j) << 4))]]);
  const y = check(GgmlType.IQ4_NL, b, 32, (i) => 2 * (i < 16 ? KV[i] : KV[31 - i]));
  assert.deepEqual([y[0], y[8], y[16], y[31]], [-254, 2, 226, -254]);
});

Deno.test("Q2_K: 4-bit scale/min pairs, 2-bit values in four shifts per 32 bytes", () => {
  // scales[i]: scale 1 + i%4, min i%3. qs[k] = 37k mod 256.
  const scales = range(16, (i) => (1 + (i % 4)) | ((i % 3) << 4));
  const qs = range(64, (k) => (37 * k) & 0xff);
  const b = block(84, [[80, H.half], [82, H.quarter]], [[0, scales], [16, qs]]);
  const y = check(GgmlType.Q2_K, b, 256, (e) => {
    const n = e >> 7; // half: qs[32n..]
    const j = (e >> 5) & 3; // shift 2j
    const w = e & 31; // byte within the half; w ≥ 16 is the second sub-block of the step
    const sc = scales[8 * n + 2 * j + (w >> 4)];
    const q = (qs[32 * n + w] >> (2 * j)) & 3;
    return 0.5 * (sc & 15) * q - 0.25 * (sc >> 4);
  });
  // e = 161: half 1, step 1, w = 1 → scales[10] = 3 | 1<<4, qs[33] = 1221 mod 256 = 197 =
  // 0b11000101, bits 2..3 = 01 → 0.5·3·1 − 0.25·1.
  assert.equal(y[161], 1.25);
  // e = 20: half 0, step 0, w = 20 → scales[1] = 2 | 1<<4, qs[20] = 740 mod 256 = 228 = 0b11100100,
  // bits 0..1 = 00 → −0.25.
  assert.equal(y[20], -0.25);
});

Deno.test("Q3_K: hmask high bits, 2-bit values, 6-bit signed scales packed in 12 bytes", () => {
  const sc6 = [0, 63, 1, 62, 32, 33, 31, 16, 48, 5, 60, 40, 20, 10, 50, 7]; // stored, offset 32
  const scales = new Array(12).fill(0);
  for (let j = 0; j < 16; j++) {
    scales[j % 8] |= (sc6[j] & 15) << (j < 8 ? 0 : 4);
    scales[8 + (j % 4)] |= (sc6[j] >> 4) << (2 * Math.floor(j / 4));
  }
  const hmask = range(32, (w) => (w * 73 + 11) & 0xff);
  const qs = range(64, (k) => (k * 151 + 7) & 0xff);
  const b = block(110, [[108, H.quarter]], [[0, hmask], [32, qs], [96, scales]]);
  const y = check(GgmlType.Q3_K, b, 256, (e) => {
    const n = e >> 7;
    const j = (e >> 5) & 3;
    const w = e & 31;
    const low = (qs[32 * n + w] >> (2 * j)) & 3;
    const high = (hmask[w] >> (4 * n + j)) & 1;
    return 0.25 * (sc6[8 * n + 2 * j + (w >> 4)] - 32) * (low - (high ? 0 : 4));
  });
  // Literal packed bytes: scales[0] = sc6[0] low | sc6[8] low << 4 = 0 | 0 << 4; scales[8] =
  // top bits of sc6[0], sc6[4], sc6[8], sc6[12] = 0, 2, 3, 1 → 0b01_11_10_00.
  assert.equal(scales[0], 0x00);
  assert.equal(scales[8], 0x78);
  // e = 16: sub-block 1 (scale 63 − 32 = 31); hmask[16] = 1179 mod 256 = 155 (bit 0 set, no
  // subtraction); qs[16] = 2423 mod 256 = 119 = 0b01110111, bits 0..1 = 3 → 0.25·31·3.
  assert.equal(y[16], 23.25);
  // e = 0: sub-block 0 (scale −32); hmask[0] = 11, bit 0 set; qs[0] = 7, bits 0..1 = 3 → −24.
  assert.equal(y[0], -24);
});

/**
 * The 12 scale bytes of Q4_K/Q5_K for 6-bit scales `sc` and mins `m`, by the unpack rule of
 * docs/model_arch.md §6.3.
 */
function packK4(sc: number[], m: number[]): number[] {
  const s = new Array(12).fill(0);
  for (let j = 0; j < 4; j++) {
    s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
    s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
    s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
  }
  return s;
}

const K4_SC = [1, 2, 3, 63, 17, 33, 48, 62];
const K4_M = [0, 5, 63, 7, 40, 21, 16, 63];

Deno.test("Q4_K/Q5_K scale unpack for j >= 4 reads nibbles of bytes 8-11 and top bits of 0-7", () => {
  // Literal: sub-block 5 has scale 33 = 0b10_0001 and min 21 = 0b01_0101.
  const s = packK4(K4_SC, K4_M);
  assert.equal(s[9], 0x51); // low nibbles: scale 1, min 5
  assert.equal(s[1] >> 6, 2); // scale top bits, stored above scale 1 (= 2) of sub-block 1
  assert.equal(s[5] >> 6, 1); // min top bits, above min 5 of sub-block 1
  // Block with d = 1, dmin = 1 and every nibble 1: sub-block 5 (values 160..191, high nibbles of
  // chunk 2) decodes to 33·1 − 21 = 12.
  const b = block(144, [[0, H.one], [2, H.one]], [[4, s], [16, range(128, () => 0x11)]]);
  assert.equal(dequantize(GgmlType.Q4_K, b, 256)[170], 12);
});

Deno.test("Q4_K: chunk c holds sub-blocks 2c (low nibbles) and 2c+1 (high), f32 rounding", () => {
  const qs = range(128, (k) => (k * 29 + 3) & 0xff);
  // d = 0.333251953125 makes d·sc·q − dmin·m need rounding to f32, as in the C code.
  for (
    const [d, dBits, dmin, dminBits] of [[0.5, H.half, 0.25, H.quarter], [
      1365 / 4096,
      H.third,
      2 ** -24,
      H.tiny,
    ]]
  ) {
    const b = block(144, [[0, dBits], [2, dminBits]], [[4, packK4(K4_SC, K4_M)], [16, qs]]);
    check(GgmlType.Q4_K, b, 256, (e) => {
      const c = e >> 6;
      const h = (e >> 5) & 1;
      const byte = qs[32 * c + (e & 31)];
      const q = h ? byte >> 4 : byte & 15;
      const j = 2 * c + h;
      return Math.fround(Math.fround(d * K4_SC[j]) * q) - Math.fround(dmin * K4_M[j]);
    });
  }
});

Deno.test("Q5_K: fifth bit is bit 2c (low half) or 2c+1 (high half) of qh[l]", () => {
  const qh = range(32, (l) => (l * 97 + 41) & 0xff);
  const qs = range(128, (k) => (k * 29 + 3) & 0xff);
  const b = block(176, [[0, H.half], [2, H.quarter]], [[4, packK4(K4_SC, K4_M)], [16, qh], [
    48,
    qs,
  ]]);
  const y = check(GgmlType.Q5_K, b, 256, (e) => {
    const c = e >> 6;
    const h = (e >> 5) & 1;
    const l = e & 31;
    const byte = qs[32 * c + l];
    const q = (h ? byte >> 4 : byte & 15) + (((qh[l] >> (2 * c + h)) & 1) << 4);
    return 0.5 * K4_SC[2 * c + h] * q - 0.25 * K4_M[2 * c + h];
  });
  // e = 225: chunk 3, high half, l = 1: qs[97] = 2816 mod 256 = 0 → nibble 0; qh[1] = 138 =
  // 0b10001010, bit 7 set → q = 16; sub-block 7: 0.5·62·16 − 0.25·63.
  assert.equal(y[225], 480.25);
});

Deno.test("Q6_K: ql nibbles, qh 2-bit pairs and int8 scales in their quarter order", () => {
  const ql = range(128, (k) => (k * 53 + 17) & 0xff);
  const qh = range(64, (k) => (k * 101 + 5) & 0xff);
  const sc = [-128, 127, -1, 1, 2, -3, 64, -64, 5, 7, -9, 11, 100, -100, 33, 0];
  const b = block(210, [[208, H.eighth]], [[0, ql], [128, qh], [192, sc.map((v) => v & 0xff)]]);
  const y = check(GgmlType.Q6_K, b, 256, (e) => {
    const n = e >> 7;
    const k = (e >> 5) & 3; // quarter: q1..q4
    const l = e & 31;
    const byte = ql[64 * n + 32 * (k & 1) + l];
    const low = k < 2 ? byte & 15 : byte >> 4;
    const high = (qh[32 * n + l] >> (2 * k)) & 3;
    return 0.125 * sc[8 * n + (l >> 4) + 2 * k] * ((low | (high << 4)) - 32);
  });
  // e = 100: half 0, quarter 3 (q4), l = 4: ql[36] = 1925 mod 256 = 133 → high nibble 8;
  // qh[4] = 409 mod 256 = 153 = 0b10011001, bits 6..7 = 2 → q = 8 | 32 − 32 = 8;
  // scale sc[0 + 0 + 6] = 64 → 0.125·64·8.
  assert.equal(y[100], 64);
});

Deno.test("IQ4_XS: 6-bit scales from scales_l nibbles and scales_h pairs, minus 32", () => {
  const ls = [0, 63, 32, 31, 17, 48, 1, 40];
  const scalesL = range(4, (i) => (ls[2 * i] & 15) | ((ls[2 * i + 1] & 15) << 4));
  const scalesH = ls.reduce((s, v, ib) => s | ((v >> 4) << (2 * ib)), 0);
  const qs = range(128, (k) => (k * 59 + 13) & 0xff);
  const b = block(136, [[0, H.quarter], [2, scalesH]], [[4, scalesL], [8, qs]]);
  const y = check(GgmlType.IQ4_XS, b, 256, (e) => {
    const ib = e >> 5;
    const w = e & 31;
    const byte = qs[16 * ib + (w & 15)];
    return 0.25 * (ls[ib] - 32) * KV[w < 16 ? byte & 15 : byte >> 4];
  });
  // Literal: scales_h holds the top bits 0,3,2,1,1,3,0,2 → 0b10_00_11_01_01_10_11_00 = 0x8d6c.
  assert.equal(scalesH, 0x8d6c);
  // e = 40: sub-block 1 (63 − 32 = 31), qs[24] = 1429 mod 256 = 149 → low nibble 5 → −35.
  assert.equal(y[40], 0.25 * 31 * -35);
});

Deno.test("a zero level times a negative scale is −0, as in C", () => {
  // C computes x·d with x = 0 and d < 0, giving −0; a float64 reference or a GPU comparison that
  // checks bits must see the same sign. d = −1 throughout; the level that decodes to 0 is 8 for
  // Q4_0 (nibble 8), 16 for Q5_0 (nibble 0 with the fifth bit set), 0 for Q8_0.
  const q4 = dequantize(
    GgmlType.Q4_0,
    block(18, [[0, H.minusOne]], [[2, range(16, () => 0x88)]]),
    32,
  );
  assert.ok(q4.every((v) => Object.is(v, -0)));
  const q5 = dequantize(
    GgmlType.Q5_0,
    block(22, [[0, H.minusOne]], [[2, [255, 255, 255, 255]]]),
    32,
  );
  assert.ok(q5.every((v) => Object.is(v, -0)));
  const q8 = dequantize(GgmlType.Q8_0, block(34, [[0, H.minusOne]]), 32);
  assert.ok(q8.every((v) => Object.is(v, -0)));
});

Deno.test("dequantize rejects unknown types, partial blocks, short input and short output", () => {
  assert.throws(
    () => dequantize(GgmlType.Q8_K, new Uint8Array(292), 256),
    /Cannot dequantize Q8_K: no dequantizer/,
  );
  assert.throws(
    () => dequantize(99 as GgmlType, new Uint8Array(4), 1),
    /Cannot dequantize type 99/,
  );
  assert.throws(
    () => dequantize(GgmlType.Q4_K, new Uint8Array(144), 200),
    /not a whole number of 256-value blocks/,
  );
  assert.throws(() => dequantize(GgmlType.Q4_0, new Uint8Array(35), 64), /need 36 bytes, got 35/);
  assert.throws(
    () => dequantize(GgmlType.Q8_0, new Uint8Array(34), 32, new Float32Array(31)),
    /output of 31/,
  );
});

Deno.test("dequantize writes into a longer out and returns its first n elements", () => {
  const out = new Float32Array(40).fill(7);
  const b = block(34, [[0, H.one]], [[2, range(32, (j) => j)]]);
  const y = dequantize(GgmlType.Q8_0, b, 32, out);
  assert.equal(y.buffer, out.buffer);
  assert.equal(y.length, 32);
  assert.equal(out[31], 31);
  assert.equal(out[32], 7);
  assert.equal(dequantize(GgmlType.Q8_0, b, 32, y), y);
});

Deno.test("DEQUANT_TYPES lists the fifteen formats the engine reads", () => {
  const names = DEQUANT_TYPES.map((t) => GgmlType[t]).sort();
  assert.deepEqual(
    names,
    [
      "BF16",
      "F16",
      "F32",
      "IQ4_NL",
      "IQ4_XS",
      "Q2_K",
      "Q3_K",
      "Q4_0",
      "Q4_1",
      "Q4_K",
      "Q5_0",
      "Q5_1",
      "Q5_K",
      "Q6_K",
      "Q8_0",
    ],
  );
});
