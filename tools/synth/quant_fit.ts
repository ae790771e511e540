// Scale fitting for the reference quantizers: the least-squares scale (and min) of one group of
// values for a given set of integer levels. Used only by tools/synth/quantize.ts.

import { KVALUES_IQ4NL as KV } from "../../engine/quant/blocks.ts";

function clamp(v: number, lo: number, hi: number): number {
  return v < lo ? lo : v > hi ? hi : v;
}

/** The value of largest magnitude in x[off..off+n) (the first on ties), with its sign; 0 if none. */
export function signedMax(x: Float32Array | Float64Array, off = 0, n = x.length): number {
  let max = 0;
  for (let i = off; i < off + n; i++) {
    if (Math.abs(x[i]) > Math.abs(max)) max = x[i];
  }
  return max;
}

/**
 * Scale `s` for levels l ∈ [−nmax, nmax−1] minimising Σ(x − s·l)² over x[off..off+n). The value of
 * largest magnitude is mapped near −nmax (the side with one more level), so `s` takes the opposite
 * sign to it. Tries 19 trial scales around nmax/amax and keeps the least-squares scale of the best
 * level assignment (the idea of llama.cpp's `make_qx_quants`). 0 for an all-zero group.
 */
export function fitSymmetric(x: Float32Array, off: number, n: number, nmax: number): number {
  const max = signedMax(x, off, n);
  if (max === 0) return 0;
  let best = 0;
  let scale = 0;
  for (let k = -9; k <= 9; k++) {
    const iscale = -(nmax + 0.1 * k) / max;
    let sumlx = 0;
    let suml2 = 0;
    for (let i = off; i < off + n; i++) {
      const l = clamp(Math.round(iscale * x[i]), -nmax, nmax - 1);
      sumlx += x[i] * l;
      suml2 += l * l;
    }
    // Σx² − sumlx²/suml2 is the error at the optimal scale, so a larger sumlx²/suml2 is better.
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      best = (sumlx * sumlx) / suml2;
      scale = sumlx / suml2;
    }
  }
  return scale;
}

/**
 * Affine fit x ≈ scale·l + min with l ∈ [0, nmax] over x[off..off+n), written to res[0] (scale,
 * ≥ 0) and res[1] (min). `minAtMostZero` is for the K-quants, whose stored min is subtracted
 * (min ≤ 0). Tries 21 trial scales between (nmax−1) and (nmax+1) steps over the range and keeps
 * the least-squares (scale, min) with the lowest error (the idea of `make_qkx2_quants`).
 */
export function fitAffine(
  x: Float32Array,
  off: number,
  n: number,
  nmax: number,
  minAtMostZero: boolean,
  res: Float64Array,
): void {
  let lo = Infinity;
  let hi = -Infinity;
  let sx = 0;
  let sx2 = 0;
  for (let i = off; i < off + n; i++) {
    lo = Math.min(lo, x[i]);
    hi = Math.max(hi, x[i]);
    sx += x[i];
    sx2 += x[i] * x[i];
  }
  if (minAtMostZero && lo > 0) lo = 0;
  res[0] = hi > lo ? (hi - lo) / nmax : 0;
  res[1] = lo;
  if (hi === lo) return;
  let bestErr = Infinity;
  for (let k = 0; k <= 20; k++) {
    const iscale = (nmax - 1 + 0.1 * k) / (hi - lo);
    let sl = 0;
    let sl2 = 0;
    let sxl = 0;
    for (let i = off; i < off + n; i++) {
      const l = clamp(Math.round(iscale * (x[i] - lo)), 0, nmax);
      sl += l;
      sl2 += l * l;
      sxl += x[i] * l;
    }
    const det = n * sl2 - sl * sl;
    if (det <= 0) continue;
    let scale = (n * sxl - sx * sl) / det;
    let min = (sl2 * sx - sl * sxl) / det;
    if (minAtMostZero && min > 0) {
      min = 0;
      scale = sxl / sl2;
    }
    if (scale < 0) continue;
    // Σ(scale·l + min − x)² expanded over the sums above.
    const err = scale * scale * sl2 + 2 * scale * min * sl + n * min * min - 2 * scale * sxl -
      2 * min * sx + sx2;
    if (err < bestErr) {
      bestErr = err;
      res[0] = scale;
      res[1] = min;
    }
  }
}

/** Decision points between neighbouring IQ4 levels. */
const KV_MID: Float64Array = Float64Array.from({ length: 15 }, (_, k) => (KV[k] + KV[k + 1]) / 2);

/** Index of the IQ4 level nearest to `v` (binary search over the 15 midpoints). */
export function nearestIq4(v: number): number {
  let i = 0;
  for (let step = 8; step > 0; step >>= 1) {
    if (v > KV_MID[i + step - 1]) i += step;
  }
  return i;
}

/**
 * Scale `s` minimising Σ(x − s·KV[idx])² over x[off..off+n) for the non-uniform IQ4 levels. The
 * value of largest magnitude is tried against both ends of the table (−127 and 113), each with
 * 21 trial scales, keeping the least-squares scale of the best assignment.
 */
export function fitIq4(x: Float32Array, off: number, n: number): number {
  const max = signedMax(x, off, n);
  if (max === 0) return 0;
  let best = 0;
  let scale = 0;
  for (const end of [KV[0], KV[15]]) {
    for (let k = -10; k <= 10; k++) {
      const id = (end + 0.6 * k) / max;
      let sumqx = 0;
      let sumq2 = 0;
      for (let i = off; i < off + n; i++) {
        const q = KV[nearestIq4(id * x[i])];
        sumqx += q * x[i];
        sumq2 += q * q;
      }
      if (sumqx * sumqx > best * sumq2) {
        best = (sumqx * sumqx) / sumq2;
        scale = sumqx / sumq2;
      }
    }
  }
  return scale;
}
