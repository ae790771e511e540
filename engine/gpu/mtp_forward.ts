// The MTP block on the GPU (docs/model_arch.md §3.6): the pass over a step's rows that keeps its
// KV cache filled, and the chain of greedy drafts from it. Recorded by engine/gpu/gpu_stage.ts.
//
// The block's position q pairs the hidden state at q with the token at q + 1 (vLLM's indexing,
// as engine/reference/reference_forward.ts mtpStep): a run of positions [base, base + n) fills
// its positions base − 1 … base + n − 2, and a draft from position P runs at P − 1 onwards.

import type { StepEncoder } from "./encoder.ts";
import { argmax } from "./kernels/argmax.ts";
import { getRows } from "./kernels/get_rows.ts";
import { mulMat } from "./kernels/mul_mat.ts";
import { rmsNorm } from "./kernels/rms_norm.ts";
import {
  encodeBlock,
  encodeSeqTable,
  type ForwardPlan,
  type GpuLayerState,
  type StepSeq,
} from "./gpu_forward.ts";
import type { MtpWeights } from "./gpu_weights.ts";

/** What the MTP block runs with besides the stage's own weights and activations. */
export interface MtpPlan {
  readonly weights: MtpWeights;
  /** Where a sequence's states hold the block's KV cache (after the stage's layers). */
  readonly state: number;
  /**
   * Per slot, the output-normed rows of its last run's last `rows` positions, (slots·rows, D)
   * f32: the hidden state the next run's first row and a draft start from.
   */
  readonly store: GPUBuffer;
  readonly rows: number;
  /** (T, D) f32 scratch: each row's hidden state before it, then its token's embedding. */
  readonly before: GPUBuffer;
  /** (T, 2·D) f32: [enorm(embedding) | hnorm(hidden)] of each row, eh_proj's input. */
  readonly join: GPUBuffer;
}

/** A run of a step, for the MTP pass after it. */
export interface MtpRun {
  readonly seq: StepSeq;
  readonly slot: number;
  /** The store's row holding the hidden state at seq.base − 1, or −1 where the slot lacks it. */
  readonly before: number;
}

/**
 * The MTP block over a step's rows, recorded after its head (act.x holds the last layer's rows
 * and act.ids, from `idsOffset`, their tokens): each row's token with the output-normed row
 * before it, filling the block's KV cache; then each run's last rows are kept in the store. A
 * run's first row without the hidden state before it (position 0, or after a restore) is
 * skipped.
 */
export function encodeMtpPass(
  enc: StepEncoder,
  plan: ForwardPlan,
  mtp: MtpPlan,
  runs: readonly MtpRun[],
  idsOffset = 0,
): void {
  const { hp, act } = plan;
  const { D, eps } = hp;
  const norm = outputNorm(plan);
  const T = runs.reduce((n, r) => n + r.seq.n, 0);
  const seqs = runs.flatMap((r): StepSeq[] => {
    const skip = r.before < 0 ? 1 : 0;
    const n = r.seq.n - skip;
    const seq = { states: r.seq.states, base: r.seq.base - 1 + skip, row: r.seq.row + skip, n };
    return n > 0 ? [seq] : [];
  });
  if (seqs.length > 0) {
    // Row t's hidden state is row t − 1's output, normed; a run's first row reads its slot's.
    if (T > 1) {
      rmsNorm(enc, { x: act.x, w: norm, y: mtp.before }, { n: D, rows: T - 1, eps, yOffset: D });
    }
    for (const r of runs) {
      if (r.before >= 0) {
        enc.copy(mtp.store, 4 * D * r.before, mtp.before, 4 * D * r.seq.row, 4 * D);
      }
    }
  }
  // Each run's last rows, normed, for the slot's next run and drafts (before act.x is rewritten).
  for (const r of runs) {
    const m = Math.min(r.seq.n, mtp.rows);
    rmsNorm(enc, { x: act.x, w: norm, y: mtp.store }, {
      n: D,
      rows: m,
      eps,
      xOffset: (r.seq.row + r.seq.n - m) * D,
      yOffset: r.slot * mtp.rows * D,
    });
  }
  if (seqs.length === 0) return;
  encodeJoin(enc, plan, mtp, T, idsOffset);
  encodeSeqTable(enc, plan, seqs, runs.length);
  encodeBlock(enc, plan, mtp.weights.layer, seqs, mtp.state, T, {}, runs.length);
}

/**
 * `k` greedy drafts of a slot at position `pos` whose next token is act.ids[0]: step i embeds
 * act.ids[i] with the hidden state before it (the store's row `before` for the first, the step
 * before's shared_head_norm output after), runs the block at pos − 1 + i and writes the argmax
 * of the LM head on its normed output to act.ids[i + 1].
 */
export function encodeMtpDrafts(
  enc: StepEncoder,
  plan: ForwardPlan,
  mtp: MtpPlan,
  states: readonly GpuLayerState[],
  draft: { readonly before: number; readonly pos: number; readonly k: number },
): void {
  const { hp, act, weights } = plan;
  const { D, V, eps } = hp;
  if (!weights.output) {
    throw new RangeError("Cannot draft with the MTP block: this stage does not own the LM head");
  }
  enc.copy(mtp.store, 4 * D * draft.before, mtp.before, 0, 4 * D);
  for (let i = 0; i < draft.k; i++) {
    encodeJoin(enc, plan, mtp, 1, i);
    const seq = { states, base: draft.pos - 1 + i, row: 0, n: 1 };
    encodeBlock(enc, plan, mtp.weights.layer, [seq], mtp.state, 1, {}, 0);
    rmsNorm(enc, { x: act.x, w: mtp.weights.headNorm, y: mtp.before }, { n: D, rows: 1, eps });
    mulMat(enc, { w: weights.output, x: mtp.before, y: act.logits }, { tokens: 1 });
    argmax(enc, { src: act.logits, scratch: act.argmaxScratch, out: act.ids }, {
      n: V,
      rows: 1,
      outOffset: i + 1,
    });
  }
}

/**
 * eh_proj([enorm(embedding) | hnorm(hidden)]) of T rows into act.x: the hidden states from
 * mtp.before, the tokens from act.ids at `idsOffset`.
 */
function encodeJoin(
  enc: StepEncoder,
  plan: ForwardPlan,
  mtp: MtpPlan,
  T: number,
  idsOffset: number,
): void {
  const { hp, act, weights } = plan;
  const { D, eps } = hp;
  if (!weights.embedding) {
    throw new RangeError("Cannot run the MTP block: this stage holds no token embedding");
  }
  const w = mtp.weights;
  rmsNorm(enc, { x: mtp.before, w: w.hnorm, y: mtp.join }, {
    n: D,
    rows: T,
    eps,
    yOffset: D,
    yStride: 2 * D,
  });
  getRows(enc, { w: weights.embedding, ids: act.ids, y: mtp.before }, { tokens: T, idsOffset });
  rmsNorm(enc, { x: mtp.before, w: w.enorm, y: mtp.join }, { n: D, rows: T, eps, yStride: 2 * D });
  mulMat(enc, { w: w.ehProj, x: mtp.join, y: act.x, mmaX: act.mmaX }, { tokens: T });
}

function outputNorm(plan: ForwardPlan): GPUBuffer {
  const norm = plan.weights.outputNorm;
  if (!norm) {
    throw new RangeError("Cannot run the MTP block: this stage does not own the last layer");
  }
  return norm;
}
