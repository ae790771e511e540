// Partial rotary position embedding exactly as ggml builds its angles: NEOX and IMROPE.
// Applied to q and k of full-attention blocks by engine/reference/reference_forward.ts; the GPU rope kernel's oracle.

import type { Vec } from "./math.ts";

/** cos and sin of each rotated pair i < nRot/2, as the f32 values ggml's rope cache holds. */
export interface RopeAngles {
  readonly cos: Float64Array;
  readonly sin: Float64Array;
}

export interface RopeNeoxOptions {
  /** Values per head; x holds whole heads. */
  readonly headDim: number;
  /** Rotated dimensions at the start of each head (the rest is copied). */
  readonly nRot: number;
  readonly base: number;
  readonly pos: number;
}

export interface RopeImropeOptions {
  readonly headDim: number;
  readonly nRot: number;
  readonly base: number;
  /** Position streams [t, h, w, e]; a text token at p uses [p, p, p, 0]. */
  readonly positions: readonly [number, number, number, number];
  /** rope.dimension_sections, e.g. [11, 11, 10, 0]. */
  readonly sections: readonly number[];
}

/** theta_scale = powf(base, −2/nRot), in f32 as ggml computes it. */
export function ropeThetaScale(base: number, nRot: number): number {
  return Math.fround(Math.pow(Math.fround(base), Math.fround(-2 / nRot)));
}

/**
 * NEOX angles for position `pos`: θ₀ = (float)pos and θᵢ₊₁ = θᵢ·theta_scale, each product rounded
 * to f32 (docs/model_arch.md §4.5.1) — not pos·base^(−2i/n), which differs in the last bits.
 */
export function ropeAnglesNeox(pos: number, nRot: number, base: number): RopeAngles {
  const half = nRot / 2;
  const scale = ropeThetaScale(base, nRot);
  const cos = new Float64Array(half);
  const sin = new Float64Array(half);
  let theta = Math.fround(pos);
  for (let i = 0; i < half; i++) {
    cos[i] = Math.fround(Math.cos(theta));
    sin[i] = Math.fround(Math.sin(theta));
    theta = Math.fround(theta * scale);
  }
  return { cos, sin };
}

/**
 * IMROPE angles (`ggml_mrope_cache_init` with is_imrope): four θ chains, one per position
 * stream, all advanced every pair; pair i takes its angle from stream h, w, t or e by
 * sector = i mod Σsections. For text positions [p, p, p, 0] this equals NEOX at p.
 */
export function ropeAnglesImrope(
  positions: readonly [number, number, number, number],
  sections: readonly number[],
  nRot: number,
  base: number,
): RopeAngles {
  const [s0, s1, s2, s3] = [0, 1, 2, 3].map((i) => sections[i] ?? 0);
  const sectDims = s0 + s1 + s2 + s3;
  if (!(sectDims > 0)) {
    throw new RangeError(
      `Cannot build IMROPE angles: sections [${sections.join(", ")}] must have a positive sum`,
    );
  }
  const half = nRot / 2;
  const scale = ropeThetaScale(base, nRot);
  const cos = new Float64Array(half);
  const sin = new Float64Array(half);
  let [t, h, w, e] = positions.map(Math.fround);
  for (let i = 0; i < half; i++) {
    const sector = i % sectDims;
    let theta = e;
    if (sector % 3 === 1 && sector < 3 * s1) theta = h;
    else if (sector % 3 === 2 && sector < 3 * s2) theta = w;
    else if (sector % 3 === 0 && sector < 3 * s0) theta = t;
    cos[i] = Math.fround(Math.cos(theta));
    sin[i] = Math.fround(Math.sin(theta));
    t = Math.fround(t * scale);
    h = Math.fround(h * scale);
    w = Math.fround(w * scale);
    e = Math.fround(e * scale);
  }
  return { cos, sin };
}

/**
 * Rotates the first 2·angles.cos.length dims of every head of `headDim` values, NEOX pairing:
 * (v[i], v[i + nRot/2]) for i < nRot/2. Dims past nRot are copied unchanged.
 */
export function applyRope(x: Vec, headDim: number, angles: RopeAngles): Float64Array {
  const half = angles.cos.length;
  if (headDim <= 0 || x.length % headDim !== 0 || 2 * half > headDim) {
    throw new RangeError(
      `Cannot rotate ${x.length} values as heads of ${headDim} with ${2 * half} rotated dims`,
    );
  }
  const y = Float64Array.from(x);
  for (let off = 0; off < x.length; off += headDim) {
    for (let i = 0; i < half; i++) {
      const x0 = x[off + i];
      const x1 = x[off + i + half];
      const c = angles.cos[i];
      const s = angles.sin[i];
      y[off + i] = x0 * c - x1 * s;
      y[off + i + half] = x0 * s + x1 * c;
    }
  }
  return y;
}

/** NEOX RoPE (qwen3next). */
export function ropeNeox(x: Vec, options: RopeNeoxOptions): Float64Array {
  const { headDim, nRot, base, pos } = options;
  return applyRope(x, headDim, ropeAnglesNeox(pos, nRot, base));
}

/** IMROPE (qwen35, qwen35moe). */
export function ropeImrope(x: Vec, options: RopeImropeOptions): Float64Array {
  const { headDim, nRot, base, positions, sections } = options;
  return applyRope(x, headDim, ropeAnglesImrope(positions, sections, nRot, base));
}
