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
 * Returns the sampled id. `greedyId` is the last stage's argmax (returned as is when temperature
 * is 0, so sampled and greedy paths agree on ties); `candidates` are sorted by logit, descending.
 * The cuts run in llama.cpp's order (top-k, top-p, min-p), on probabilities at the temperature.
 */
export function sampleToken(
  greedyId: number,
  candidates: readonly TopEntry[],
  params: SamplingParams,
  rng: SplitMix64,
): number {
  if (params.temperature <= 0 || candidates.length === 0) return greedyId;
  const k = params.topK > 0 ? Math.min(params.topK, candidates.length) : candidates.length;
  const kept = candidates.slice(0, k);
  const maxLogit = kept[0].logit;
  // Every candidate banned (logit -inf): the stage's argmax is all there is.
  if (maxLogit === -Infinity) return greedyId;
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
  // weights[0] is the best candidate's, exactly 1.
  const floor = params.minP ?? 0;
  while (n > keep && weights[n - 1] < floor) n--;
  const nucleus = weights.slice(0, n);
  const nucleusTotal = nucleus.reduce((a, b) => a + b, 0);
  let r = rng.nextFloat() * nucleusTotal;
  for (let i = 0; i < n; i++) {
    r -= nucleus[i];
    if (r < 0) return kept[i].id;
  }
  return kept[n - 1].id;
}
