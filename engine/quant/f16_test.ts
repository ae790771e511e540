// Tests for engine/quant/f16.ts: binary16 and bfloat16 conversions on edge values (zeros,
// subnormals, overflow, inf, NaN, rounding ties), checked against hand-derived bit patterns.

import assert from "node:assert/strict";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";

/** The f32 whose bit pattern is `bits` (built with a DataView, not with the code under test). */
function f32FromBits(bits: number): number {
  const v = new DataView(new ArrayBuffer(4));
  v.setUint32(0, bits);
  return v.getFloat32(0);
}

function f32Bits(x: number): number {
  const v = new DataView(new ArrayBuffer(4));
  v.setFloat32(0, x);
  return v.getUint32(0);
}

Deno.test("f16ToF32 decodes zeros, normals, subnormals, extremes, inf and NaN", () => {
  assert.ok(Object.is(f16ToF32(0x0000), 0));
  assert.ok(Object.is(f16ToF32(0x8000), -0));
  assert.equal(f16ToF32(0x3c00), 1);
  assert.equal(f16ToF32(0xc000), -2);
  assert.equal(f16ToF32(0x3555), 1365 / 4096); // exp 13 → 2^-2, mantissa 0x155: (1024+341)/4096
  assert.equal(f16ToF32(0x7bff), 65504);
  assert.equal(f16ToF32(0x0400), 2 ** -14); // smallest normal
  assert.equal(f16ToF32(0x0001), 2 ** -24); // smallest subnormal
  assert.equal(f16ToF32(0x83ff), -1023 * 2 ** -24); // largest subnormal, negative
  assert.equal(f16ToF32(0x7c00), Infinity);
  assert.equal(f16ToF32(0xfc00), -Infinity);
  assert.ok(Number.isNaN(f16ToF32(0x7e00)));
  assert.ok(Number.isNaN(f16ToF32(0xfc01)));
});

Deno.test("f16ToF32 agrees with the platform Float16Array on all 65536 patterns", () => {
  // Float16Array is an independent decoder (V8's), so this covers every exponent and mantissa.
  const h = new Uint16Array(1);
  const f = new Float16Array(h.buffer);
  for (let bits = 0; bits < 65536; bits++) {
    h[0] = bits;
    const want = f[0];
    const got = f16ToF32(bits);
    if (Number.isNaN(want)) assert.ok(Number.isNaN(got), `bits ${bits.toString(16)}`);
    else assert.ok(Object.is(got, want), `bits ${bits.toString(16)}: ${got} != ${want}`);
  }
});

Deno.test("f32ToF16 rounds to nearest even, including ties and subnormal ties", () => {
  assert.equal(f32ToF16(1), 0x3c00);
  assert.equal(f32ToF16(-0), 0x8000);
  assert.equal(f32ToF16(1 + 2 ** -11), 0x3c00); // halfway between 0x3c00 and 0x3c01: even
  assert.equal(f32ToF16(1 + 3 * 2 ** -11), 0x3c02); // halfway between 0x3c01 and 0x3c02: even
  assert.equal(f32ToF16(1 + 2 ** -11 + 2 ** -20), 0x3c01); // just above halfway
  assert.equal(f32ToF16(65504), 0x7bff);
  assert.equal(f32ToF16(65519.99), 0x7bff); // below the midpoint 65520 to the next step
  assert.equal(f32ToF16(65520), 0x7c00); // the tie rounds to the even "mantissa" 0x400: inf
  assert.equal(f32ToF16(-1e6), 0xfc00);
  assert.equal(f32ToF16(2 ** -24), 0x0001);
  assert.equal(f32ToF16(2 ** -25), 0x0000); // tie between 0 and 2^-24: even 0
  assert.equal(f32ToF16(2 ** -25 + 2 ** -40), 0x0001);
  assert.equal(f32ToF16(3 * 2 ** -25), 0x0002); // tie between 1 and 2 units: 2
  assert.equal(f32ToF16(1023.5 * 2 ** -24), 0x0400); // tie between largest subnormal and 2^-14
  assert.equal(f32ToF16(-(1023.25 * 2 ** -24)), 0x83ff);
  assert.equal(f32ToF16(f32FromBits(0x00000001)), 0x0000); // f32 subnormal underflows to 0
  assert.equal(f32ToF16(f32FromBits(0x80400000)), 0x8000);
});

Deno.test("f32ToF16 rounds the argument to f32 first, as the C float parameter does", () => {
  // 1 + 2^-11 + 2^-40 is 1 + 2^-11 in f32 (2^-40 is below half an f32 ulp), then a tie to even.
  assert.equal(f32ToF16(1 + 2 ** -11 + 2 ** -40), 0x3c00);
});

Deno.test("f32ToF16 maps inf to inf and keeps NaN quiet with its sign and top payload", () => {
  assert.equal(f32ToF16(Infinity), 0x7c00);
  assert.equal(f32ToF16(-Infinity), 0xfc00);
  assert.equal(f32ToF16(NaN), 0x7e00);
  // A signalling NaN with payload only in the low bits must not become inf: quiet bit forced.
  assert.equal(f32ToF16(f32FromBits(0x7f800001)), 0x7e00);
  // Sign kept; payload 0x412345 >> 13 = 0x209, quiet bit 0x200 already set.
  assert.equal(f32ToF16(f32FromBits(0xffc12345)), 0xfe09);
});

Deno.test("f32ToF16 agrees with Float16Array on random f32 values of every magnitude", () => {
  // For an f32 input, the platform's double → f16 rounding is a single correct rounding too.
  const h = new Float16Array(1);
  const h16 = new Uint16Array(h.buffer);
  let s = 0x9e3779b9;
  for (let i = 0; i < 200_000; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    // Exponents 90..160 reach from far below the f16 subnormals to beyond the f16 range.
    const bits = ((s & 0x807fffff) | ((90 + (s >>> 23) % 71) << 23)) >>> 0;
    const x = f32FromBits(bits);
    h[0] = x;
    assert.equal(f32ToF16(x), h16[0], `f32 bits ${bits.toString(16)}`);
  }
});

Deno.test("bf16ToF32 is the upper half of an f32", () => {
  assert.equal(bf16ToF32(0x3f80), 1);
  assert.equal(bf16ToF32(0xc040), -3);
  assert.equal(bf16ToF32(0x0001), 2 ** -133); // f32 subnormal: 2^16 units of 2^-149
  assert.equal(bf16ToF32(0x7f80), Infinity);
  assert.ok(Object.is(bf16ToF32(0x8000), -0));
  assert.ok(Number.isNaN(bf16ToF32(0x7fc1)));
});

Deno.test("f32ToBf16 matches ggml: nearest even on the bits, NaN quieted, subnormals kept", () => {
  assert.equal(f32ToBf16(1), 0x3f80);
  assert.equal(f32ToBf16(1 + 2 ** -8), 0x3f80); // tie, even
  assert.equal(f32ToBf16(1 + 3 * 2 ** -8), 0x3f82); // tie, even
  assert.equal(f32ToBf16(1 + 2 ** -8 + 2 ** -20), 0x3f81);
  assert.equal(f32ToBf16(-3), 0xc040);
  assert.equal(f32ToBf16(f32FromBits(0x7f7fffff)), 0x7f80); // f32 max rounds up to inf
  assert.equal(f32ToBf16(-Infinity), 0xff80);
  assert.equal(f32ToBf16(NaN), 0x7fc0);
  assert.equal(f32ToBf16(f32FromBits(0x7f800001)), 0x7fc0); // sNaN: (bits >> 16) | 0x40
  assert.equal(f32ToBf16(f32FromBits(0xff812345)), 0xffc1);
  assert.equal(f32ToBf16(f32FromBits(0x00018000)), 0x0002); // subnormal tie, odd 1 → even 2
  assert.equal(f32ToBf16(f32FromBits(0x00008000)), 0x0000); // subnormal tie, even 0 stays
  assert.equal(f32Bits(bf16ToF32(f32ToBf16(0.1))), 0x3dcd0000); // 0x3dcccccd rounds up
});
