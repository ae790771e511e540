// Picks the next token from the last stage's top-k candidates: greedy, or temperature + top-k +
// top-p + min-p from a per-request SplitMix64 stream. Runs on the head, after the ids come off the
// wire.

import type { TopEntry } from "../../engine/stage.ts";

/** SplitMix64: a tiny, well-mixed 64-bit generator; the same seed replays the same stream. */
export class SplitMix64 {
  #state: bigint;
  constructor(seed: bigint) {
    this.#state = BigInt.asUintN(64, seed);
  }
  /** The next 64-bit output. */
  nextU64(): bigint {
    this.#state = BigInt.asUintN(64, this.#state + 0x9e3779b97f4a7c15n);
    let z = this.#state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    return z ^ (z >> 31n);
  }
  /** A uniform double in [0, 1) from the top 53 bits. */
  nextFloat(): number {
    return Number(this.nextU64() >> 11n) / 2 ** 53;
  }
}

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

/**
 * What a sampled token is drawn from: the candidates left after the cuts and their weights
 * (exp((logit − best) / temperature), the best one's exactly 1), or undefined where the pick is
 * the greedy id (temperature 0, no candidates, or every candidate banned). The cuts run in
 * llama.cpp's order (top-k, top-p, min-p), on probabilities at the temperature; `candidates`
 * are sorted by logit, descending.
 */
export function samplingDistribution(
  candidates: readonly TopEntry[],
  params: SamplingParams,
): { readonly ids: readonly number[]; readonly weights: readonly number[] } | undefined {
  if (params.temperature <= 0 || candidates.length === 0) return undefined;
  const k = params.topK > 0 ? Math.min(params.topK, candidates.length) : candidates.length;
  const kept = candidates.slice(0, k);
  const maxLogit = kept[0].logit;
  if (maxLogit === -Infinity) return undefined;
  const weights = kept.map((c) => Math.exp((c.logit - maxLogit) / params.temperature));
  const total = weights.reduce((a, b) => a + b, 0);
  const keep = Math.min(Math.max(1, params.minKeep ?? 1), kept.length);
  let n = 0;
  let mass = 0;
  while (n < kept.length) {
    mass += weights[n] / total;
    n += 1;
    if (mass >= params.topP && n >= keep) break;
  }
  const floor = params.minP ?? 0;
  while (n > keep && weights[n - 1] < floor) n--;
  return { ids: kept.slice(0, n).map((c) => c.id), weights: weights.slice(0, n) };
}

/** Draws an index with probability weights[i] / Σ weights, leaving out index `skip`. */
function draw(weights: readonly number[], rng: SplitMix64, skip = -1): number {
  const total = weights.reduce((a, w, i) => i === skip ? a : a + w, 0);
  let r = rng.nextFloat() * total;
  let last = -1;
  for (let i = 0; i < weights.length; i++) {
    if (i === skip) continue;
    last = i;
    r -= weights[i];
    if (r < 0) return i;
  }
  return last;
}

/**
 * Returns the sampled id. `greedyId` is the last stage's argmax (returned as is when temperature
 * is 0, so sampled and greedy paths agree on ties); `candidates` are sorted by logit, descending.
 */
export function sampleToken(
  greedyId: number,
  candidates: readonly TopEntry[],
  params: SamplingParams,
  rng: SplitMix64,
): number {
  const dist = samplingDistribution(candidates, params);
  return dist ? dist.ids[draw(dist.weights, rng)] : greedyId;
}

/**
 * Speculative sampling of one position whose drafted token is `draft` (drafted for sure: the
 * drafter's distribution is all on it): the draft is kept with the probability p(draft) the
 * sampler gives it; otherwise the token is drawn from p without the draft, renormalised. The
 * token so chosen has exactly the sampler's distribution p (the standard accept/reject rule with a
 * one-hot draft distribution), though from other draws of `rng` than sampleToken's. Greedy
 * (no distribution): the greedy id, kept when it is the draft.
 */
export function speculativeToken(
  draft: number,
  greedyId: number,
  candidates: readonly TopEntry[],
  params: SamplingParams,
  rng: SplitMix64,
): { readonly id: number; readonly kept: boolean } {
  const dist = samplingDistribution(candidates, params);
  if (!dist) return { id: greedyId, kept: greedyId === draft };
  const at = dist.ids.indexOf(draft);
  const total = dist.weights.reduce((a, b) => a + b, 0);
  // A draft alone in the nucleus has weight `total`, and nextFloat() < 1: it is always kept, so a
  // refused draft leaves at least one other candidate to draw.
  if (at >= 0 && rng.nextFloat() * total < dist.weights[at]) return { id: draft, kept: true };
  return { id: dist.ids[draw(dist.weights, rng, at)], kept: false };
}
