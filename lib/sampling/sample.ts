// Picks the next token from the last stage's top-k candidates: greedy, or temperature + top-k +
// top-p + min-p from a per-request SplitMix64 stream, in engine/sampler.ts's integer arithmetic.
// Runs on the head, after the ids come off the wire (a whole-model GPU stage also runs it itself).

import {
  candidateWeights,
  drawIndex,
  keptCount,
  mulHi,
  samplerConstants,
  type SamplingParams,
} from "../../engine/sampler.ts";
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
  /** A uniform u32: the top 32 bits (what the sampler draws with). */
  nextU32(): number {
    return Number(this.nextU64() >> 32n);
  }
  /** A uniform double in [0, 1) from the top 53 bits. */
  nextFloat(): number {
    return Number(this.nextU64() >> 11n) / 2 ** 53;
  }
}

export type { SamplingParams };

/**
 * What a sampled token is drawn from: the candidates left after the cuts and their integer
 * weights (engine/sampler.ts: exp((logit − best) / temperature) in fixed point, the best one's
 * a power of two), or undefined where the pick is the greedy id (temperature 0, no candidates,
 * or every candidate banned). The cuts run in llama.cpp's order (top-k, top-p, min-p);
 * `candidates` are sorted by logit, descending. wgsl/sample.wgsl computes the same weights.
 */
export function samplingDistribution(
  candidates: readonly TopEntry[],
  params: SamplingParams,
): { readonly ids: readonly number[]; readonly weights: readonly number[] } | undefined {
  if (params.temperature <= 0 || candidates.length === 0) return undefined;
  const c = samplerConstants(params, candidates.length);
  const weights = candidateWeights(candidates.map((e) => e.logit), c);
  if (!weights) return undefined;
  const n = keptCount(weights, c);
  return { ids: candidates.slice(0, n).map((e) => e.id), weights: weights.slice(0, n) };
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
  if (params.temperature <= 0) return greedyId;
  // One draw a sampled token, even where there is no candidate to draw from: the GPU's fused
  // steps take draw s for step s whatever they find.
  const u = rng.nextU32();
  const dist = samplingDistribution(candidates, params);
  return dist ? dist.ids[drawIndex(dist.weights, u)] : greedyId;
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
  // Kept when floor(u · total / 2^32) < the draft's weight. A draft alone in the nucleus has
  // weight `total`, which that always is: a refused draft leaves another candidate to draw.
  if (at >= 0 && mulHi(rng.nextU32(), total) < dist.weights[at]) return { id: draft, kept: true };
  return { id: dist.ids[drawIndex(dist.weights, rng.nextU32(), at)], kept: false };
}
