// Gated DeltaNet pieces for one token: causal depthwise conv, gates, and the state recurrence.
// Called by the DeltaNet block in engine/reference/reference_forward.ts; the GPU ssm_conv / gated_delta_net oracle.
//
// Dimensions: C conv channels, Kc conv taps, Nk/Nv key/value heads, Dk/Dv their head dims.

import { type HParams, keyHeadOf } from "../hparams.ts";
import { sigmoid, silu, softplus, type Vec } from "./math.ts";

/**
 * One token of the causal depthwise conv + SiLU (docs/model_arch.md §4.6.3).
 * state (Kc−1, C): the last Kc−1 raw inputs, oldest first; updated in place (shifted, x appended).
 * x (C): this token's raw qkv. w (C, Kc): row c is channel c, its last tap multiplies x.
 * Returns silu(Σ_j w[c][j]·X_c[j]) per channel.
 */
export function convStep(state: Float64Array, x: Vec, w: Vec): Float64Array {
  const C = x.length;
  const Kc = w.length / C;
  if (!Number.isInteger(Kc) || Kc < 1 || state.length !== (Kc - 1) * C) {
    throw new RangeError(
      `Cannot run the conv: ${C} channels, ${w.length} kernel values and ${state.length} state values do not fit one (C, Kc) kernel`,
    );
  }
  const u = new Float64Array(C);
  for (let c = 0; c < C; c++) {
    const wOff = c * Kc;
    let s = 0;
    for (let j = 0; j < Kc - 1; j++) s += w[wOff + j] * state[j * C + c];
    s += w[wOff + Kc - 1] * x[c];
    u[c] = silu(s);
  }
  state.copyWithin(0, C);
  state.set(x, (Kc - 2) * C);
  return u;
}

/**
 * Per value head: β = sigmoid(b), g = softplus(a + dt_bias)·ssm_a (≤ 0; decay = e^g)
 * (docs/model_arch.md §4.6.2).
 */
export function deltaNetGates(
  b: Vec,
  a: Vec,
  dtBias: Vec,
  ssmA: Vec,
): { beta: Float64Array; g: Float64Array } {
  const n = b.length;
  if (a.length !== n || dtBias.length !== n || ssmA.length !== n) {
    throw new RangeError(
      `Cannot compute DeltaNet gates: b ${n}, a ${a.length}, dt_bias ${dtBias.length}, ssm_a ${ssmA.length} values differ`,
    );
  }
  const beta = new Float64Array(n);
  const g = new Float64Array(n);
  for (let h = 0; h < n; h++) {
    beta[h] = sigmoid(b[h]);
    g[h] = softplus(a[h] + dtBias[h]) * ssmA[h];
  }
  return { beta, g };
}

/**
 * Buffers of one recurrence step. state (Nv, Dv, Dk): per value head, column j of S stored
 * contiguously over the key dim (state[(h·Dv + j)·Dk + i] = S_h[i][j], ggml's layout); updated
 * in place. q, k (Nk·Dk): L2-normalised, q not yet scaled. v (Nv·Dv). beta, g (Nv).
 */
export interface DeltaNetBuffers {
  readonly state: Float64Array;
  readonly q: Vec;
  readonly k: Vec;
  readonly v: Vec;
  readonly beta: Vec;
  readonly g: Vec;
}

/**
 * One token of the gated delta rule per value head h, with key head keyHeadOf(hp, h)
 * (docs/model_arch.md §4.6.6): S ← e^g·S (decay first); δ_j = (v_j − Σ_i S[i][j]·k_i)·β; S[i][j] +=
 * k_i·δ_j; o_j = (Σ_i S[i][j]·q_i)/√Dk from the updated S. Returns o (Nv·Dv).
 */
export function deltaNetStep(buffers: DeltaNetBuffers, hp: HParams): Float64Array {
  const { state, q, k, v, beta, g } = buffers;
  const { Nk, Nv, Dk, Dv } = hp;
  if (
    state.length !== Nv * Dv * Dk || q.length !== Nk * Dk || k.length !== Nk * Dk ||
    v.length !== Nv * Dv || beta.length !== Nv || g.length !== Nv
  ) {
    throw new RangeError(
      `Cannot run the DeltaNet step: state ${state.length}, q ${q.length}, k ${k.length}, v ${v.length}, beta ${beta.length}, g ${g.length} values do not fit Nk ${Nk}, Nv ${Nv}, Dk ${Dk}, Dv ${Dv}`,
    );
  }
  const scale = 1 / Math.sqrt(Dk);
  const o = new Float64Array(Nv * Dv);
  for (let h = 0; h < Nv; h++) {
    const kOff = keyHeadOf(hp, h) * Dk;
    const decay = Math.exp(g[h]);
    const b = beta[h];
    for (let j = 0; j < Dv; j++) {
      const sOff = (h * Dv + j) * Dk;
      let kv = 0;
      for (let i = 0; i < Dk; i++) {
        state[sOff + i] *= decay;
        kv += state[sOff + i] * k[kOff + i];
      }
      const delta = (v[h * Dv + j] - kv) * b;
      let out = 0;
      for (let i = 0; i < Dk; i++) {
        state[sOff + i] += k[kOff + i] * delta;
        out += state[sOff + i] * q[kOff + i];
      }
      o[h * Dv + j] = out * scale;
    }
  }
  return o;
}
