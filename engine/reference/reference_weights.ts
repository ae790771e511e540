// Weights of a reference stage: its layers' tensors dequantized to f32 in one canonical layout.
// Read from a GgufModel by engine/reference/reference_stage.ts; consumed by engine/reference/reference_forward.ts.
//
// Dimensions (engine/hparams.ts): D d_model, Hq/Hkv heads, Dh head dim, C conv channels,
// Kc conv taps, Nk/Nv DeltaNet key/value heads, Dk/Dv their dims, E experts, Fe/Fs expert
// widths, F dense width, V vocab. A matrix (R, K) is R rows of K values, row-major, y = W·x.
//
// Fused and legacy tensors are split into plain matrices here by copying whole rows. A row
// permutation of W permutes W·x exactly, so forward.ts sees one layout for every file variant.

import type { GgufModel, GgufTensorInfo } from "../gguf/gguf_model.ts";
import type { HParams } from "../hparams.ts";
import { dequantize } from "../quant/dequant.ts";
import { rowBytes } from "../quant/ggml_types.ts";

export interface AttentionWeights {
  readonly kind: "attention";
  readonly q: Float32Array; // (Hq·Dh, D) query rows of attn_q
  readonly gate: Float32Array; // (Hq·Dh, D) output-gate rows of attn_q
  readonly k: Float32Array; // (Hkv·Dh, D)
  readonly v: Float32Array; // (Hkv·Dh, D)
  readonly qNorm: Float32Array; // (Dh)
  readonly kNorm: Float32Array; // (Dh)
  readonly out: Float32Array; // (D, Hq·Dh)
}

export interface DeltaNetWeights {
  readonly kind: "deltanet";
  readonly qkv: Float32Array; // (C, D) rows [q: Nk·Dk | k: Nk·Dk | v: Nv·Dv]
  readonly z: Float32Array; // (Nv·Dv, D)
  readonly beta: Float32Array; // (Nv, D)
  readonly alpha: Float32Array; // (Nv, D)
  readonly conv: Float32Array; // (C, Kc)
  readonly dtBias: Float32Array; // (Nv)
  readonly ssmA: Float32Array; // (Nv), already −exp(A_log)
  readonly ssmNorm: Float32Array; // (Dv)
  readonly out: Float32Array; // (D, Nv·Dv)
}

/** One SwiGLU FFN: gate, up (F, D) and down (D, F). */
export interface SwigluWeights {
  readonly gate: Float32Array;
  readonly up: Float32Array;
  readonly down: Float32Array;
}

export interface MoeWeights {
  readonly kind: "moe";
  readonly router: Float32Array; // (E, D)
  /** Routed expert e (Fe wide), dequantized on first use so unused experts cost only bytes. */
  expert(e: number): SwigluWeights;
  readonly shared: SwigluWeights; // Fs wide
  readonly sharedGate: Float32Array; // (D)
}

export interface DenseWeights extends SwigluWeights {
  readonly kind: "dense";
}

export interface LayerWeights {
  readonly attnNorm: Float32Array; // (D)
  readonly postNorm: Float32Array; // (D) post_attention_norm, the pre-FFN norm
  readonly mixer: AttentionWeights | DeltaNetWeights;
  readonly ffn: MoeWeights | DenseWeights;
}

/** token_embd kept as file bytes; one row is dequantized per lookup. */
export interface Embedding {
  row(id: number): Float32Array;
}

export interface HeadWeights {
  readonly norm: Float32Array; // (D) output_norm
  readonly output: Float32Array; // (V, D) output, or token_embd when tied
}

/** The tensor `name`, checked against its expected GGUF shape (ne order). */
function info(model: GgufModel, name: string, shape: readonly number[]): GgufTensorInfo {
  const t = model.tensors.get(name);
  if (!t) {
    throw new RangeError(
      `Cannot load the reference stage: "${model.path}" has no tensor "${name}"; ` +
        `the file does not match its architecture metadata`,
    );
  }
  if (!sameShape(t.shape, shape)) {
    throw new RangeError(
      `Cannot load "${name}" from "${model.path}": shape [${t.shape.join(", ")}], ` +
        `expected [${shape.join(", ")}]`,
    );
  }
  return t;
}

/** Shapes equal up to trailing 1s (a {D} vector may be written as {D, 1}). */
function sameShape(a: readonly number[], b: readonly number[]): boolean {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if ((a[i] ?? 1) !== (b[i] ?? 1)) return false;
  }
  return true;
}

async function load(
  model: GgufModel,
  name: string,
  shape: readonly number[],
): Promise<Float32Array> {
  const t = info(model, name, shape);
  const n = shape.reduce((a, b) => a * b, 1);
  return dequantize(t.type, await model.readTensor(name), n);
}

/** The rows `rows` (in that order) of a (·, cols) matrix. */
function gatherRows(src: Float32Array, cols: number, rows: readonly number[]): Float32Array {
  const out = new Float32Array(rows.length * cols);
  rows.forEach((r, i) => out.set(src.subarray(r * cols, (r + 1) * cols), i * cols));
  return out;
}

/** [start, start+count) shifted by `base`, for building row lists. */
function span(base: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => base + i);
}

async function loadAttention(model: GgufModel, hp: HParams, il: number): Promise<AttentionWeights> {
  const { D, Hq, Hkv, Dh } = hp;
  const p = `blk.${il}`;
  const qDim = 2 * Hq * Dh;
  const kvDim = Hkv * Dh;
  let qg: Float32Array, k: Float32Array, v: Float32Array;
  if (model.tensors.has(`${p}.attn_qkv.weight`)) {
    // One fused matmul: rows [q and gate interleaved per head | k | v].
    const all = await load(model, `${p}.attn_qkv.weight`, [D, qDim + 2 * kvDim]);
    qg = all.subarray(0, qDim * D);
    k = all.slice(qDim * D, (qDim + kvDim) * D);
    v = all.slice((qDim + kvDim) * D);
  } else {
    qg = await load(model, `${p}.attn_q.weight`, [D, qDim]);
    k = await load(model, `${p}.attn_k.weight`, [D, kvDim]);
    v = await load(model, `${p}.attn_v.weight`, [D, kvDim]);
  }
  // attn_q holds per head [q (Dh) | gate (Dh)] (docs/model_arch.md §4.5 step 1).
  const heads = span(0, Hq);
  return {
    kind: "attention",
    q: gatherRows(qg, D, heads.flatMap((h) => span(h * 2 * Dh, Dh))),
    gate: gatherRows(qg, D, heads.flatMap((h) => span(h * 2 * Dh + Dh, Dh))),
    k,
    v,
    qNorm: await load(model, `${p}.attn_q_norm.weight`, [Dh]),
    kNorm: await load(model, `${p}.attn_k_norm.weight`, [Dh]),
    out: await load(model, `${p}.attn_output.weight`, [Hq * Dh, D]),
  };
}

async function loadDeltaNet(model: GgufModel, hp: HParams, il: number): Promise<DeltaNetWeights> {
  const { D, Nk, Nv, Dk, Dv, C, Kc } = hp;
  const p = `blk.${il}`;
  const r = Nv / Nk;
  const keyDim = Nk * Dk;
  const valueDim = Nv * Dv;
  const kHeads = span(0, Nk);
  let qkv: Float32Array, z: Float32Array;
  if (model.tensors.has(`${p}.attn_qkv.weight`) || hp.arch !== "qwen3next") {
    qkv = await load(model, `${p}.attn_qkv.weight`, [D, C]);
    z = await load(model, `${p}.attn_gate.weight`, [D, valueDim]);
  } else {
    // Legacy ssm_in: per key head kh a group [q (Dk) | k (Dk) | v (r·Dv) | z (r·Dv)]
    // (docs/model_arch.md §4.6.1).
    const g = 2 * Dk + 2 * r * Dv;
    const all = await load(model, `${p}.ssm_in.weight`, [D, 2 * keyDim + 2 * valueDim]);
    qkv = gatherRows(all, D, [
      ...kHeads.flatMap((kh) => span(kh * g, Dk)),
      ...kHeads.flatMap((kh) => span(kh * g + Dk, Dk)),
      ...kHeads.flatMap((kh) => span(kh * g + 2 * Dk, r * Dv)),
    ]);
    z = gatherRows(all, D, kHeads.flatMap((kh) => span(kh * g + 2 * Dk + r * Dv, r * Dv)));
  }
  let beta: Float32Array, alpha: Float32Array;
  if (hp.arch === "qwen3next") {
    // ssm_ba: per key head kh a group [b (r) | a (r)].
    const ba = await load(model, `${p}.ssm_ba.weight`, [D, 2 * Nv]);
    beta = gatherRows(ba, D, kHeads.flatMap((kh) => span(kh * 2 * r, r)));
    alpha = gatherRows(ba, D, kHeads.flatMap((kh) => span(kh * 2 * r + r, r)));
  } else {
    beta = await load(model, `${p}.ssm_beta.weight`, [D, Nv]);
    alpha = await load(model, `${p}.ssm_alpha.weight`, [D, Nv]);
  }
  return {
    kind: "deltanet",
    qkv,
    z,
    beta,
    alpha,
    conv: await load(model, `${p}.ssm_conv1d.weight`, [Kc, C]),
    dtBias: await load(model, `${p}.ssm_dt.bias`, [Nv]),
    ssmA: await load(model, `${p}.ssm_a`, [Nv]),
    ssmNorm: await load(model, `${p}.ssm_norm.weight`, [Dv]),
    out: await load(model, `${p}.ssm_out.weight`, [valueDim, D]),
  };
}

/**
 * A 3-D expert tensor {cols, rows, E} kept as file bytes; expert e's (rows, cols) block is
 * dequantized when asked for. Expert e's rows start at byte e·rows·rowBytes (docs/model_arch.md
 * §1.2, §7 trap 18).
 */
async function expertBytes(
  model: GgufModel,
  name: string,
  cols: number,
  rows: number,
  E: number,
): Promise<(e: number) => Float32Array> {
  const t = info(model, name, [cols, rows, E]);
  const bytes = await model.readTensor(name);
  const per = rows * rowBytes(t.type, cols);
  return (e) => dequantize(t.type, bytes.subarray(e * per, (e + 1) * per), rows * cols);
}

async function loadMoe(model: GgufModel, hp: HParams, il: number): Promise<MoeWeights> {
  const { D, E, Fe, Fs } = hp;
  const p = `blk.${il}`;
  const down = await expertBytes(model, `${p}.ffn_down_exps.weight`, Fe, D, E);
  let gateUp: (e: number) => { gate: Float32Array; up: Float32Array };
  if (model.tensors.has(`${p}.ffn_gate_up_exps.weight`)) {
    // Merged: expert rows 0..Fe−1 are gate, Fe..2Fe−1 up.
    const merged = await expertBytes(model, `${p}.ffn_gate_up_exps.weight`, D, 2 * Fe, E);
    gateUp = (e) => {
      const m = merged(e);
      return { gate: m.subarray(0, Fe * D), up: m.subarray(Fe * D) };
    };
  } else {
    const gate = await expertBytes(model, `${p}.ffn_gate_exps.weight`, D, Fe, E);
    const up = await expertBytes(model, `${p}.ffn_up_exps.weight`, D, Fe, E);
    gateUp = (e) => ({ gate: gate(e), up: up(e) });
  }
  const experts: (SwigluWeights | undefined)[] = new Array(E);
  return {
    kind: "moe",
    router: await load(model, `${p}.ffn_gate_inp.weight`, [D, E]),
    expert(e) {
      return experts[e] ??= { ...gateUp(e), down: down(e) };
    },
    shared: {
      gate: await load(model, `${p}.ffn_gate_shexp.weight`, [D, Fs]),
      up: await load(model, `${p}.ffn_up_shexp.weight`, [D, Fs]),
      down: await load(model, `${p}.ffn_down_shexp.weight`, [Fs, D]),
    },
    sharedGate: await load(model, `${p}.ffn_gate_inp_shexp.weight`, [D]),
  };
}

async function loadDense(model: GgufModel, hp: HParams, il: number): Promise<DenseWeights> {
  const { D, F } = hp;
  const p = `blk.${il}`;
  return {
    kind: "dense",
    gate: await load(model, `${p}.ffn_gate.weight`, [D, F]),
    up: await load(model, `${p}.ffn_up.weight`, [D, F]),
    down: await load(model, `${p}.ffn_down.weight`, [F, D]),
  };
}

/** Block `il`: norms, its mixer (attention or DeltaNet by hp.isDeltaNet) and its FFN. */
export async function loadLayer(model: GgufModel, hp: HParams, il: number): Promise<LayerWeights> {
  const p = `blk.${il}`;
  return {
    attnNorm: await load(model, `${p}.attn_norm.weight`, [hp.D]),
    postNorm: await load(model, `${p}.post_attention_norm.weight`, [hp.D]),
    mixer: hp.isDeltaNet[il]
      ? await loadDeltaNet(model, hp, il)
      : await loadAttention(model, hp, il),
    ffn: hp.arch === "qwen35" ? await loadDense(model, hp, il) : await loadMoe(model, hp, il),
  };
}

/** token_embd for the first stage. */
export async function loadEmbedding(model: GgufModel, hp: HParams): Promise<Embedding> {
  const { D, V } = hp;
  const t = info(model, "token_embd.weight", [D, V]);
  const bytes = await model.readTensor("token_embd.weight");
  const per = rowBytes(t.type, D);
  return { row: (id) => dequantize(t.type, bytes.subarray(id * per, (id + 1) * per), D) };
}

/** output_norm and the LM head for the last stage; token_embd stands in when output is absent. */
export async function loadHead(model: GgufModel, hp: HParams): Promise<HeadWeights> {
  const name = model.tensors.has("output.weight") ? "output.weight" : "token_embd.weight";
  return {
    norm: await load(model, "output_norm.weight", [hp.D]),
    output: await load(model, name, [hp.D, hp.V]),
  };
}

/**
 * The MTP block (docs/model_arch.md §3.6): the full-attention block at index nLayer and its nextn
 * tensors, which draft the token after next from a token and the hidden state before it.
 */
export interface MtpWeights {
  readonly layer: LayerWeights;
  readonly enorm: Float32Array; // (D) on the token's embedding
  readonly hnorm: Float32Array; // (D) on the hidden state
  readonly ehProj: Float32Array; // (D, 2D) over [embedding ‖ hidden]
  readonly headNorm: Float32Array; // (D) shared_head_norm, before the shared LM head
}

/** The MTP block of a model that has one (hasMtpBlock). */
export async function loadMtp(model: GgufModel, hp: HParams): Promise<MtpWeights> {
  const p = `blk.${hp.nLayer}.nextn`;
  return {
    layer: await loadLayer(model, hp, hp.nLayer),
    enorm: await load(model, `${p}.enorm.weight`, [hp.D]),
    hnorm: await load(model, `${p}.hnorm.weight`, [hp.D]),
    ehProj: await load(model, `${p}.eh_proj.weight`, [2 * hp.D, hp.D]),
    headNorm: await load(model, `${p}.shared_head_norm.weight`, [hp.D]),
  };
}
