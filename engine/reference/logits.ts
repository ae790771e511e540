// Greedy id, top-k and log-sum-exp of one position's logits after the run's adjustments, for the
// last reference stage (reference_stage.ts); the oracle of the GPU's argmax, logit_adjust and topk.

import { biasLogit, type LogitBias, type TopEntry } from "../stage.ts";
import type { Vec } from "./math.ts";

/** `logits` with `bias` applied (biases and penalties: biasLogit). */
export function biasLogits(logits: Vec, bias: readonly LogitBias[] | undefined): Vec {
  if (!bias?.length) return logits;
  const out = Float64Array.from(logits);
  for (const b of bias) out[b.id] = biasLogit(out[b.id], b);
  return out;
}

/** `logits` with every token `mask` does not allow (bit i & 31 of word i >> 5) at -Infinity. */
export function maskLogits(logits: Vec, mask: Uint32Array | undefined): Vec {
  if (!mask) return logits;
  const out = Float64Array.from(logits);
  for (let i = 0; i < out.length; i++) {
    if ((((mask[i >>> 5] ?? 0) >>> (i & 31)) & 1) === 0) out[i] = -Infinity;
  }
  return out;
}

/** log Σ exp(logits), rounded to f32 as every stage returns it. */
export function logSumExp(logits: Vec): number {
  let max = -Infinity;
  for (const x of logits) if (x > max) max = x;
  let sum = 0;
  for (const x of logits) sum += Math.exp(x - max);
  return Math.fround(max + Math.log(sum));
}

/**
 * The argmax id and the k best (id, logit) pairs, descending by logit, logits rounded to f32 as
 * every stage returns them. Ties go to the lower id in both, so split and unsplit runs and the
 * GPU kernels agree byte for byte. -Infinity (masked) entries are never candidates.
 */
export function argmaxTopK(logits: Vec, k: number): { argmax: number; top: TopEntry[] } {
  if (logits.length === 0) throw new RangeError("Cannot pick a token from empty logits");
  if (!Number.isInteger(k) || k < 0) {
    throw new RangeError(`Cannot return the top ${k} logits: expected a whole number ≥ 0`);
  }
  let argmax = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[argmax]) argmax = i;

  const n = Math.min(k, logits.length);
  // A short sorted list, since k is small (the head's top-k) and V may be 250k. Ids arrive in
  // increasing order and only a strictly greater logit moves ahead, so ties keep the lower id.
  const ids: number[] = [];
  for (let i = 0; i < logits.length; i++) {
    const x = logits[i];
    if (x === -Infinity) continue;
    if (ids.length === n) {
      if (n === 0 || !(x > logits[ids[n - 1]])) continue;
      ids.pop();
    }
    let at = ids.length;
    while (at > 0 && x > logits[ids[at - 1]]) at--;
    ids.splice(at, 0, i);
  }
  return { argmax, top: ids.map((id) => ({ id, logit: Math.fround(logits[id]) })) };
}
