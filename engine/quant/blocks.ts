// Block fields shared by the dequantizers, quantizers and random block writer: f16 fields at
// byte offsets, the Q4_K/Q5_K 6-bit scale/min packing and the IQ4_NL/IQ4_XS value table.

import { f16ToF32, f32ToF16 } from "./f16.ts";

// deno-fmt-ignore
/** The 16 IQ4_NL/IQ4_XS levels (`kvalues_iq4nl` in ggml-common.h), ascending. */
export const KVALUES_IQ4NL: Int8Array = Int8Array.from([
  -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
]);

/** The little-endian f16 at `o`, as a number. */
export function readF16(bytes: Uint8Array, o: number): number {
  return f16ToF32(bytes[o] | (bytes[o + 1] << 8));
}

/**
 * Stores the block scale `x` as a little-endian f16 at `o` and returns the value actually stored.
 * Throws instead of storing an infinite scale, which would turn the whole block into inf/NaN.
 */
export function writeF16(bytes: Uint8Array, o: number, x: number): number {
  const bits = f32ToF16(x);
  const stored = f16ToF32(bits);
  if (!Number.isFinite(stored)) {
    throw new RangeError(
      `Cannot store the block scale ${x} as f16: it is beyond ±65504; the values are too large ` +
        `for this block format, so scale them down or use F32`,
    );
  }
  bytes[o] = bits & 0xff;
  bytes[o + 1] = bits >> 8;
  return stored;
}

/**
 * Unpacks the 8 scales and 8 mins (6 bits each) of a Q4_K/Q5_K block from the 12 bytes at `o`
 * (`get_scale_min_k4`): sub-blocks 0-3 sit in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
 * sub-blocks 4-7 keep their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the
 * spare top bits of bytes 0-3 (scales) and 4-7 (mins).
 */
export function unpackScaleMinK4(
  bytes: Uint8Array,
  o: number,
  sc: Uint8Array,
  m: Uint8Array,
): void {
  for (let j = 0; j < 4; j++) {
    sc[j] = bytes[o + j] & 63;
    m[j] = bytes[o + j + 4] & 63;
    sc[j + 4] = (bytes[o + j + 8] & 15) | ((bytes[o + j] >> 6) << 4);
    m[j + 4] = (bytes[o + j + 8] >> 4) | ((bytes[o + j + 4] >> 6) << 4);
  }
}

/** The inverse of unpackScaleMinK4: writes 8 scales and 8 mins (each 0..63) into 12 bytes at `o`. */
export function packScaleMinK4(bytes: Uint8Array, o: number, sc: Uint8Array, m: Uint8Array): void {
  for (let j = 0; j < 4; j++) {
    bytes[o + j] = sc[j] | ((sc[j + 4] >> 4) << 6);
    bytes[o + j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
    bytes[o + j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
  }
}
