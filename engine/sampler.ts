// The sampler's arithmetic: candidates' weights, the top-p and min-p cuts and the draw, in 32-bit
// integers, so the head (lib/sampling/sample.ts) and the GPU (wgsl/sample.wgsl) pick the same id.
//
// Floats would not agree: WGSL has no f64, its exp is not correctly rounded, and NVIDIA's compiler
// fuses multiplies into adds. Integers agree everywhere, so a whole-model stage can sample each
// step on the GPU and feed the id to the next step (Stage.decodeFused) with the bits a head that
// samples the read-back candidates would give: split == unsplit holds for sampled requests too.
// A weight is exp((logit − best) / T) within 4e-4 of itself at temperatures from 0.1 (logits in
// steps of 2^−16, its exponent in steps of 2^−12 of a power of two, two tables of 64 for the
// fraction), and the best one's a power of two.

/** What a sampled request asks for (lib/sampling/sample.ts re-exports it for the head). */
export interface SamplingParams {
  /** 0 means greedy. */
  readonly temperature: number;
  /** 0 means no top-k cut beyond the candidates given. */
  readonly topK: number;
  /** 1 means no nucleus cut. */
  readonly topP: number;
  /** Drops candidates less likely than minP times the best one; 0 (default) keeps all. */
  readonly minP?: number;
  /** The top-p and min-p cuts keep at least this many candidates (default 1). */
  readonly minKeep?: number;
}

/** round(2^15 · 2^(−j/64)): the high six bits of an exponent's fraction. */
export const EXP2_HI: readonly number[] = [
  32768,
  32415,
  32066,
  31720,
  31379,
  31041,
  30706,
  30376,
  30048,
  29725,
  29405,
  29088,
  28774,
  28464,
  28158,
  27855,
  27554,
  27258,
  26964,
  26674,
  26386,
  26102,
  25821,
  25543,
  25268,
  24995,
  24726,
  24460,
  24196,
  23936,
  23678,
  23423,
  23170,
  22921,
  22674,
  22430,
  22188,
  21949,
  21713,
  21479,
  21247,
  21019,
  20792,
  20568,
  20347,
  20127,
  19911,
  19696,
  19484,
  19274,
  19066,
  18861,
  18658,
  18457,
  18258,
  18061,
  17867,
  17674,
  17484,
  17296,
  17109,
  16925,
  16743,
  16562,
];

/** round(2^16 · 2^(−j/4096)): the low six bits. */
export const EXP2_LO: readonly number[] = [
  65536,
  65525,
  65514,
  65503,
  65492,
  65481,
  65469,
  65458,
  65447,
  65436,
  65425,
  65414,
  65403,
  65392,
  65381,
  65370,
  65359,
  65348,
  65337,
  65326,
  65315,
  65304,
  65292,
  65281,
  65270,
  65259,
  65248,
  65237,
  65226,
  65215,
  65204,
  65193,
  65182,
  65171,
  65160,
  65149,
  65138,
  65127,
  65116,
  65105,
  65094,
  65083,
  65072,
  65061,
  65050,
  65039,
  65028,
  65017,
  65006,
  64995,
  64984,
  64973,
  64962,
  64951,
  64940,
  64929,
  64918,
  64907,
  64896,
  64885,
  64874,
  64863,
  64852,
  64841,
];

/** Logits are compared in steps of 2^−LOGIT_BITS, clamped to ±2^30 of those steps. */
const LOGIT_BITS = 16;
const LOGIT_LIMIT = 2 ** 30;
/** A weight's exponent (log2 of best / weight) in steps of 2^−12; from 31 the weight is 0. */
const EXPONENT_LIMIT = 31 * 4096;

/**
 * A sampled row's constants, as the head derives them from SamplingParams and the candidates it
 * has (the GPU kernel derives k, shift and keep itself from the candidates its top-k found, from
 * the words samplerWords gives it).
 */
export interface SamplerConstants {
  /** Candidates the weights cover: the top-k cut of the candidates (≥ 1). */
  readonly k: number;
  /**
   * round(log2(e) / T · 2^20), at most 2^31: a logit gap of d steps (of 2^−16) weighs
   * 2^−t of the best, t = floor(d · scale / 2^24) in steps of 2^−12.
   */
  readonly scale: number;
  /** Gaps from here on weigh 0 (their exponent would pass EXPONENT_LIMIT). */
  readonly cap: number;
  /** The best candidate weighs 2^(31 − shift), so k weights sum below 2^30: 1 + ceil(log2 k). */
  readonly shift: number;
  /** floor(topP · 2^32) for topP < 1; 2^32 − 1 (no cut) otherwise. */
  readonly topP: number;
  /** floor(minP · 2^16), at most 2^16. */
  readonly minP: number;
  /** The cuts keep at least this many (1..k). */
  readonly keep: number;
}

/** u32 words samplerWords writes. */
export const SAMPLER_WORDS = 7;

/** Largest temperature sampled (a weight's exponent needs scale ≥ 1). */
export const MAX_TEMPERATURE = 1000;

/** 1 + ceil(log2 k) for k ≥ 1, in integers (wgsl/sample.wgsl computes it so). */
function shiftFor(k: number): number {
  return 1 + (k <= 1 ? 0 : 32 - Math.clz32(k - 1));
}

/** The constants of sampling `params` from `candidates` candidates (temperature > 0). */
export function samplerConstants(params: SamplingParams, candidates: number): SamplerConstants {
  const T = params.temperature;
  if (!(T > 0 && T <= MAX_TEMPERATURE) || !Number.isInteger(candidates) || candidates < 1) {
    throw new RangeError(
      `Cannot sample at temperature ${T} from ${candidates} candidates: expected a temperature in (0, ${MAX_TEMPERATURE}] and at least one candidate`,
    );
  }
  const k = params.topK > 0 ? Math.min(params.topK, candidates) : candidates;
  // Temperatures below ~7e-4 sample as 7e-4 does.
  const scale = Math.min(2 ** 31, Math.round(Math.LOG2E / T * 2 ** 20));
  const cap = Math.max(1, Math.ceil(EXPONENT_LIMIT * 2 ** 24 / scale));
  const topP = params.topP >= 1 ? 0xffffffff : Math.max(0, Math.floor(params.topP * 2 ** 32));
  const minP = Math.min(2 ** 16, Math.max(0, Math.floor((params.minP ?? 0) * 2 ** 16)));
  const keep = Math.min(Math.max(1, params.minKeep ?? 1), k);
  return { k, scale, cap, shift: shiftFor(k), topP, minP, keep };
}

/**
 * What wgsl/sample.wgsl reads before a step's draws: the candidates each step's top-k holds
 * (`asked`), then params' top-k (0: all), scale, cap, top-p, min-p and min_keep as
 * SamplerConstants has them.
 */
export function samplerWords(params: SamplingParams, asked: number): Uint32Array {
  const c = samplerConstants(params, asked);
  const minKeep = Math.min(Math.max(1, params.minKeep ?? 1), 2 ** 31);
  const topK = Math.min(Math.max(0, params.topK), asked);
  return Uint32Array.of(asked, topK, c.scale, c.cap, c.topP, c.minP, minKeep);
}

/** floor(a · b / 2^32) for u32 a and b, in the 16-bit pieces wgsl/sample.wgsl multiplies. */
export function mulHi(a: number, b: number): number {
  const a0 = a & 0xffff, a1 = a >>> 16, b0 = b & 0xffff, b1 = b >>> 16;
  const p01 = a0 * b1, p10 = a1 * b0;
  const mid = Math.floor(a0 * b0 / 65536) + (p01 & 0xffff) + (p10 & 0xffff);
  return a1 * b1 + Math.floor(p01 / 65536) + Math.floor(p10 / 65536) + Math.floor(mid / 65536);
}

/** A logit in steps of 2^−16, clamped to ±2^30 of them (−Infinity and NaN at the bottom). */
export function logitSteps(logit: number): number {
  if (Number.isNaN(logit)) return -LOGIT_LIMIT;
  return Math.max(-LOGIT_LIMIT, Math.min(LOGIT_LIMIT, Math.floor(logit * 2 ** LOGIT_BITS)));
}

/**
 * The weights of the first c.k candidates (descending logits), the best one's 2^(31 − shift),
 * or undefined where the best candidate's logit is at the bottom of the range (every candidate
 * banned): the pick is then the greedy id.
 */
export function candidateWeights(
  logits: readonly number[],
  c: SamplerConstants,
): number[] | undefined {
  const best = logitSteps(logits[0]);
  if (best === -LOGIT_LIMIT) return undefined;
  return logits.slice(0, c.k).map((l) => {
    const d = best - logitSteps(l);
    // A gap below 0 (unsorted candidates) weighs 0, as its u32 wrap does on the GPU.
    if (d < 0 || d >= c.cap) return 0;
    // Below the cap d · scale < 2^42: exact here, in two 32-bit halves on the GPU.
    const t = Math.floor(d * c.scale / 2 ** 24);
    if (t >= EXPONENT_LIMIT) return 0;
    const n = Math.floor(t / 4096) + c.shift;
    const f = t % 4096;
    return n >= 32 ? 0 : Math.floor(EXP2_HI[f >> 6] * EXP2_LO[f & 63] / 2 ** n);
  });
}

/**
 * How many of the weighted candidates the top-p and min-p cuts keep (llama.cpp's order: top-p
 * over the whole set, then min-p from the tail), at least c.keep.
 */
export function keptCount(weights: readonly number[], c: SamplerConstants): number {
  const total = weights.reduce((a, b) => a + b, 0);
  const threshold = c.topP === 0xffffffff ? Infinity : mulHi(c.topP, total);
  let n = 0;
  let mass = 0;
  while (n < weights.length) {
    mass += weights[n];
    n += 1;
    if (mass >= threshold && n >= c.keep) break;
  }
  const floor = (weights[0] / 65536) * c.minP;
  while (n > c.keep && weights[n - 1] < floor) n--;
  return n;
}

/**
 * The index drawn with probability weights[i] / Σ weights for a uniform u32 `u`, leaving out
 * index `skip`: the first whose running sum passes floor(u · Σ / 2^32).
 */
export function drawIndex(weights: readonly number[], u: number, skip = -1): number {
  const total = weights.reduce((a, w, i) => i === skip ? a : a + w, 0);
  const r = mulHi(u, total);
  let mass = 0;
  let last = -1;
  for (let i = 0; i < weights.length; i++) {
    if (i === skip) continue;
    last = i;
    mass += weights[i];
    if (mass > r) return i;
  }
  return last;
}
