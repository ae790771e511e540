// Random valid blocks of every dequantizable type with a requested spread. The benchmark-model
// generator writes tens of GB through it, so payload bytes come from a fast PRNG and only the
// scale fields are then set, chosen so the dequantized values have about the requested std.

import { blockGeometry, GgmlType, rowBytes, typeName } from "../../engine/quant/ggml_types.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "../../engine/quant/f16.ts";
import { KVALUES_IQ4NL, packScaleMinK4 } from "../../engine/quant/blocks.ts";

/** Sets the scale fields of `nb` random blocks (4-byte aligned) so values have std `std`. */
type Patch = (bytes: Uint8Array, nb: number, std: number) => void;

/** Mean of k² over the integers lo..hi: the mean square of a uniformly random signed level. */
function meanSquare(lo: number, hi: number): number {
  let s = 0;
  for (let k = lo; k <= hi; k++) s += k * k;
  return s / (hi - lo + 1);
}

/** Variance of a uniform pick among `levels` consecutive integers (the min field cancels the mean). */
function centredMeanSquare(levels: number): number {
  return (levels * levels - 1) / 12;
}

const KV_MEAN_SQUARE = KVALUES_IQ4NL.reduce((s, k) => s + k * k, 0) / 16;

/** xoshiro128** state, seeded from the caller's rng so equal rngs give equal bytes. */
function seedState(rng: () => number): Int32Array {
  const s = Int32Array.from({ length: 4 }, () => Math.floor(rng() * 2 ** 32) | 0);
  if ((s[0] | s[1] | s[2] | s[3]) === 0) s[0] = 1;
  return s;
}

/** Fills `words` with xoshiro128** output: several GB/s, where one rng() call per byte is not. */
function fillRandom(words: Uint32Array, s: Int32Array): void {
  let a = s[0], b = s[1], c = s[2], d = s[3];
  for (let i = 0; i < words.length; i++) {
    const b5 = Math.imul(b, 5);
    words[i] = Math.imul((b5 << 7) | (b5 >>> 25), 9);
    const t = b << 9;
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = (d << 11) | (d >>> 21);
  }
  s.set([a, b, c, d]);
}

/** f16 bits of a block scale `d`; throws when `std` cannot be reached with a finite, nonzero f16. */
function scaleBits(type: GgmlType, d: number, std: number): number {
  const bits = f32ToF16(d);
  const v = f16ToF32(bits);
  if (!Number.isFinite(v) || (v === 0 && std > 0)) {
    const name = typeName(type);
    throw new RangeError(
      `Cannot make random ${name} blocks with std ${std}: the block scale ${d} is not a finite ` +
        `nonzero f16; use a std nearer 1`,
    );
  }
  return bits;
}

/** Writes the f16 `bits` at byte `off` of each of `nb` blocks of `size` bytes. */
function setF16(bytes: Uint8Array, nb: number, size: number, off: number, bits: number): void {
  for (let o = off; o < nb * size; o += size) {
    bytes[o] = bits & 0xff;
    bytes[o + 1] = bits >> 8;
  }
}

/**
 * A type whose payload is uniformly random and whose only scale is one f16 `d` per block. The
 * sign of d comes from a random bit of the byte it overwrites: the levels of Q4_0, Q5_0, IQ4_NL
 * and Q3_K are not symmetric about 0 (e.g. −8..7), so a fixed sign would bias every block's mean.
 */
function scaleOnly(type: GgmlType, size: number, dAt: number, meanSq: number): Patch {
  return (bytes, nb, std) => {
    const bits = scaleBits(type, std / Math.sqrt(meanSq), std);
    for (let o = dAt; o < nb * size; o += size) {
      const signed = bits | ((bytes[o] & 1) << 15);
      bytes[o] = signed & 0xff;
      bytes[o + 1] = signed >> 8;
    }
  };
}

/** Q4_1/Q5_1: the f16 min is −(levels−1)/2·d, centring the uniform levels on 0. */
function withMin(type: GgmlType, size: number, levels: number): Patch {
  return (bytes, nb, std) => {
    const d = std / Math.sqrt(centredMeanSquare(levels));
    setF16(bytes, nb, size, 0, scaleBits(type, d, std));
    setF16(bytes, nb, size, 2, scaleBits(type, (-(levels - 1) / 2) * f16ToF32(f32ToF16(d)), std));
  };
}

/** Q2_K scale byte for a random byte r: scale s = 1..8, min round(1.5·s); with dmin = d the min
 * centres the 2-bit levels (mean 1.5). */
const Q2_K_SCALE_BYTE = Uint8Array.from({ length: 256 }, (_, r) => {
  const s = 1 + (r & 7);
  return s | (Math.round(1.5 * s) << 4);
});

function patchQ2_K(bytes: Uint8Array, nb: number, std: number): void {
  const bits = scaleBits(
    GgmlType.Q2_K,
    std / Math.sqrt(meanSquare(1, 8) * centredMeanSquare(4)),
    std,
  );
  for (let o = 0; o < nb * 84; o += 84) {
    for (let j = 0; j < 16; j++) bytes[o + j] = Q2_K_SCALE_BYTE[bytes[o + j]];
  }
  setF16(bytes, nb, 84, 80, bits);
  setF16(bytes, nb, 84, 82, bits);
}

/** Q4_K/Q5_K: 6-bit scales s = 32..63 from the random scale bytes, mins round(s·c/k) with
 * dmin = k·d so each sub-block is centred (c = the mean level, k = 8 or 16 keeps mins ≤ 63). */
function patchQ45_K(type: GgmlType, levels: number): Patch {
  const size = levels === 16 ? 144 : 176;
  const k = levels / 2;
  const meanLevel = (levels - 1) / 2;
  return (bytes, nb, std) => {
    const d = std / Math.sqrt(meanSquare(32, 63) * centredMeanSquare(levels));
    const dBits = scaleBits(type, d, std);
    setF16(bytes, nb, size, 0, dBits);
    setF16(bytes, nb, size, 2, scaleBits(type, k * f16ToF32(dBits), std));
    const sc = new Uint8Array(8);
    const m = new Uint8Array(8);
    for (let o = 4; o < nb * size; o += size) {
      for (let j = 0; j < 8; j++) {
        sc[j] = 32 | (bytes[o + j] & 31);
        m[j] = Math.round((sc[j] * meanLevel) / k);
      }
      packScaleMinK4(bytes, o, sc, m);
    }
  };
}

function patchF32(bytes: Uint8Array, nb: number, std: number): void {
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, nb);
  const values = new Float32Array(bytes.buffer, bytes.byteOffset, nb);
  const a = std * Math.sqrt(3); // uniform on [−a, a) has std a/√3
  for (let i = 0; i < nb; i++) values[i] = (words[i] * 2 ** -31 - 1) * a;
}

/** F16/BF16: each random u16 indexes a table of 65536 evenly spaced values on [−a, a). */
function halfTable(
  type: GgmlType,
  toBits: (x: number) => number,
  toValue: (b: number) => number,
): Patch {
  return (bytes, nb, std) => {
    const a = std * Math.sqrt(3);
    const table = Uint16Array.from(
      { length: 65536 },
      (_, i) => toBits(((i + 0.5) / 32768 - 1) * a),
    );
    if (!Number.isFinite(toValue(table[0])) || !Number.isFinite(toValue(table[65535]))) {
      throw new RangeError(
        `Cannot make random ${typeName(type)} values with std ${std}: out of range`,
      );
    }
    const h = new Uint16Array(bytes.buffer, bytes.byteOffset, nb);
    for (let i = 0; i < nb; i++) h[i] = table[h[i]];
  };
}

const PATCHES: ReadonlyMap<GgmlType, Patch> = new Map<GgmlType, Patch>([
  [GgmlType.F32, patchF32],
  [GgmlType.F16, halfTable(GgmlType.F16, f32ToF16, f16ToF32)],
  [GgmlType.BF16, halfTable(GgmlType.BF16, f32ToBf16, bf16ToF32)],
  [GgmlType.Q4_0, scaleOnly(GgmlType.Q4_0, 18, 0, meanSquare(-8, 7))],
  [GgmlType.Q4_1, withMin(GgmlType.Q4_1, 20, 16)],
  [GgmlType.Q5_0, scaleOnly(GgmlType.Q5_0, 22, 0, meanSquare(-16, 15))],
  [GgmlType.Q5_1, withMin(GgmlType.Q5_1, 24, 32)],
  [GgmlType.Q8_0, scaleOnly(GgmlType.Q8_0, 34, 0, meanSquare(-128, 127))],
  [GgmlType.IQ4_NL, scaleOnly(GgmlType.IQ4_NL, 18, 0, KV_MEAN_SQUARE)],
  [GgmlType.Q2_K, patchQ2_K],
  [GgmlType.Q3_K, scaleOnly(GgmlType.Q3_K, 110, 108, meanSquare(-32, 31) * meanSquare(-4, 3))],
  [GgmlType.Q4_K, patchQ45_K(GgmlType.Q4_K, 16)],
  [GgmlType.Q5_K, patchQ45_K(GgmlType.Q5_K, 32)],
  [GgmlType.Q6_K, scaleOnly(GgmlType.Q6_K, 210, 208, meanSquare(-128, 127) * meanSquare(-32, 31))],
  [GgmlType.IQ4_XS, scaleOnly(GgmlType.IQ4_XS, 136, 0, meanSquare(-32, 31) * KV_MEAN_SQUARE)],
]);

/**
 * Fills `out` (or a new array) with valid random blocks of `type` holding `nElements` values whose
 * dequantized std is about `std` (within a few percent; the quant payload is uniform random, the
 * scales are set from the layout's level statistics). `rng` returns uniforms in [0, 1) and only
 * seeds a fast generator, so the same rng sequence gives the same bytes. F32/F16/BF16 values are
 * uniform on ±std·√3.
 */
export function randomBlocks(
  type: GgmlType,
  nElements: number,
  std: number,
  rng: () => number,
  out?: Uint8Array,
): Uint8Array {
  const patch = PATCHES.get(type);
  const blockSize = blockGeometry(type)?.blockSize;
  if (!patch || !blockSize) {
    throw new TypeError(
      `Cannot make random ${typeName(type)} blocks: the type is not dequantizable; supported: ${
        [...PATCHES.keys()].map(typeName).join(", ")
      }`,
    );
  }
  if (!Number.isFinite(std) || std < 0) {
    throw new RangeError(
      `Cannot make random ${typeName(type)} blocks with std ${std}: need a finite std ≥ 0`,
    );
  }
  const size = rowBytes(type, nElements);
  if (out && out.length < size) {
    const what = `${nElements} random ${typeName(type)} values (${size} bytes)`;
    throw new RangeError(`Cannot write ${what} into ${out.length} bytes`);
  }
  const dst = out ? (out.length === size ? out : out.subarray(0, size)) : new Uint8Array(size);
  // The typed views below need 4-byte alignment; a misaligned `out` gets a copy at the end.
  const work = dst.byteOffset % 4 === 0 ? dst : new Uint8Array(size);
  const state = seedState(rng);
  // Plain arithmetic, not bit operations, on sizes: one call may write more than 2^31 bytes.
  const whole = size - (size % 4);
  fillRandom(new Uint32Array(work.buffer, work.byteOffset, whole / 4), state);
  if (whole < size) {
    const tail = new Uint32Array(1);
    fillRandom(tail, state);
    for (let i = whole; i < size; i++) work[i] = (tail[0] >>> (8 * (i - whole))) & 0xff;
  }
  patch(work, nElements / blockSize, std);
  if (work !== dst) dst.set(work);
  return dst;
}
