// One GPU stage step of the hybrid family, read top to bottom (docs/model_arch.md §4): embed, the
// owned blocks (DeltaNet or gated attention, then MoE or dense SwiGLU), then norm + LM head +
// argmax/top-k on the last stage. Records into a StepEncoder; engine/gpu/gpu_stage.ts submits.
//
// Dimensions: T tokens this step, D d_model, Hq/Hkv heads, Dh head dim, C conv channels, Kc conv
// taps, Nk/Nv DeltaNet key/value heads, Dk/Dv their dims, E experts, Ku experts used, Fe/Fs
// expert widths, F dense width, V vocab. Activation rows are position-major: row t at t·width.

import type { StepEncoder } from "./encoder.ts";
import { argmax } from "./kernels/argmax.ts";
import { attention } from "./kernels/attention.ts";
import { fusedDeltaNet, gatedDeltaNet } from "./kernels/gated_delta_net.ts";
import { getRows } from "./kernels/get_rows.ts";
import { gatherTiles, moeGather } from "./kernels/moe_gather.ts";
import { moeRoute } from "./kernels/moe_route.ts";
import { moeDownSum } from "./kernels/moe_sum.ts";
import {
  DECODE_MAX_TOKENS,
  expertsPerSlot,
  HEAD_FOLD_MAX_ROWS,
  mulMat,
  type MulMatOptions,
  mulMatPair,
  PREFILL_TT,
  type RmsNormInput,
} from "./kernels/mul_mat.ts";
import { qkNormRope } from "./kernels/qk_norm_rope.ts";
import { rmsNorm } from "./kernels/rms_norm.ts";
import { type SequenceTable, ssmConv, type TrailRef } from "./kernels/ssm_conv.ts";
import { logitAdjust } from "./kernels/logit_adjust.ts";
import { logSumExp, topK, topKScratchWords, topKWords } from "./kernels/topk.ts";
import type { HParams } from "../hparams.ts";
import { GgmlType } from "../quant/ggml_types.ts";
import type { GpuTensor } from "./tensor.ts";
import { ropeThetaScale } from "../reference/rope.ts";
import type {
  AttentionWeights,
  DeltaNetWeights,
  DenseWeights,
  LayerWeights,
  MoeWeights,
  Projection,
  StageWeights,
} from "./gpu_weights.ts";

/** Scratch rows for up to maxBatch tokens, shared by every layer and slot of a stage. */
export interface Activations {
  readonly ids: GPUBuffer; // (T + 1) u32 input token ids (decodeFused chains its argmaxes here)
  readonly seqs: GPUBuffer; // the step's sequence table: SEQ_WORDS u32 a sequence (encodeLayers)
  readonly x: GPUBuffer; // (T, D) residual stream
  readonly h: GPUBuffer; // (T, D) normed input of a mixer or FFN
  readonly attn: GPUBuffer; // (T, 2·Hq·Dh + 2·Hkv·Dh) [q|gate per head | k | v]
  readonly o: GPUBuffer; // (T, max(Hq·Dh, Nv·Dv)) attention or DeltaNet output
  readonly attnPart: GPUBuffer; // attention block partials (attentionPartialFloats)
  readonly qkvzba: GPUBuffer; // (T, C + Nv·Dv + 2·Nv) DeltaNet projections [q | k | v | z | b | a]
  readonly u: GPUBuffer; // (T, C) conv output
  readonly router: GPUBuffer; // (T, E + 1) router logits and shared gate logit
  readonly route: GPUBuffer; // (T, Ku) u32 chosen experts
  readonly routeW: GPUBuffer; // (T, Ku + 1) expert weights and shared gate
  readonly gather: GPUBuffer; // u32 slots (T·Ku) grouped by expert in token tiles (prefill)
  readonly gateUp: GPUBuffer; // (T, Ku, 2·Fe) routed [gate | up], or (T, 2·F) dense
  readonly expertOut: GPUBuffer; // (T, Ku, D)
  readonly sharedGateUp: GPUBuffer; // (T, 2·Fs)
  readonly sharedOut: GPUBuffer; // (T, D)
  readonly logits: GPUBuffer; // (L, V) one chunk of LM-head rows
  readonly greedy: GPUBuffer; // (T) u32 argmax per position
  readonly headRows: GPUBuffer; // (T) u32 rows of x whose logits a step computes, when gathered
  readonly headX: GPUBuffer; // (T, D) those rows of x, gathered
  readonly mask: GPUBuffer; // u32 allowed-token bits of the step's runs' LogitAdjusts, a run's after another's
  readonly bias: GPUBuffer; // (id, bias, repeat, subtract) records of the step's runs' LogitAdjusts
  readonly argmaxScratch: GPUBuffer; // argmax candidates of the first pass
  readonly top: GPUBuffer; // per top row: (k) (f32 bits, id) pairs, then the log-sum-exp
  readonly draws: GPUBuffer; // u32 sampler constants (samplerWords), then a draw per fused step
  readonly topScratch: GPUBuffer; // per-chunk top-k and log-sum-exp partials (topKScratchWords a row)
  readonly mmaX: GPUBuffer; // tensor-core products' f16 input rows and scales (mmaScratchBytes)
  readonly mtpBefore: GPUBuffer; // (T, D) the MTP block's hidden rows, then embeddings (mtp_forward.ts)
  readonly mtpJoin: GPUBuffer; // (T, 2·D) the MTP block's eh_proj input
}

/**
 * One sequence's rows of a step: rows [row, row + n) of the activations are its positions
 * [base, base + n), run against its slot's state. A prefill or a single decode is one; a step
 * that decodes several slots at once has a one-row sequence for each.
 */
export interface StepSeq {
  readonly states: readonly GpuLayerState[];
  readonly base: number;
  readonly row: number;
  readonly n: number;
  /**
   * Keep the DeltaNet state after each position in the states' trails (a rewindable run of
   * n > 1 positions: the state after its last position is the state itself).
   */
  readonly trail?: boolean;
}

/**
 * Per-slot state of one block: its place `index` in buffers that hold the state of several slots
 * one after another (StateStrides apart), so that one dispatch can run every sequence of a step.
 */
export type GpuLayerState =
  | {
    readonly kind: "attention";
    readonly kc: GPUBuffer; // (slots, ctx, Hkv, Dh) f16
    readonly vc: GPUBuffer;
    readonly index: number;
  }
  | {
    readonly kind: "deltanet";
    readonly conv: GPUBuffer; // (slots, Kc−1, C) f32
    readonly ssm: GPUBuffer; // (slots, Nv, Dk, Dv) f32
    readonly index: number;
    /** A slot's trail for rewinds, on a stage opened with maxRewind > 0 (snapshots have none). */
    readonly trail?: DeltaNetTrail;
  };

/**
 * Where a rewindable run keeps its DeltaNet history (wgsl/ssm_conv.wgsl and
 * wgsl/gated_delta_net.wgsl TRAIL): the conv inputs, (Kc − 1 + maxRewind, C) f32 from
 * convOffset, and the state after each position, (maxRewind, Nv, Dk, Dv) f32 from ssmOffset.
 */
export interface DeltaNetTrail {
  readonly conv: GPUBuffer;
  readonly convOffset: number;
  readonly ssm: GPUBuffer;
  readonly ssmOffset: number;
}

/** The trail of a sequence's DeltaNet state, where the step keeps it. */
function trailOf(
  seq: StepSeq,
  state: { readonly trail?: DeltaNetTrail },
  part: "conv" | "ssm",
): TrailRef | undefined {
  if (!seq.trail) return undefined;
  const t = state.trail;
  if (!t) throw new RangeError("Cannot keep a rewind trail: the stage was opened without one");
  return part === "conv"
    ? { buffer: t.conv, offset: t.convOffset }
    : { buffer: t.ssm, offset: t.ssmOffset };
}

/** One slot's state in its buffers, in their elements: conv and ssm f32s, K (or V) u32 words. */
export interface StateStrides {
  readonly conv: number;
  readonly ssm: number;
  readonly kv: number;
}

/** The strides of the slots' states of a model, caches of `ctx` positions. */
export function stateStrides(hp: HParams, ctx: number): StateStrides {
  return { conv: (hp.Kc - 1) * hp.C, ssm: hp.Nv * hp.Dk * hp.Dv, kv: ctx * hp.Hkv * hp.Dh / 2 };
}

/** u32 words of a step's sequence table entry: state index, row, tokens, first position. */
export const SEQ_WORDS = 4;

/** What a stage step needs besides its slot state. */
export interface ForwardPlan {
  readonly hp: HParams;
  readonly first: number;
  readonly weights: StageWeights;
  readonly act: Activations;
  /** LM-head rows per chunk (the logits buffer holds this many positions). */
  readonly lmChunk: number;
  /** Where one slot's state follows another's in the state buffers. */
  readonly strides: StateStrides;
  /**
   * Tensor cores for prompt rows: "hardware" where the device has subgroup matrices, "emulate"
   * (tests) to run their f16 path with the matrix operations in f32 code; undefined: none.
   */
  readonly mma?: "hardware" | "emulate";
}

/**
 * How a step's products run: today's kernels (decode rows, or no tensor cores), or tensor cores
 * for a prompt's rows (MulMatOptions.mma): f16 operands, a token's bits its own whatever its
 * company, but not the bits today's kernels give it.
 */
export interface Products {
  readonly mma?: true;
  readonly mmaEmulate?: true;
}

function productsOf(plan: ForwardPlan, prompt: boolean): Products {
  if (!prompt || !plan.mma) return {};
  return plan.mma === "emulate" ? { mma: true, mmaEmulate: true } : { mma: true };
}

/**
 * A block's normed input: rows of h, or the residual rows x with the RMSNorm folded in; and the
 * scratch its tensor-core products convert it in.
 */
interface Normed {
  readonly x: GPUBuffer;
  readonly norm?: RmsNormInput;
  readonly mmaX: GPUBuffer;
  readonly pm: Products;
}

/**
 * RMSNorm(x)·w as the input of the projections that follow: folded into them when the decode
 * kernels run (a few rows; _include/rms.wgsl gives both the same bits), else written to h by a
 * dispatch.
 */
function normed(
  enc: StepEncoder,
  plan: ForwardPlan,
  w: GPUBuffer,
  T: number,
  pm: Products,
): Normed {
  const { act, hp } = plan;
  if (T <= DECODE_MAX_TOKENS && !pm.mma) {
    return { x: act.x, norm: { w, eps: hp.eps }, mmaX: act.mmaX, pm };
  }
  rmsNorm(enc, { x: act.x, w, y: act.h }, { n: hp.D, rows: T, eps: hp.eps });
  return { x: act.h, mmaX: act.mmaX, pm };
}

/** y[offsets] = W·h for every projection writing into one row of `width`. */
function project(
  enc: StepEncoder,
  projections: readonly Projection[],
  h: Normed,
  y: GPUBuffer,
  width: number,
  o: Omit<MulMatOptions, "yOffset" | "yStrideT" | "norm">,
): void {
  for (const p of projections) {
    // A conv epilogue goes to the parts that hold conv channels (the columns below its channels).
    const conv = o.conv && p.offset < o.conv.channels ? o.conv : undefined;
    mulMat(enc, { w: p.w, x: h.x, y, mmaX: h.mmaX }, {
      ...o,
      ...h.pm,
      conv,
      norm: h.norm,
      yOffset: p.offset,
      yStrideT: width,
    });
  }
}

/** Layer il's state of a sequence, which must be of `kind`. */
function stateOf<K extends GpuLayerState["kind"]>(
  seq: StepSeq,
  il: number,
  kind: K,
): Extract<GpuLayerState, { kind: K }> {
  const s = seq.states[il];
  if (s.kind !== kind) throw new TypeError(`Cannot run a ${kind} block on ${s.kind} state`);
  return s as Extract<GpuLayerState, { kind: K }>;
}

/**
 * A run of a step's sequences one dispatch takes: `multi` when several consecutive sequences
 * that `joins` admits share the layer's state buffer (they then go through the sequence table),
 * else one sequence alone.
 */
interface SeqGroup {
  readonly first: number;
  readonly end: number;
  readonly multi: boolean;
}

/** The step's sequences in dispatch groups for layer il (state buffer by `buffer`). */
function seqGroups(
  seqs: readonly StepSeq[],
  il: number,
  joins: (s: StepSeq) => boolean,
  buffer: (s: GpuLayerState) => GPUBuffer,
): SeqGroup[] {
  const groups: SeqGroup[] = [];
  for (let i = 0; i < seqs.length;) {
    let end = i + 1;
    if (joins(seqs[i])) {
      const b = buffer(seqs[i].states[il]);
      while (end < seqs.length && joins(seqs[end]) && buffer(seqs[end].states[il]) === b) end++;
    }
    groups.push({ first: i, end, multi: end - i > 1 });
    i = end;
  }
  return groups;
}

/**
 * A multi group's sequence table entries, their states `stride` elements apart; the table of
 * `seqs` starts at entry `at` of act.seqs (encodeSeqTable).
 */
function table(
  plan: ForwardPlan,
  g: SeqGroup,
  stride: number,
  at: number,
): SequenceTable | undefined {
  if (!g.multi) return undefined;
  return { seqs: plan.act.seqs, seq0: at + g.first, count: g.end - g.first, stateStride: stride };
}

/**
 * Uploads the sequence table the layers' multi-sequence dispatches read for `seqs` (entry
 * at + i is seqs[i]'s): its state index, row, tokens and first position.
 */
export function encodeSeqTable(
  enc: StepEncoder,
  plan: ForwardPlan,
  seqs: readonly StepSeq[],
  at: number,
): void {
  if (seqs.length < 2) return;
  const entry = (s: StepSeq) => [s.states[0]?.index ?? 0, s.row, s.n, s.base];
  enc.upload(plan.act.seqs, 4 * SEQ_WORDS * at, Uint32Array.from(seqs.flatMap(entry)));
}

/** Gated DeltaNet block on h, added into x (docs/model_arch.md §4.6). */
function deltaNetBlock(
  enc: StepEncoder,
  plan: ForwardPlan,
  w: DeltaNetWeights,
  seqs: readonly StepSeq[],
  il: number,
  h: Normed,
  T: number,
  tableAt: number,
): void {
  const { hp, act } = plan;
  const { C, Nk, Nv, Dk, Dv } = hp;
  const baOffset = C + Nv * Dv;
  const width = baOffset + 2 * Nv;
  // projections: [q | k | v | z | b | a]; then the causal conv over the raw qkv history, SiLU
  // (a lone decode step's in the projections' epilogue), per sequence or per run of one-token
  // sequences
  const { strides } = plan;
  if (T === 1 && !h.pm.mma) {
    const state = stateOf(seqs[0], il, "deltanet");
    const conv = {
      w: w.conv,
      state: state.conv,
      stateOffset: state.index * strides.conv,
      u: act.u,
      channels: C,
      kc: hp.Kc,
    };
    project(enc, w.qkvzba, h, act.qkvzba, width, { tokens: T, conv });
  } else {
    project(enc, w.qkvzba, h, act.qkvzba, width, { tokens: T });
    const single = (s: StepSeq) => s.n === 1 && !s.trail;
    for (const g of seqGroups(seqs, il, single, (s) => s.kind === "deltanet" ? s.conv : s.kc)) {
      const seq = seqs[g.first];
      const state = stateOf(seq, il, "deltanet");
      ssmConv(enc, { x: act.qkvzba, w: w.conv, state: state.conv, u: act.u }, {
        channels: C,
        kc: hp.Kc,
        tokens: seq.n,
        xOffset: g.multi ? 0 : seq.row * width,
        xStrideT: width,
        uOffset: g.multi ? 0 : seq.row * C,
        uStrideT: C,
        stateOffset: g.multi ? 0 : state.index * strides.conv,
        multi: table(plan, g, strides.conv, tableAt),
        trail: trailOf(seq, state, "conv"),
      });
    }
  }
  // L2 norms, gates, recurrence per value head, RMSNorm(o)·ssm_norm·silu(z)
  const qkvzba = act.qkvzba;
  const fused = (s: StepSeq) => fusedDeltaNet(s.n, Dv) && !s.trail;
  for (const g of seqGroups(seqs, il, fused, (s) => s.kind === "deltanet" ? s.ssm : s.kc)) {
    const seq = seqs[g.first];
    const state = stateOf(seq, il, "deltanet");
    const row = g.multi ? 0 : seq.row;
    gatedDeltaNet(
      enc,
      { u: act.u, ba: qkvzba, z: qkvzba, p: w.params, state: state.ssm, y: act.o },
      {
        nk: Nk,
        nv: Nv,
        dk: Dk,
        dv: Dv,
        tokens: seq.n,
        interleave: hp.arch === "qwen3next",
        uOffset: row * C,
        uStrideT: C,
        baOffset: row * width + baOffset,
        baStrideT: width,
        zOffset: row * width + C,
        zStrideT: width,
        yOffset: row * Nv * Dv,
        yStrideT: Nv * Dv,
        eps: hp.eps,
        stateOffset: g.multi ? 0 : state.index * strides.ssm,
        multi: table(plan, g, strides.ssm, tableAt),
        trail: trailOf(seq, state, "ssm"),
      },
    );
  }
  // out_proj, residual
  mulMat(enc, { w: w.out, x: act.o, y: act.x, mmaX: act.mmaX }, { tokens: T, add: true, ...h.pm });
}

/** Gated full attention on h, each sequence at its positions, added into x (docs/model_arch.md §4.5). */
function attentionBlock(
  enc: StepEncoder,
  plan: ForwardPlan,
  w: AttentionWeights,
  seqs: readonly StepSeq[],
  il: number,
  h: Normed,
  T: number,
  tableAt: number,
): void {
  const { hp, act } = plan;
  const { Hq, Hkv, Dh } = hp;
  const qDim = 2 * Hq * Dh;
  const width = qDim + 2 * Hkv * Dh;
  // [q | gate] per head, k, v
  project(enc, w.qkv, h, act.attn, width, { tokens: T });
  const { strides } = plan;
  const single = (s: StepSeq) => s.n === 1;
  for (const g of seqGroups(seqs, il, single, (s) => s.kind === "attention" ? s.kc : s.conv)) {
    const seq = seqs[g.first];
    const { kc, vc, index } = stateOf(seq, il, "attention");
    const multi = table(plan, g, strides.kv, tableAt);
    const tokens = multi ? multi.count : seq.n;
    const row = multi ? 0 : seq.row;
    const kvOffset = multi ? 0 : index * strides.kv;
    // per-head RMSNorm and partial RoPE (NEOX, or IMROPE with text positions); k, v into the
    // cache
    qkNormRope(enc, { x: act.attn, wq: w.qNorm, wk: w.kNorm, kc, vc }, {
      tokens,
      dh: Dh,
      nRot: hp.nRot,
      thetaScale: ropeThetaScale(hp.ropeBase, hp.nRot),
      sections: hp.ropeSections,
      eps: hp.eps,
      pos0: seq.base,
      xOffset: row * width,
      xStrideT: width,
      q: { heads: Hq, strideH: 2 * Dh },
      k: { heads: Hkv, offset: qDim, strideH: Dh, vOffset: qDim + Hkv * Dh },
      kvOffset,
      multi,
    });
    // causal GQA over positions 0..base+t, ⊙ sigmoid(gate); a table's tokens each at theirs
    const last = multi ? Math.max(...seqs.slice(g.first, g.end).map((s) => s.base)) : seq.base;
    attention(enc, { q: act.attn, kc, vc, part: act.attnPart, o: act.o }, {
      tokens,
      hq: Hq,
      hkv: Hkv,
      dh: Dh,
      pos0: last,
      qOffset: row * width,
      oOffset: row * Hq * Dh,
      qStrideT: width,
      qStrideH: 2 * Dh,
      gateOffset: Dh,
      oStrideT: Hq * Dh,
      kvOffset,
      multi,
    });
  }
  // o_proj, residual
  mulMat(enc, { w: w.out, x: act.o, y: act.x, mmaX: act.mmaX }, { tokens: T, add: true, ...h.pm });
}

/** Routed experts + sigmoid-gated shared expert on h, added into x (docs/model_arch.md §4.7). */
function moeBlock(enc: StepEncoder, plan: ForwardPlan, w: MoeWeights, h: Normed, T: number): void {
  const { hp, act } = plan;
  const { E, Ku, Fe, Fs } = hp;
  // router logits and the shared expert's gate logit (with a decode step's shared gate|up in
  // the same dispatch where they pair); softmax, top-k, renormalise
  const pm = h.pm;
  const paired = !pm.mma && w.router.length === 1 && w.sharedGateUp.length === 1 &&
    mulMatPair(enc, {
      w: w.sharedGateUp[0].w,
      w2: w.router[0].w,
      x: h.x,
      y: act.sharedGateUp,
      y2: act.router,
    }, {
      tokens: T,
      norm: h.norm,
      yOffset: w.sharedGateUp[0].offset,
      yStrideT: 2 * Fs,
      y2Offset: w.router[0].offset,
      y2StrideT: E + 1,
    });
  if (!paired) project(enc, w.router, h, act.router, E + 1, { tokens: T });
  moeRoute(enc, { logits: act.router, ids: act.route, weights: act.routeW }, {
    experts: E,
    k: Ku,
    tokens: T,
    logitsStride: E + 1,
    sharedGate: true,
  });
  // Up to EXPERT_MATVEC_MAX_TOKENS rows, while the shared expert's down runs as decode products,
  // the experts run a (token, rank) slot a workgroup and that down's epilogue closes the layer:
  // on the H100 a slot a workgroup, reading an expert again from L2 for each of its slots, took
  // 15-45% less time than the gathered products at 8 to 64 rows (docs/PERFORMANCE-NOTES.md,
  // "Steps of many rows"). Longer runs (and every tensor-core run) group the slots by expert, so
  // weights are read once per token tile.
  let ids = act.route;
  let tiles: number | undefined;
  const perSlot = !pm.mma && expertsPerSlot(T, w.sharedDown.matrixRows);
  if (!perSlot) {
    moeGather(enc, { ids: act.route, table: act.gather }, {
      slots: T * Ku,
      experts: E,
      tt: PREFILL_TT,
    });
    ids = act.gather;
    tiles = gatherTiles(T * Ku, E, PREFILL_TT);
  }
  // each token's experts: [gate | up]
  for (const p of w.gateUp) {
    mulMat(enc, { w: p.w, x: h.x, y: act.gateUp, ids, mmaX: act.mmaX }, {
      ...pm,
      tokens: T,
      norm: h.norm,
      nUsed: Ku,
      gatherTiles: tiles,
      yOffset: p.offset,
      yStrideT: Ku * 2 * Fe,
      yStrideI: 2 * Fe,
    });
  }
  if (!paired) project(enc, w.sharedGateUp, h, act.sharedGateUp, 2 * Fs, { tokens: T });
  const down = { xStrideT: Ku * 2 * Fe, xStrideI: 2 * Fe, upOffset: Fe, swiglu: true };
  const sharedDown = { tokens: T, xStrideT: 2 * Fs, upOffset: Fs, swiglu: true, ...pm };
  if (perSlot) {
    // down of silu(gate)·up per expert; then the shared expert's down, whose epilogue adds
    // Σ weight·expert in rank order + gate·shared to the residual
    mulMat(enc, { w: w.down, x: act.gateUp, ids, y: act.expertOut }, {
      ...down,
      tokens: T,
      nUsed: Ku,
    });
    mulMat(enc, { w: w.sharedDown, x: act.sharedGateUp, y: act.x }, {
      ...sharedDown,
      moeSum: { experts: act.expertOut, weights: act.routeW, k: Ku },
    });
    return;
  }
  // shared expert; down of silu(gate)·up; Σ weight·expert in rank order + gate·shared, residual
  mulMat(
    enc,
    { w: w.sharedDown, x: act.sharedGateUp, y: act.sharedOut, mmaX: act.mmaX },
    sharedDown,
  );
  moeDownSum(enc, {
    w: w.down,
    x: act.gateUp,
    ids,
    weights: act.routeW,
    shared: act.sharedOut,
    o: act.expertOut,
    y: act.x,
    mmaX: act.mmaX,
  }, { ...down, tokens: T, nUsed: Ku, gatherTiles: tiles, ...pm });
}

/** Dense SwiGLU FFN on h, added into x (qwen35). */
function denseBlock(
  enc: StepEncoder,
  plan: ForwardPlan,
  w: DenseWeights,
  h: Normed,
  T: number,
): void {
  const { F } = plan.hp;
  project(enc, w.gateUp, h, plan.act.gateUp, 2 * F, { tokens: T });
  mulMat(enc, { w: w.down, x: plan.act.gateUp, y: plan.act.x, mmaX: plan.act.mmaX }, {
    ...h.pm,
    tokens: T,
    xStrideT: 2 * F,
    upOffset: F,
    swiglu: true,
    add: true,
  });
}

/**
 * Records the owned blocks for the T rows of `seqs` (each sequence's rows at its positions
 * against its slot's state), starting from the token ids in act.ids from `idsOffset` (first
 * stage) or the hidden rows already in act.x. `prompt`: the rows are a prompt's, whose products
 * run on tensor cores where plan.mma says so.
 */
export function encodeLayers(
  enc: StepEncoder,
  plan: ForwardPlan,
  seqs: readonly StepSeq[],
  idsOffset = 0,
  prompt = false,
): void {
  const { act, weights } = plan;
  const pm = productsOf(plan, prompt);
  const T = seqs.reduce((n, s) => n + s.n, 0);
  encodeSeqTable(enc, plan, seqs, 0);
  // 1. embed
  if (weights.embedding && plan.first === 0) {
    getRows(enc, { w: weights.embedding, ids: act.ids, y: act.x }, { tokens: T, idsOffset });
  }
  weights.layers.forEach((lw, i) => encodeBlock(enc, plan, lw, seqs, i, T, pm, 0));
}

/**
 * Records block `lw` on the T rows of act.x, each sequence's rows against its state `il`
 * (seq.states[il]); the sequences' table starts at entry `tableAt` of act.seqs.
 */
export function encodeBlock(
  enc: StepEncoder,
  plan: ForwardPlan,
  lw: LayerWeights,
  seqs: readonly StepSeq[],
  il: number,
  T: number,
  pm: Products,
  tableAt: number,
): void {
  // a. pre-mixer RMSNorm
  const h = normed(enc, plan, lw.attnNorm, T, pm);
  // b, c. token mixer, residual
  if (lw.mixer.kind === "deltanet") deltaNetBlock(enc, plan, lw.mixer, seqs, il, h, T, tableAt);
  else attentionBlock(enc, plan, lw.mixer, seqs, il, h, T, tableAt);
  // d. pre-FFN RMSNorm (post_attention_norm)
  const h2 = normed(enc, plan, lw.postNorm, T, pm);
  // e, f. MoE or dense SwiGLU, residual
  if (lw.ffn.kind === "moe") moeBlock(enc, plan, lw.ffn, h2, T);
  else denseBlock(enc, plan, lw.ffn, h2, T);
}

/** A head row's logit adjustments: words of act.mask and records of act.bias, where they start. */
export interface HeadAdjust {
  readonly maskAt: number;
  readonly words: number;
  readonly biasAt: number;
  readonly pairs: number;
}

/**
 * A row of a step whose logits the last stage computes (a run's last position, or every position
 * of a run that asks for "all"): its greedy id always; with `top`, also the step's top-k and the
 * log-sum-exp of its logits, after its adjustments.
 */
export interface HeadRow {
  /** Its row of act.x. */
  readonly row: number;
  readonly adjust?: HeadAdjust;
  readonly top?: boolean;
}

/** What the last stage's head of a step computes and where its results go. */
export interface StepHead {
  /** The rows, in the order their greedy ids are written. */
  readonly rows: readonly HeadRow[];
  /** Candidates of every top row (1..MAX_TOPK; unused without top rows). */
  readonly topk: number;
  /** Greedy id of rows[i] at element offset + i. */
  readonly greedy: { readonly buffer: GPUBuffer; readonly offset: number };
  /**
   * The top rows' log-sum-exp (default true); false where nothing reads it (a sampled fused step
   * before the last draws from the candidates alone).
   */
  readonly lse?: boolean;
  /** The rows are a prompt's: the LM head runs on tensor cores where plan.mma says so. */
  readonly prompt?: boolean;
}

/** A stage's activation rows (act.x, act.h) as an F32 table, for gathering rows with getRows. */
function rowTable(buffer: GPUBuffer, cols: number): GpuTensor {
  const rows = buffer.size / (4 * cols);
  return {
    name: "activation rows",
    type: GgmlType.F32,
    cols,
    matrixRows: rows,
    experts: 1,
    rowBytes: 4 * cols,
    bytes: buffer.size,
    parts: [{ buffer, firstRow: 0, rows }],
  };
}

/**
 * Records the last stage's head over `head.rows` of a step: output RMSNorm, LM head in chunks of
 * plan.lmChunk rows, each row's adjustments, the greedy id of each row into head.greedy, and the
 * top head.topk and log-sum-exp (unless head.lse is false) of each top row into act.top (the j-th
 * top row's at j·topKWords(topk)). Every row gets the bits it gets alone: rows are gathered (when
 * not one contiguous run of act.x) and normed without reading each other.
 */
export function encodeHead(enc: StepEncoder, plan: ForwardPlan, head: StepHead): void {
  const { hp, act, weights } = plan;
  const { D, V } = hp;
  if (!weights.output || !weights.outputNorm) {
    throw new RangeError("Cannot run the LM head: this stage does not own the last layer");
  }
  const R = head.rows.length;
  if (R === 0) return;
  // The rows' inputs as one contiguous run from `base` of `src`.
  const r0 = head.rows[0].row;
  const contiguous = head.rows.every((h, i) => h.row === r0 + i);
  let src = act.x;
  let base = r0;
  if (!contiguous) {
    enc.upload(act.headRows, 0, Uint32Array.from(head.rows, (h) => h.row));
    getRows(enc, { w: rowTable(act.x, D), ids: act.headRows, y: act.headX }, { tokens: R });
    src = act.headX;
    base = 0;
  }
  // A row or two fold the norm into their products (reading src), else every row is normed into
  // h from row 0; either way with the bits a prefill's normed row gets. Tensor cores never fold.
  const pm = productsOf(plan, !!head.prompt);
  const folded = R <= HEAD_FOLD_MAX_ROWS && !pm.mma;
  if (!folded) {
    rmsNorm(enc, { x: src, w: weights.outputNorm, y: act.h }, {
      n: D,
      rows: R,
      eps: hp.eps,
      xOffset: base * D,
    });
  }
  const tops: number[] = [];
  head.rows.forEach((h, i) => {
    if (h.top) tops.push(i);
  });
  const topAt = new Map(tops.map((i, j) => [i, j]));
  const words = topKWords(head.topk);
  const perDispatch = Math.max(
    1,
    Math.floor(act.topScratch.size / 4 / topKScratchWords(V, head.topk)),
  );
  for (let c0 = 0; c0 < R; c0 += plan.lmChunk) {
    const rows = Math.min(plan.lmChunk, R - c0);
    mulMat(enc, { w: weights.output, x: folded ? src : act.h, y: act.logits, mmaX: act.mmaX }, {
      ...pm,
      tokens: rows,
      norm: folded ? { w: weights.outputNorm, eps: hp.eps } : undefined,
      xOffset: ((folded ? base : 0) + c0) * D,
    });
    // Per row: biases, then the normaliser (the model's distribution), then the grammar's mask,
    // which limits the greedy id and the candidates.
    const logits = { logits: act.logits, mask: act.mask, bias: act.bias };
    const adjusted = (pick: (a: HeadAdjust) => number) =>
      head.rows.slice(c0, c0 + rows).flatMap((h, i) =>
        h.adjust && pick(h.adjust) > 0 ? [{ a: h.adjust, offset: i * V }] : []
      );
    for (const { a, offset } of adjusted((a) => a.pairs)) {
      logitAdjust(enc, logits, { n: V, offset, words: 0, pairs: a.pairs, biasOffset: a.biasAt });
    }
    // The chunk's top rows, in runs of consecutive rows that fit the scratch.
    const runs: { first: number; count: number }[] = [];
    for (let i = c0; i < c0 + rows; i++) {
      if (!head.rows[i].top) continue;
      const last = runs[runs.length - 1];
      if (last && last.first + last.count === i && last.count < perDispatch) last.count++;
      else runs.push({ first: i, count: 1 });
    }
    const top = { src: act.logits, scratch: act.topScratch, out: act.top };
    const rowsOf = (r: { first: number; count: number }) => ({
      n: V,
      k: head.topk,
      offset: (r.first - c0) * V,
      rows: r.count,
      outOffset: topAt.get(r.first)! * words,
      outStride: words,
    });
    if (head.lse !== false) { for (const r of runs) logSumExp(enc, top, rowsOf(r)); }
    for (const { a, offset } of adjusted((a) => a.words)) {
      logitAdjust(enc, logits, {
        n: V,
        offset,
        words: a.words,
        pairs: 0,
        maskOffset: a.maskAt,
      });
    }
    argmax(enc, { src: act.logits, scratch: act.argmaxScratch, out: head.greedy.buffer }, {
      n: V,
      rows,
      outOffset: head.greedy.offset + c0,
    });
    for (const r of runs) topK(enc, top, rowsOf(r));
  }
}
