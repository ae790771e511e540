// The hybrid block forward for one position, read top to bottom (docs/model_arch.md §4).
// Driven by engine/reference/reference_stage.ts layer by layer; weights from weights.ts, ops from the rest.
//
// Dimensions: D d_model, Hq/Hkv heads, Dh head dim, C conv channels, Kc conv taps, Nk/Nv
// DeltaNet key/value heads, Dk/Dv their dims, Ku experts used, V vocab.
//
// Precision: float64 inside a block on f32 weights; the residual row x is f32 between blocks
// (so a stage boundary changes nothing); K and V enter the cache rounded to f32 then f16, as
// llama.cpp's default F16 cache stores them.

import type { HParams } from "../hparams.ts";
import { attention } from "./gqa_attention.ts";
import { convStep, deltaNetGates, deltaNetStep } from "./deltanet.ts";
import { moeRoute, swigluFfn } from "./ffn.ts";
import { matVec, sigmoid, type Vec } from "./math.ts";
import { gatedRmsNorm, l2NormHeads, rmsNorm } from "./norms.ts";
import { applyRope, ropeAnglesImrope, ropeAnglesNeox } from "./rope.ts";
import type {
  AttentionWeights,
  DeltaNetWeights,
  DenseWeights,
  HeadWeights,
  LayerWeights,
  MoeWeights,
  MtpWeights,
} from "./reference_weights.ts";

/** Per-slot state of a full-attention block: the KV cache. */
export interface AttentionState {
  readonly kind: "attention";
  readonly k: Float16Array; // (ctx, Hkv, Dh) after q/k-norm and RoPE
  readonly v: Float16Array; // (ctx, Hkv, Dh)
}

/** Per-slot state of a DeltaNet block (docs/model_arch.md §5). */
export interface DeltaNetState {
  readonly kind: "deltanet";
  readonly conv: Float64Array; // (Kc−1, C) last raw qkv inputs, oldest first
  readonly ssm: Float64Array; // (Nv, Dv, Dk) S per value head, column-major as ggml
}

export type LayerState = AttentionState | DeltaNetState;

/** Zeroed state of block `il` for a context of `ctx` positions. */
export function newLayerState(hp: HParams, il: number, ctx: number): LayerState {
  if (hp.isDeltaNet[il]) {
    return {
      kind: "deltanet",
      conv: new Float64Array((hp.Kc - 1) * hp.C),
      ssm: new Float64Array(hp.Nv * hp.Dv * hp.Dk),
    };
  }
  const n = ctx * hp.Hkv * hp.Dh;
  return { kind: "attention", k: new Float16Array(n), v: new Float16Array(n) };
}

/**
 * Block il on the f32 residual row x (D) at position pos; x is updated in place (docs/model_arch.md
 * §4.1).
 */
export function forwardLayer(
  hp: HParams,
  w: LayerWeights,
  state: LayerState,
  x: Float32Array,
  pos: number,
): void {
  // a. pre-mixer RMSNorm
  const h = rmsNorm(x, w.attnNorm, hp.eps);
  // b. token mixer
  let m: Float64Array;
  if (w.mixer.kind === "attention" && state.kind === "attention") {
    m = attentionBlock(hp, w.mixer, state, h, pos);
  } else if (w.mixer.kind === "deltanet" && state.kind === "deltanet") {
    m = deltaNetBlock(hp, w.mixer, state, h);
  } else {
    throw new TypeError(`Cannot run a ${w.mixer.kind} block on ${state.kind} state`);
  }
  // c. residual
  const x1 = new Float64Array(hp.D);
  for (let i = 0; i < hp.D; i++) x1[i] = x[i] + m[i];
  // d. pre-FFN RMSNorm (post_attention_norm)
  const h2 = rmsNorm(x1, w.postNorm, hp.eps);
  // e. MoE or dense SwiGLU
  const f = w.ffn.kind === "moe" ? moeBlock(hp, w.ffn, h2) : denseBlock(w.ffn, h2);
  // f. residual, stored back as f32
  for (let i = 0; i < hp.D; i++) x[i] = x1[i] + f[i];
}

/**
 * Gated full attention (docs/model_arch.md §4.5); K and V of `pos` are written to the cache first.
 */
function attentionBlock(
  hp: HParams,
  w: AttentionWeights,
  state: AttentionState,
  h: Float64Array,
  pos: number,
): Float64Array {
  const { Hq, Hkv, Dh, eps } = hp;
  // q and gate from attn_q (split at load), per-head q/k RMSNorm
  const q = rmsNorm(matVec(w.q, h), w.qNorm, eps);
  const gate = matVec(w.gate, h);
  const k = rmsNorm(matVec(w.k, h), w.kNorm, eps);
  const v = matVec(w.v, h);
  // partial RoPE: NEOX (qwen3next) or IMROPE with text positions [p, p, p, 0]
  const angles = hp.arch === "qwen3next"
    ? ropeAnglesNeox(pos, hp.nRot, hp.ropeBase)
    : ropeAnglesImrope([pos, pos, pos, 0], hp.ropeSections, hp.nRot, hp.ropeBase);
  const qr = applyRope(q, Dh, angles);
  const kr = applyRope(k, Dh, angles);
  // F16 cache: round to f32 (llama.cpp's activations) then to f16 on store
  const off = pos * Hkv * Dh;
  for (let i = 0; i < Hkv * Dh; i++) {
    state.k[off + i] = Math.fround(kr[i]);
    state.v[off + i] = Math.fround(v[i]);
  }
  // causal GQA over positions 0..pos, ⊙ sigmoid(gate), o_proj
  const o = attention({ q: qr, gate, k: state.k, v: state.v }, { Hq, Hkv, Dh, nPos: pos + 1 });
  return matVec(w.out, o);
}

/** Gated DeltaNet (docs/model_arch.md §4.6). */
function deltaNetBlock(
  hp: HParams,
  w: DeltaNetWeights,
  state: DeltaNetState,
  h: Float64Array,
): Float64Array {
  const { Nk, Dk, eps } = hp;
  // projections: qkv (C), z (Nv·Dv), b and a (Nv)
  const qkv = matVec(w.qkv, h);
  const z = matVec(w.z, h);
  const { beta, g } = deltaNetGates(matVec(w.beta, h), matVec(w.alpha, h), w.dtBias, w.ssmA);
  // causal conv over the raw qkv history, SiLU
  const u = convStep(state.conv, qkv, w.conv);
  // split channels, L2-normalise q and k per key head
  const keyDim = Nk * Dk;
  const q = l2NormHeads(u.subarray(0, keyDim), Dk, eps);
  const k = l2NormHeads(u.subarray(keyDim, 2 * keyDim), Dk, eps);
  const v = u.subarray(2 * keyDim);
  // recurrence per value head (pairing by arch inside deltaNetStep)
  const o = deltaNetStep({ state: state.ssm, q, k, v, beta, g }, hp);
  // RMSNorm(o)·ssm_norm·silu(z) per head, out_proj
  return matVec(w.out, gatedRmsNorm(o, z, w.ssmNorm, eps));
}

/**
 * Routed experts weighted after down_proj, summed in rank order, plus the gated shared expert
 * (docs/model_arch.md §4.7).
 */
function moeBlock(hp: HParams, w: MoeWeights, h2: Float64Array): Float64Array {
  const route = moeRoute(matVec(w.router, h2), hp.Ku);
  const y = new Float64Array(hp.D);
  for (let r = 0; r < route.ids.length; r++) {
    const e = w.expert(route.ids[r]);
    const o = swigluFfn(e.gate, e.up, e.down, h2);
    const wr = route.weights[r];
    for (let i = 0; i < hp.D; i++) y[i] += o[i] * wr;
  }
  const s = swigluFfn(w.shared.gate, w.shared.up, w.shared.down, h2);
  const gs = sigmoid(matVec(w.sharedGate, h2)[0]);
  for (let i = 0; i < hp.D; i++) y[i] += s[i] * gs;
  return y;
}

/** Dense SwiGLU FFN (qwen35). */
function denseBlock(w: DenseWeights, h2: Float64Array): Float64Array {
  return swigluFfn(w.gate, w.up, w.down, h2);
}

/** Final RMSNorm and LM head on an f32 residual row (docs/model_arch.md §4.8): V logits. */
export function lmHead(hp: HParams, w: HeadWeights, x: Float32Array): Float64Array {
  return matVec(w.output, rmsNorm(x, w.norm, hp.eps));
}

/**
 * One step of the MTP block at its position `pos` (docs/model_arch.md §3.6): the embedding of the
 * token at pos + 1 and the hidden state at pos (the main model's output-normed row there, or the
 * previous step's result), each RMS-normed, joined, projected to D by eh_proj, run through the
 * block (its own KV cache in `state`, a position per hidden row as in vLLM, so that position 0
 * is the first pair and the cache has no hole), and normed by shared_head_norm: what the shared
 * LM head reads, and the hidden state of the next step.
 */
export function mtpStep(
  hp: HParams,
  w: MtpWeights,
  embedding: Float32Array,
  hidden: Vec,
  state: LayerState,
  pos: number,
): Float64Array {
  const joined = new Float64Array(2 * hp.D);
  joined.set(rmsNorm(embedding, w.enorm, hp.eps));
  joined.set(rmsNorm(hidden, w.hnorm, hp.eps), hp.D);
  const x = Float32Array.from(matVec(w.ehProj, joined));
  forwardLayer(hp, w.layer, state, x, pos);
  return rmsNorm(x, w.headNorm, hp.eps);
}
