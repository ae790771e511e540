// Greedy choice and top-k candidates from one position's logits.
// Used by the last reference stage (engine/reference/reference_stage.ts); the GPU argmax/top-k oracle.

import type { TopEntry } from "../stage.ts";
import type { Vec } from "./math.ts";

/**
 * The argmax id and the k best (id, logit) pairs, descending by logit. Ties go to the lower id
 * in both, so split and unsplit runs and the GPU kernels agree byte for byte.
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
    if (ids.length === n) {
      if (n === 0 || !(x > logits[ids[n - 1]])) continue;
      ids.pop();
    }
    let at = ids.length;
    while (at > 0 && x > logits[ids[at - 1]]) at--;
    ids.splice(at, 0, i);
  }
  return { argmax, top: ids.map((id) => ({ id, logit: logits[id] })) };
}
