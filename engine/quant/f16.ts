// Half-precision conversions: IEEE binary16 and bfloat16 to and from f32, bit-exact with ggml.
// Used by the block dequantizers and quantizers here and by anything that reads F16/BF16 tensors.

/** One f32 seen as its bits: a JS number goes in, the rounded f32 bit pattern comes out. */
const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

function f16BitsToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1024 + mant) * 2 ** (exp - 25);
}

/** All 65536 f16 values as f32: the dequantizers read one scale per block through it. */
const F16_TO_F32: Float32Array = Float32Array.from(
  { length: 65536 },
  (_, bits) => f16BitsToNumber(bits),
);

/** f16 bits (low 16 bits of `bits`) to their value; exact, as every binary16 value is an f32. */
export function f16ToF32(bits: number): number {
  return F16_TO_F32[bits & 0xffff];
}

/**
 * f32 to f16 bits, round to nearest even. `x` is first rounded to f32 (the C argument is a float).
 * Overflow gives ±inf; values below half the smallest subnormal give ±0; NaN stays NaN with the
 * quiet bit set and the top payload bits kept, as x86 F16C `vcvtps2ph` does (ggml's x86 path).
 */
export function f32ToF16(x: number): number {
  f32Scratch[0] = x;
  const b = u32Scratch[0];
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  const mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant === 0 ? 0 : 0x200 | (mant >>> 13));
  const e = exp - 112; // f32 bias 127 → f16 bias 15
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    // f16 subnormal: the value in units of 2^-24 is full / 2^shift. A carry out of the
    // 10 mantissa bits lands on exponent 1, which is the correct encoding of 2^-14.
    const shift = 14 - e;
    if (shift > 24) return sign;
    const full = mant | 0x800000;
    const rem = full & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    let q = full >>> shift;
    if (rem > half || (rem === half && (q & 1) === 1)) q++;
    return sign | q;
  }
  // A carry out of the mantissa increments the exponent; from 30 it reaches 31 = inf, as it must.
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1)) h++;
  return sign | h;
}

/** bf16 bits (low 16 bits of `bits`) to their value: the upper half of an f32. */
export function bf16ToF32(bits: number): number {
  u32Scratch[0] = (bits & 0xffff) << 16;
  return f32Scratch[0];
}

/**
 * f32 to bf16 bits as ggml's GGML_FP32_TO_BF16 (`ggml_compute_fp32_to_bf16`): round to nearest
 * even on the f32 bits (subnormals kept, overflow to ±inf), NaN truncated with the quiet bit forced.
 */
export function f32ToBf16(x: number): number {
  f32Scratch[0] = x;
  const b = u32Scratch[0];
  if ((b & 0x7fffffff) > 0x7f800000) return (b >>> 16) | 0x40;
  // The largest non-NaN pattern (0xff800000) plus 0x8000 stays below 2^32, so nothing wraps.
  return (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
}
