// Feed-forward pieces: SwiGLU, the gate/up/down expert, and the MoE router.
// Used by the FFN half of every block in engine/reference/reference_forward.ts; oracle for the GPU MoE kernels.

import { matVec, silu, type Vec } from "./math.ts";

/** Lower bound of the routing weights' sum before renormalising (`build_moe_ffn`'s clamp). */
export const ROUTE_SUM_MIN = 6.103515625e-5;

/** silu(g) ⊙ u. */
export function swiglu(g: Vec, u: Vec): Float64Array {
  if (g.length !== u.length) {
    throw new RangeError(`Cannot apply SwiGLU to ${g.length} gate and ${u.length} up values`);
  }
  const y = new Float64Array(g.length);
  for (let i = 0; i < y.length; i++) y[i] = silu(g[i]) * u[i];
  return y;
}

/**
 * One SwiGLU FFN (dense FFN, shared expert, or one routed expert): down·(silu(gate·x) ⊙ up·x).
 * gate, up (F, D) and down (D, F) row-major.
 */
export function swigluFfn(gate: Vec, up: Vec, down: Vec, x: Vec): Float64Array {
  return matVec(down, swiglu(matVec(gate, x), matVec(up, x)));
}

/** The experts chosen for one token and their renormalised weights, by descending probability. */
export interface Route {
  readonly ids: Uint32Array;
  readonly weights: Float64Array;
}

/**
 * Router (docs/model_arch.md §4.7 steps 2–4): softmax over all E logits (max-subtracted), the k
 * most probable experts (ties: lower id first, where llama.cpp's unstable sort is unspecified),
 * their probabilities divided by max(Σ, 6.103515625e−5).
 */
export function moeRoute(logits: Vec, k: number): Route {
  const E = logits.length;
  if (!Number.isInteger(k) || k < 1 || k > E) {
    throw new RangeError(`Cannot route to ${k} of ${E} experts: expected 1..${E}`);
  }
  let max = -Infinity;
  for (let e = 0; e < E; e++) if (logits[e] > max) max = logits[e];
  const probs = new Float64Array(E);
  let sum = 0;
  for (let e = 0; e < E; e++) {
    probs[e] = Math.exp(logits[e] - max);
    sum += probs[e];
  }
  for (let e = 0; e < E; e++) probs[e] /= sum;

  const ids = new Uint32Array(k);
  const weights = new Float64Array(k);
  const taken = new Uint8Array(E);
  let total = 0;
  for (let r = 0; r < k; r++) {
    let best = -1;
    for (let e = 0; e < E; e++) {
      if (!taken[e] && (best < 0 || probs[e] > probs[best])) best = e;
    }
    taken[best] = 1;
    ids[r] = best;
    weights[r] = probs[best];
    total += probs[best];
  }
  const norm = Math.max(total, ROUTE_SUM_MIN);
  for (let r = 0; r < k; r++) weights[r] /= norm;
  return { ids, weights };
}
