// Causal GQA attention of one query position over a KV cache, with the sigmoid output gate.
// The core of a full-attention block in engine/reference/reference_forward.ts; the GPU attention oracle.

import { sigmoid, type Vec } from "./math.ts";

/**
 * Buffers: q (Hq·Dh) after q-norm and RoPE; gate (Hq·Dh) the raw gate halves in head order;
 * k, v the layer's cache, position-major (pos, Hkv, Dh), holding at least nPos positions.
 */
export interface AttentionBuffers {
  readonly q: Vec;
  readonly gate: Vec;
  readonly k: Vec;
  readonly v: Vec;
}

export interface AttentionShape {
  readonly Hq: number;
  readonly Hkv: number;
  readonly Dh: number;
  /** Cached positions visible to this query: the query's own position + 1 (causal). */
  readonly nPos: number;
}

/**
 * o_h = Σ_t softmax_t(q_h·K_t / √Dh)·V_t over t < nPos, query head h reading KV head
 * ⌊h / (Hq/Hkv)⌋; then o ⊙ sigmoid(gate) (docs/model_arch.md §4.5 steps 6–8). Returns Hq·Dh values.
 */
export function attention(buffers: AttentionBuffers, shape: AttentionShape): Float64Array {
  const { q, gate, k, v } = buffers;
  const { Hq, Hkv, Dh, nPos } = shape;
  const kvRow = Hkv * Dh;
  if (
    q.length !== Hq * Dh || gate.length !== Hq * Dh || Hq % Hkv !== 0 || nPos < 1 ||
    k.length < nPos * kvRow || v.length < nPos * kvRow
  ) {
    throw new RangeError(
      `Cannot attend: q ${q.length}, gate ${gate.length}, k ${k.length}, v ${v.length} values do not fit Hq ${Hq}, Hkv ${Hkv}, Dh ${Dh}, ${nPos} positions`,
    );
  }
  const group = Hq / Hkv;
  const scale = 1 / Math.sqrt(Dh);
  const scores = new Float64Array(nPos);
  const o = new Float64Array(Hq * Dh);
  for (let h = 0; h < Hq; h++) {
    const qOff = h * Dh;
    const kvOff = Math.floor(h / group) * Dh;
    let max = -Infinity;
    for (let t = 0; t < nPos; t++) {
      const kOff = t * kvRow + kvOff;
      let s = 0;
      for (let i = 0; i < Dh; i++) s += q[qOff + i] * k[kOff + i];
      scores[t] = s * scale;
      if (scores[t] > max) max = scores[t];
    }
    let sum = 0;
    for (let t = 0; t < nPos; t++) {
      scores[t] = Math.exp(scores[t] - max);
      sum += scores[t];
    }
    for (let t = 0; t < nPos; t++) {
      const p = scores[t] / sum;
      const vOff = t * kvRow + kvOff;
      for (let i = 0; i < Dh; i++) o[qOff + i] += p * v[vOff + i];
    }
    for (let i = 0; i < Dh; i++) o[qOff + i] *= sigmoid(gate[qOff + i]);
  }
  return o;
}
