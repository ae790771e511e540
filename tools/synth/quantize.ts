// Reference quantizers: f32 values → GGUF blocks of every dequantizable type, for fixture models
// and kernel tests. Close to llama.cpp's quality (not its bytes); engine/quant/dequant.ts reads them.

import { blockGeometry, GgmlType, typeName } from "../../engine/quant/ggml_types.ts";
import { f32ToBf16, f32ToF16 } from "../../engine/quant/f16.ts";
import { packScaleMinK4, writeF16 } from "../../engine/quant/blocks.ts";
import { fitAffine, fitIq4, fitSymmetric, nearestIq4, signedMax } from "./quant_fit.ts";

export { randomBlocks } from "./random_blocks.ts";

/** Quantizes `nb` blocks of `x` into the zero-filled, 4-byte-aligned `out`. */
type BlockQuantizer = (x: Float32Array, nb: number, out: Uint8Array) => void;

function clamp(v: number, lo: number, hi: number): number {
  return v < lo ? lo : v > hi ? hi : v;
}

/** Level for x at step `d` (0 when d is 0): the nearest of [lo, hi]. */
function level(x: number, d: number, lo: number, hi: number): number {
  return d === 0 ? clamp(0, lo, hi) : clamp(Math.round(x / d), lo, hi);
}

function quantF32(x: Float32Array, nb: number, out: Uint8Array): void {
  new Float32Array(out.buffer, out.byteOffset, nb).set(x.subarray(0, nb));
}

function quantF16(x: Float32Array, nb: number, out: Uint8Array): void {
  const h = new Uint16Array(out.buffer, out.byteOffset, nb);
  for (let i = 0; i < nb; i++) h[i] = f32ToF16(x[i]);
}

function quantBf16(x: Float32Array, nb: number, out: Uint8Array): void {
  const h = new Uint16Array(out.buffer, out.byteOffset, nb);
  for (let i = 0; i < nb; i++) h[i] = f32ToBf16(x[i]);
}

function quantQ8_0(x: Float32Array, nb: number, out: Uint8Array): void {
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 34, xo += 32) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[xo + j]));
    const d = writeF16(out, o, amax / 127);
    for (let j = 0; j < 32; j++) out[o + 2 + j] = level(x[xo + j], d, -128, 127) & 0xff;
  }
}

function quantQ4_0(x: Float32Array, nb: number, out: Uint8Array): void {
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 18, xo += 32) {
    const d = writeF16(out, o, fitSymmetric(x, xo, 32, 8));
    for (let j = 0; j < 16; j++) {
      out[o + 2 + j] = (level(x[xo + j], d, -8, 7) + 8) |
        ((level(x[xo + j + 16], d, -8, 7) + 8) << 4);
    }
  }
}

function quantQ4_1(x: Float32Array, nb: number, out: Uint8Array): void {
  const fit = new Float64Array(2);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 20, xo += 32) {
    fitAffine(x, xo, 32, 15, false, fit);
    const d = writeF16(out, o, fit[0]);
    const m = writeF16(out, o + 2, fit[1]);
    for (let j = 0; j < 16; j++) {
      out[o + 4 + j] = level(x[xo + j] - m, d, 0, 15) | (level(x[xo + j + 16] - m, d, 0, 15) << 4);
    }
  }
}

/** Q5_0 (levels −16..15) and Q5_1 (0..31 plus an f16 min); bit j of qh is element j's fifth bit. */
function quantQ5(x: Float32Array, nb: number, out: Uint8Array, hasMin: boolean): void {
  const fit = new Float64Array(2);
  const size = hasMin ? 24 : 22;
  const qhAt = hasMin ? 4 : 2;
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += size, xo += 32) {
    let d: number;
    let m = 0;
    if (hasMin) {
      fitAffine(x, xo, 32, 31, false, fit);
      d = writeF16(out, o, fit[0]);
      m = writeF16(out, o + 2, fit[1]);
    } else {
      d = writeF16(out, o, fitSymmetric(x, xo, 32, 16));
    }
    const lo = hasMin ? 0 : -16;
    let qh = 0;
    for (let j = 0; j < 32; j++) {
      const q = level(x[xo + j] - m, d, lo, lo + 31) - lo;
      qh |= (q >> 4) << j;
      out[o + qhAt + 4 + (j & 15)] |= (q & 15) << (j < 16 ? 0 : 4);
    }
    for (let k = 0; k < 4; k++) out[o + qhAt + k] = (qh >>> (8 * k)) & 0xff;
  }
}

function quantIq4Nl(x: Float32Array, nb: number, out: Uint8Array): void {
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 18, xo += 32) {
    const d = writeF16(out, o, fitIq4(x, xo, 32));
    const id = d === 0 ? 0 : 1 / d;
    for (let j = 0; j < 16; j++) {
      out[o + 2 + j] = nearestIq4(x[xo + j] * id) | (nearestIq4(x[xo + j + 16] * id) << 4);
    }
  }
}

// The K-quants and IQ4_XS share one plan: fit each sub-block, quantize the sub-block scales (and
// mins) to integer steps of the block's f16 d (and dmin), then requantize every value against the
// scale it will actually be decoded with, so the f16 and 6-bit roundings cost as little as possible.

/** steps[j] = round(v[j] / d) clamped to [lo, hi]; all 0 when d is 0. */
function toSteps(v: Float64Array, d: number, lo: number, hi: number, steps: Int32Array): void {
  for (let j = 0; j < v.length; j++) steps[j] = level(v[j], d, lo, hi);
}

/** Affine fits of the 256/sub sub-blocks: scales[j] ≥ 0 and mins[j] ≥ 0 (subtracted). */
function affineSubBlocks(
  x: Float32Array,
  xo: number,
  sub: number,
  nmax: number,
  scales: Float64Array,
  mins: Float64Array,
): void {
  const fit = new Float64Array(2);
  for (let j = 0; j < scales.length; j++) {
    fitAffine(x, xo + sub * j, sub, nmax, true, fit);
    scales[j] = fit[0];
    mins[j] = -fit[1];
  }
}

/** Levels L[i] ∈ [0, nmax] of one 256-value block against the decoded d·sc and dmin·m. */
function affineLevels(
  x: Float32Array,
  xo: number,
  sub: number,
  nmax: number,
  d: number,
  dmin: number,
  sc: Int32Array,
  m: Int32Array,
  L: Uint8Array,
): void {
  for (let j = 0; j < sc.length; j++) {
    const ds = Math.fround(d * sc[j]);
    const dm = Math.fround(dmin * m[j]);
    for (let i = sub * j; i < sub * (j + 1); i++) L[i] = level(x[xo + i] + dm, ds, 0, nmax);
  }
}

/** Levels L[i] ∈ [0, 2·nmax) (stored with offset nmax) of one block against d·sc. */
function signedLevels(
  x: Float32Array,
  xo: number,
  sub: number,
  nmax: number,
  d: number,
  sc: Int32Array,
  L: Uint8Array,
): void {
  for (let j = 0; j < sc.length; j++) {
    const ds = Math.fround(d * sc[j]);
    for (let i = sub * j; i < sub * (j + 1); i++) {
      L[i] = level(x[xo + i], ds, -nmax, nmax - 1) + nmax;
    }
  }
}

// Q2_K, 84 bytes: scales[16] (scale | min << 4) | qs[64] | d | dmin. Value 128n + 32j + w is
// bits 2j of qs[32n + w].
function quantQ2_K(x: Float32Array, nb: number, out: Uint8Array): void {
  const scales = new Float64Array(16);
  const mins = new Float64Array(16);
  const sc = new Int32Array(16);
  const m = new Int32Array(16);
  const L = new Uint8Array(256);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 84, xo += 256) {
    affineSubBlocks(x, xo, 16, 3, scales, mins);
    const d = writeF16(out, o + 80, signedMax(scales) / 15);
    const dmin = writeF16(out, o + 82, signedMax(mins) / 15);
    toSteps(scales, d, 0, 15, sc);
    toSteps(mins, dmin, 0, 15, m);
    for (let j = 0; j < 16; j++) out[o + j] = sc[j] | (m[j] << 4);
    affineLevels(x, xo, 16, 3, d, dmin, sc, m, L);
    for (let n = 0; n < 2; n++) {
      for (let w = 0; w < 32; w++) {
        const e = 128 * n + w;
        out[o + 16 + 32 * n + w] = L[e] | (L[e + 32] << 2) | (L[e + 64] << 4) | (L[e + 96] << 6);
      }
    }
  }
}

// Q3_K, 110 bytes: hmask[32] | qs[64] | scales[12] | d. Value 128n + 32j + w: low 2 bits are bits
// 2j of qs[32n + w], the third bit is bit 4n + j of hmask[w].
function quantQ3_K(x: Float32Array, nb: number, out: Uint8Array): void {
  const scales = new Float64Array(16);
  const sc = new Int32Array(16);
  const L = new Uint8Array(256);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 110, xo += 256) {
    for (let j = 0; j < 16; j++) scales[j] = fitSymmetric(x, xo + 16 * j, 16, 4);
    const d = writeF16(out, o + 108, signedMax(scales) / -32);
    toSteps(scales, d, -32, 31, sc);
    for (let j = 0; j < 16; j++) {
      const s = sc[j] + 32;
      out[o + 96 + (j & 7)] |= (s & 15) << (j < 8 ? 0 : 4);
      out[o + 104 + (j & 3)] |= (s >> 4) << (2 * (j >> 2));
    }
    signedLevels(x, xo, 16, 4, d, sc, L);
    for (let e = 0; e < 256; e++) {
      const n = e >> 7;
      const j = (e >> 5) & 3;
      const w = e & 31;
      out[o + 32 + 32 * n + w] |= (L[e] & 3) << (2 * j);
      out[o + w] |= (L[e] >> 2) << (4 * n + j);
    }
  }
}

/** Q4_K (144 bytes) and Q5_K (176): d | dmin | scales[12] | (qh[32]) | qs[128]. */
function quantQ45_K(x: Float32Array, nb: number, out: Uint8Array, fiveBit: boolean): void {
  const nmax = fiveBit ? 31 : 15;
  const size = fiveBit ? 176 : 144;
  const qs = fiveBit ? 48 : 16;
  const scales = new Float64Array(8);
  const mins = new Float64Array(8);
  const sc = new Int32Array(8);
  const m = new Int32Array(8);
  const L = new Uint8Array(256);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += size, xo += 256) {
    affineSubBlocks(x, xo, 32, nmax, scales, mins);
    const d = writeF16(out, o, signedMax(scales) / 63);
    const dmin = writeF16(out, o + 2, signedMax(mins) / 63);
    toSteps(scales, d, 0, 63, sc);
    toSteps(mins, dmin, 0, 63, m);
    packScaleMinK4(out, o + 4, Uint8Array.from(sc), Uint8Array.from(m));
    affineLevels(x, xo, 32, nmax, d, dmin, sc, m, L);
    // Value 64c + 32h + l: nibble h of qs[32c + l]; Q5_K's fifth bit is bit 2c + h of qh[l].
    for (let e = 0; e < 256; e++) {
      const c = e >> 6;
      const h = (e >> 5) & 1;
      const l = e & 31;
      out[o + qs + 32 * c + l] |= (L[e] & 15) << (4 * h);
      if (fiveBit) out[o + 16 + l] |= (L[e] >> 4) << (2 * c + h);
    }
  }
}

// Q6_K, 210 bytes: ql[128] | qh[64] | scales[16] int8 | d. Value 128n + 32k + l (k = 0..3):
// low nibble k>>1 of ql[64n + 32(k&1) + l], top 2 bits at bits 2k of qh[32n + l].
function quantQ6_K(x: Float32Array, nb: number, out: Uint8Array): void {
  const scales = new Float64Array(16);
  const sc = new Int32Array(16);
  const L = new Uint8Array(256);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 210, xo += 256) {
    for (let j = 0; j < 16; j++) scales[j] = fitSymmetric(x, xo + 16 * j, 16, 32);
    const d = writeF16(out, o + 208, signedMax(scales) / -128);
    toSteps(scales, d, -128, 127, sc);
    for (let j = 0; j < 16; j++) out[o + 192 + j] = sc[j] & 0xff;
    signedLevels(x, xo, 16, 32, d, sc, L);
    for (let e = 0; e < 256; e++) {
      const n = e >> 7;
      const k = (e >> 5) & 3;
      const l = e & 31;
      out[o + 64 * n + 32 * (k & 1) + l] |= (L[e] & 15) << (4 * (k >> 1));
      out[o + 128 + 32 * n + l] |= (L[e] >> 4) << (2 * k);
    }
  }
}

// IQ4_XS, 136 bytes: d | scales_h u16 | scales_l[4] | qs[128]; sub-block scales are 6-bit steps of
// d stored with offset 32 (low nibble in scales_l, top 2 bits in scales_h).
function quantIq4Xs(x: Float32Array, nb: number, out: Uint8Array): void {
  const scales = new Float64Array(8);
  const sc = new Int32Array(8);
  for (let i = 0, o = 0, xo = 0; i < nb; i++, o += 136, xo += 256) {
    for (let ib = 0; ib < 8; ib++) scales[ib] = fitIq4(x, xo + 32 * ib, 32);
    const d = writeF16(out, o, signedMax(scales) / -32);
    toSteps(scales, d, -32, 31, sc);
    let sh = 0;
    for (let ib = 0; ib < 8; ib++) {
      const ls = sc[ib] + 32;
      out[o + 4 + (ib >> 1)] |= (ls & 15) << (4 * (ib & 1));
      sh |= (ls >> 4) << (2 * ib);
      const dl = Math.fround(d * sc[ib]);
      const id = dl === 0 ? 0 : 1 / dl;
      for (let j = 0; j < 16; j++) {
        const v = xo + 32 * ib + j;
        out[o + 8 + 16 * ib + j] = nearestIq4(x[v] * id) | (nearestIq4(x[v + 16] * id) << 4);
      }
    }
    out[o + 2] = sh & 0xff;
    out[o + 3] = sh >> 8;
  }
}

const QUANTIZERS: ReadonlyMap<GgmlType, BlockQuantizer> = new Map<GgmlType, BlockQuantizer>([
  [GgmlType.F32, quantF32],
  [GgmlType.F16, quantF16],
  [GgmlType.BF16, quantBf16],
  [GgmlType.Q4_0, quantQ4_0],
  [GgmlType.Q4_1, quantQ4_1],
  [GgmlType.Q5_0, (x, nb, out) => quantQ5(x, nb, out, false)],
  [GgmlType.Q5_1, (x, nb, out) => quantQ5(x, nb, out, true)],
  [GgmlType.Q8_0, quantQ8_0],
  [GgmlType.IQ4_NL, quantIq4Nl],
  [GgmlType.Q2_K, quantQ2_K],
  [GgmlType.Q3_K, quantQ3_K],
  [GgmlType.Q4_K, (x, nb, out) => quantQ45_K(x, nb, out, false)],
  [GgmlType.Q5_K, (x, nb, out) => quantQ45_K(x, nb, out, true)],
  [GgmlType.Q6_K, quantQ6_K],
  [GgmlType.IQ4_XS, quantIq4Xs],
]);

/** The types `quantize` writes, in type-id order (the same set `dequantize` reads). */
export const QUANT_TYPES: readonly GgmlType[] = [...QUANTIZERS.keys()].sort((a, b) => a - b);

/**
 * Quantizes `values` (a whole number of blocks) into blocks of `type`. Block formats need finite
 * values; F32/F16/BF16 take anything (F16 rounds to nearest even, out-of-range to ±inf).
 */
export function quantize(type: GgmlType, values: Float32Array): Uint8Array {
  const run = QUANTIZERS.get(type);
  const geometry = blockGeometry(type);
  const name = typeName(type);
  if (!run || !geometry) {
    const supported = QUANT_TYPES.map(typeName).join(", ");
    throw new TypeError(
      `Cannot quantize to ${name}: no quantizer for this type; supported: ${supported}`,
    );
  }
  const { blockSize, typeSize } = geometry;
  if (values.length % blockSize !== 0) {
    throw new RangeError(
      `Cannot quantize ${values.length} values to ${name}: not a whole number of ${blockSize}-value blocks`,
    );
  }
  if (blockSize > 1) {
    for (let i = 0; i < values.length; i++) {
      if (!Number.isFinite(values[i])) {
        const v = values[i];
        throw new RangeError(
          `Cannot quantize to ${name}: value ${i} is ${v}; block formats need finite values`,
        );
      }
    }
  }
  const nb = values.length / blockSize;
  const out = new Uint8Array(nb * typeSize);
  run(values, nb, out);
  return out;
}
