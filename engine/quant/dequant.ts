// CPU dequantizers for every GGUF weight format the engine reads, bit-identical to llama.cpp's
// f32 `dequantize_row_*` (ggml-quants.c): the reference engine's weights and the GPU kernels' oracle.
//
// Exactness: C multiplies an f16 scale (11 significant bits) by small integers, so every product
// (d·sc, d·sc·q, kvalue·dl, …) fits the 24-bit f32 significand and is exact both in C and in a
// double here. The only roundings are the final subtractions/additions (`d1·q − m1`, `q·d + m`),
// and a double result of two f32 operands rounded once to f32 equals the f32 operation (53 ≥ 2·24+2).
// Storing into the Float32Array does that rounding; Math.fround marks the per-sub-block scale
// products that C keeps in f32 variables, so the code reads like the C it must match.

import { blockGeometry, GgmlType, typeName } from "./ggml_types.ts";
import { f16ToF32 } from "./f16.ts";
import { KVALUES_IQ4NL as KV, readF16, unpackScaleMinK4 } from "./blocks.ts";

/** Dequantizes `nb` whole blocks of `src` into `y` (which has room for them). */
type BlockDequantizer = (src: Uint8Array, nb: number, y: Float32Array) => void;

/** Sign-extends a byte. */
function i8(b: number): number {
  return (b << 24) >> 24;
}

function dequantF32(src: Uint8Array, nb: number, y: Float32Array): void {
  // A byte copy keeps every bit (NaN payloads too) and needs no alignment. Hosts are little-endian.
  new Uint8Array(y.buffer, y.byteOffset, nb * 4).set(src.subarray(0, nb * 4));
}

function dequantF16(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0; i < nb; i++) y[i] = f16ToF32(src[2 * i] | (src[2 * i + 1] << 8));
}

function dequantBf16(src: Uint8Array, nb: number, y: Float32Array): void {
  const bits = new Uint32Array(y.buffer, y.byteOffset, nb);
  for (let i = 0; i < nb; i++) bits[i] = ((src[2 * i] | (src[2 * i + 1] << 8)) << 16) >>> 0;
}

function dequantQ4_0(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 18, yo += 32) {
    const d = readF16(src, o);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 2 + j];
      y[yo + j] = ((q & 15) - 8) * d;
      y[yo + j + 16] = ((q >> 4) - 8) * d;
    }
  }
}

function dequantQ4_1(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 20, yo += 32) {
    const d = readF16(src, o);
    const m = readF16(src, o + 2);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 4 + j];
      y[yo + j] = (q & 15) * d + m;
      y[yo + j + 16] = (q >> 4) * d + m;
    }
  }
}

/**
 * Q5_0 (q − 16)·d and Q5_1 q·d + m; bit j of qh is element j's fifth bit. Q5_0 must not add a
 * zero min: C's 0·(negative d) is −0, and −0 + 0 would turn it into +0.
 */
function dequantQ5(src: Uint8Array, nb: number, y: Float32Array, hasMin: boolean): void {
  const size = hasMin ? 24 : 22;
  const qhAt = hasMin ? 4 : 2;
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += size, yo += 32) {
    const d = readF16(src, o);
    const m = hasMin ? readF16(src, o + 2) : 0;
    const qh = src[o + qhAt] | (src[o + qhAt + 1] << 8) | (src[o + qhAt + 2] << 16) |
      (src[o + qhAt + 3] << 24);
    for (let j = 0; j < 16; j++) {
      const q = src[o + qhAt + 4 + j];
      const lo = (q & 15) | (((qh >>> j) & 1) << 4);
      const hi = (q >> 4) | (((qh >>> (j + 16)) & 1) << 4);
      if (hasMin) {
        y[yo + j] = lo * d + m;
        y[yo + j + 16] = hi * d + m;
      } else {
        y[yo + j] = (lo - 16) * d;
        y[yo + j + 16] = (hi - 16) * d;
      }
    }
  }
}

function dequantQ8_0(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 34, yo += 32) {
    const d = readF16(src, o);
    for (let j = 0; j < 32; j++) y[yo + j] = i8(src[o + 2 + j]) * d;
  }
}

function dequantIq4Nl(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 18, yo += 32) {
    const d = readF16(src, o);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 2 + j];
      y[yo + j] = d * KV[q & 15];
      y[yo + j + 16] = d * KV[q >> 4];
    }
  }
}

// Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min) | qs[64] | d | dmin.
// Half n uses qs[32n..32n+31]; step j takes bits 2j..2j+1: 16 values from q[l], 16 from q[l+16].
function dequantQ2_K(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 84) {
    const d = readF16(src, o + 80);
    const dmin = readF16(src, o + 82);
    for (let n = 0; n < 2; n++) {
      const q = o + 16 + 32 * n;
      for (let j = 0; j < 4; j++) {
        const shift = 2 * j;
        for (let h = 0; h < 2; h++) {
          const sc = src[o + 8 * n + 2 * j + h];
          const dl = Math.fround(d * (sc & 15));
          const ml = Math.fround(dmin * (sc >> 4));
          for (let l = 0; l < 16; l++) y[yo++] = dl * ((src[q + 16 * h + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// Q3_K, 110 bytes: hmask[32] | qs[64] | scales[12] (16 × 6-bit, offset 32) | d.
// hmask bit (4n + j) of byte l is the high bit of the value taken from bits 2j of qs[32n + l];
// a clear bit means "subtract 4".
function dequantQ3_K(src: Uint8Array, nb: number, y: Float32Array): void {
  const sc = new Int8Array(16);
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 110) {
    const d = readF16(src, o + 108);
    const s = o + 96;
    for (let j = 0; j < 16; j++) {
      const low = j < 8 ? src[s + j] & 15 : src[s + j - 8] >> 4;
      const high = (src[s + 8 + (j & 3)] >> (2 * (j >> 2))) & 3;
      sc[j] = (low | (high << 4)) - 32;
    }
    for (let n = 0; n < 2; n++) {
      const q = o + 32 + 32 * n;
      for (let j = 0; j < 4; j++, yo += 32) {
        const shift = 2 * j;
        const hshift = 4 * n + j;
        const dl0 = Math.fround(d * sc[8 * n + 2 * j]);
        const dl1 = Math.fround(d * sc[8 * n + 2 * j + 1]);
        for (let l = 0; l < 32; l++) {
          const lo = (src[q + l] >> shift) & 3;
          const hi = (src[o + l] >> hshift) & 1;
          y[yo + l] = (l < 16 ? dl0 : dl1) * (lo - 4 + 4 * hi);
        }
      }
    }
  }
}

/** Q4_K (144 bytes) and Q5_K (176): d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128]. */
function dequantQ45_K(src: Uint8Array, nb: number, y: Float32Array, fiveBit: boolean): void {
  const sc = new Uint8Array(8);
  const m = new Uint8Array(8);
  const size = fiveBit ? 176 : 144;
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += size) {
    const d = readF16(src, o);
    const dmin = readF16(src, o + 2);
    unpackScaleMinK4(src, o + 4, sc, m);
    const qh = o + 16;
    const qs = o + (fiveBit ? 48 : 16);
    // Chunk c: 64 values from qs[32c..32c+31], low nibbles (sub-block 2c) then high (2c+1);
    // Q5_K's fifth bits are bits 2c and 2c+1 of qh[l].
    for (let c = 0; c < 4; c++) {
      const d1 = Math.fround(d * sc[2 * c]);
      const m1 = Math.fround(dmin * m[2 * c]);
      const d2 = Math.fround(d * sc[2 * c + 1]);
      const m2 = Math.fround(dmin * m[2 * c + 1]);
      const q = qs + 32 * c;
      for (let l = 0; l < 32; l++) {
        const h = fiveBit ? src[qh + l] >> (2 * c) : 0;
        y[yo + l] = d1 * ((src[q + l] & 15) | ((h & 1) << 4)) - m1;
        y[yo + 32 + l] = d2 * ((src[q + l] >> 4) | ((h & 2) << 3)) - m2;
      }
      yo += 64;
    }
  }
}

// Q6_K, 210 bytes: ql[128] | qh[64] | scales[16] int8 | d. Half n (128 values) uses ql[64n..],
// qh[32n..], scales[8n..]; for l < 32, qh[l] carries the top 2 bits of all four quarters.
function dequantQ6_K(src: Uint8Array, nb: number, y: Float32Array): void {
  const ds = new Float64Array(16);
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 210) {
    const d = readF16(src, o + 208);
    for (let j = 0; j < 16; j++) ds[j] = Math.fround(d * i8(src[o + 192 + j]));
    for (let n = 0; n < 2; n++, yo += 128) {
      const ql = o + 64 * n;
      const qh = o + 128 + 32 * n;
      const s = 8 * n;
      for (let l = 0; l < 32; l++) {
        const is = s + (l >> 4);
        const h = src[qh + l];
        const a = src[ql + l];
        const b = src[ql + l + 32];
        y[yo + l] = ds[is] * (((a & 15) | ((h & 3) << 4)) - 32);
        y[yo + l + 32] = ds[is + 2] * (((b & 15) | (((h >> 2) & 3) << 4)) - 32);
        y[yo + l + 64] = ds[is + 4] * (((a >> 4) | (((h >> 4) & 3) << 4)) - 32);
        y[yo + l + 96] = ds[is + 6] * (((b >> 4) | (((h >> 6) & 3) << 4)) - 32);
      }
    }
  }
}

// IQ4_XS, 136 bytes: d | scales_h u16 | scales_l[4] | qs[128]. Sub-block ib's 6-bit scale is the
// nibble ib%2 of scales_l[ib/2] plus bits 2ib..2ib+1 of scales_h, stored with offset 32.
function dequantIq4Xs(src: Uint8Array, nb: number, y: Float32Array): void {
  for (let i = 0, o = 0, yo = 0; i < nb; i++, o += 136) {
    const d = readF16(src, o);
    const sh = src[o + 2] | (src[o + 3] << 8);
    for (let ib = 0; ib < 8; ib++, yo += 32) {
      const ls = ((src[o + 4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      const dl = Math.fround(d * (ls - 32));
      const q = o + 8 + 16 * ib;
      for (let j = 0; j < 16; j++) {
        y[yo + j] = dl * KV[src[q + j] & 15];
        y[yo + j + 16] = dl * KV[src[q + j] >> 4];
      }
    }
  }
}

const DEQUANTIZERS: ReadonlyMap<GgmlType, BlockDequantizer> = new Map<GgmlType, BlockDequantizer>([
  [GgmlType.F32, dequantF32],
  [GgmlType.F16, dequantF16],
  [GgmlType.BF16, dequantBf16],
  [GgmlType.Q4_0, dequantQ4_0],
  [GgmlType.Q4_1, dequantQ4_1],
  [GgmlType.Q5_0, (s, nb, y) => dequantQ5(s, nb, y, false)],
  [GgmlType.Q5_1, (s, nb, y) => dequantQ5(s, nb, y, true)],
  [GgmlType.Q8_0, dequantQ8_0],
  [GgmlType.IQ4_NL, dequantIq4Nl],
  [GgmlType.Q2_K, dequantQ2_K],
  [GgmlType.Q3_K, dequantQ3_K],
  [GgmlType.Q4_K, (s, nb, y) => dequantQ45_K(s, nb, y, false)],
  [GgmlType.Q5_K, (s, nb, y) => dequantQ45_K(s, nb, y, true)],
  [GgmlType.Q6_K, dequantQ6_K],
  [GgmlType.IQ4_XS, dequantIq4Xs],
]);

/** The types `dequantize` accepts, in type-id order. */
export const DEQUANT_TYPES: readonly GgmlType[] = [...DEQUANTIZERS.keys()].sort((a, b) => a - b);

/**
 * Dequantizes `n` elements (a whole number of blocks) from the start of `bytes` exactly as
 * llama.cpp's `dequantize_row_*` does in f32. Writes into `out` when given (at least `n` long;
 * the result is its first `n` elements), else into a new array.
 */
export function dequantize(
  type: GgmlType,
  bytes: Uint8Array,
  n: number,
  out?: Float32Array,
): Float32Array {
  const run = DEQUANTIZERS.get(type);
  const geometry = blockGeometry(type);
  const name = typeName(type);
  if (!run || !geometry) {
    const supported = DEQUANT_TYPES.map(typeName).join(", ");
    throw new TypeError(
      `Cannot dequantize ${name}: no dequantizer for this type; supported: ${supported}`,
    );
  }
  const { blockSize, typeSize } = geometry;
  if (!Number.isSafeInteger(n) || n < 0 || n % blockSize !== 0) {
    throw new RangeError(
      `Cannot dequantize ${n} ${name} values: not a whole number of ${blockSize}-value blocks`,
    );
  }
  const nb = n / blockSize;
  const need = nb * typeSize;
  if (bytes.length < need) {
    throw new RangeError(
      `Cannot dequantize ${n} ${name} values: they need ${need} bytes, got ${bytes.length}`,
    );
  }
  if (out && out.length < n) {
    throw new RangeError(
      `Cannot dequantize ${n} ${name} values into an output of ${out.length}; pass at least ${n}`,
    );
  }
  const y = out ? (out.length === n ? out : out.subarray(0, n)) : new Float32Array(n);
  run(bytes, nb, y);
  return y;
}
