// Causal GQA attention with the sigmoid output gate over the f16 KV cache, split over fixed
// blocks of positions (wgsl/attention.wgsl) and folded per head (wgsl/attention_combine.wgsl),
// for the full-attention blocks of engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, KernelTarget } from "../kernel.ts";
import { attentionCombine } from "./attention_combine.ts";
import type { SequenceTable } from "./ssm_conv.ts";

/**
 * Pass 1, a variant per head dim and tokens a workgroup (TQ): 8 or 4 for calls of several tokens
 * where the device's workgroup memory holds their queries and weights (they share each staged
 * block of K and V), else 1, and 1 for a decode step. Every variant gives a token the same bits
 * (wgsl/attention.wgsl: explicit fma chains in fixed orders).
 */
export const ATTENTION: KernelFamily<
  { readonly dh: number; readonly tq: number; readonly multi?: boolean }
> = {
  file: "attention.wgsl",
  variant: (_, { dh, tq, multi }) => {
    const defines = { DH: dh, B: ATTENTION_BLOCK, TQ: tq, VR: vRows(dh) };
    return multi
      ? { name: `attention_dh${dh}_q${tq}_multi`, defines: { ...defines, MULTI: true as const } }
      : { name: `attention_dh${dh}_q${tq}`, defines };
  },
};

/** Workgroup memory of pass 1 with `tq` tokens a workgroup. */
export function attentionWorkgroupBytes(tq: number): number {
  // Staged K rows (33 words each), then per (token, head) 64 query values, 65 weights (a row of
  // padding) and a max.
  return 4 * (ATTENTION_BLOCK * 33 + tq * HEADS_PER_WORKGROUP * (64 + ATTENTION_BLOCK + 2));
}

/**
 * Tokens a pass-1 workgroup takes (wgsl TQ) in a call of `tokens`: the most of 8 and 4 the call
 * fills and the device's workgroup memory holds (8 needs ~42 KB: the H100's 48 KB, not Mesa's
 * 32), else 1. More tokens a workgroup share each staged block of K and V among more queries.
 */
export function attentionTileTokens(target: KernelTarget, tokens: number): number {
  const fits = (tq: number) =>
    attentionWorkgroupBytes(tq) <= target.limits.maxComputeWorkgroupStorageSize;
  if (tokens >= 8 && fits(8)) return 8;
  return tokens > 1 && fits(4) ? 4 : 1;
}

/**
 * V rows pass 1 stages at once (wgsl VR) in the array that held K's 33-word rows: the most whose
 * words are at most two vec4s a thread, a power of two so that whole rounds tile the block.
 */
function vRows(dh: number): number {
  const fit = Math.min(ATTENTION_BLOCK, Math.floor((ATTENTION_BLOCK * 32) / (dh / 2)));
  return 2 ** Math.floor(Math.log2(fit));
}

/**
 * Positions per block: one workgroup of pass 1 per (token, KV head, block), so a decode step at
 * position p runs ⌈(p+1)/64⌉·Hkv of them. Fixed, never derived from a call's size: a token's
 * blocks must be the same in every grouping of tokens into calls (batch invariance).
 */
export const ATTENTION_BLOCK = 64;
/**
 * Bytes of the partials scratch, unless one token at the last position alone needs more: deep in
 * a long prompt a token's partials take ~8 MB (32768 positions, 16 heads of 256), so this holds
 * ~32 tokens a call there, whole workgroups of 8 (48 MiB held 6: a workgroup of 4 and one of 2).
 */
const PARTIALS_BUDGET_BYTES = 256 * 1024 * 1024;
/** Query heads of one KV head per pass-1 workgroup (wgsl/attention.wgsl GMAX). */
const HEADS_PER_WORKGROUP = 8;

function checkShape(hq: number, hkv: number, dh: number): void {
  if (dh > 256 || dh % 8 !== 0 || dh < 8 || hq % hkv !== 0) {
    throw new RangeError(
      `Cannot attend with ${hq} query heads, ${hkv} KV heads of ${dh}: need dh a multiple of 8 up to 256 and Hq a multiple of Hkv`,
    );
  }
}

/**
 * f32 values of the partials scratch for calls of up to maxBatch tokens within ctx positions:
 * (dh + 2)·max(hq·⌈ctx/64⌉, min(maxBatch·hq·⌈ctx/64⌉, ⌊B / (4·(dh + 2))⌋)), B = 256 MiB or the
 * device's largest storage binding if smaller (the scratch is bound whole: Deno's builtin
 * provider binds 128 MiB at most). Calls that need more are run in token chunks that fit
 * (attention()).
 */
export function attentionPartialFloats(
  o: {
    readonly hq: number;
    readonly dh: number;
    readonly ctx: number;
    readonly maxBatch: number;
    /** The device's maxStorageBufferBindingSize; default unlimited. */
    readonly maxBindingBytes?: number;
  },
): number {
  const perToken = o.hq * Math.ceil(o.ctx / ATTENTION_BLOCK);
  const bytes = Math.min(PARTIALS_BUDGET_BYTES, o.maxBindingBytes ?? Infinity);
  const budget = Math.floor(bytes / (4 * (o.dh + 2)));
  return (o.dh + 2) * Math.max(perToken, Math.min(o.maxBatch * perToken, budget));
}

export interface AttentionOptions {
  readonly tokens: number;
  readonly hq: number;
  readonly hkv: number;
  readonly dh: number;
  /**
   * Position of the first token; token t attends to positions 0 ..= pos0 + t. With `multi`,
   * the largest position of the table's tokens.
   */
  readonly pos0: number;
  /** Where token 0's queries and outputs start in q and o (default 0). */
  readonly qOffset?: number;
  readonly oOffset?: number;
  readonly qStrideT: number;
  readonly qStrideH: number;
  readonly gateOffset: number;
  readonly oStrideT: number;
  /** Where the caches start in kc and vc, u32 words (default 0). */
  readonly kvOffset?: number;
  /**
   * One token of each sequence of the table instead (tokens = its count), at its row of q and
   * o and its position, its caches at its index × stateStride u32 words.
   */
  readonly multi?: SequenceTable;
}

/** u32 words as the vec4s the kernel reads the caches in. */
function vec4s(words: number): number {
  if (words % 4 !== 0) throw new RangeError(`Cannot address the KV cache at word ${words}`);
  return words / 4;
}

/**
 * Records o[t][h] = softmax(q·K/√dh)·V ⊙ sigmoid(gate) for every token and query head: pass 1
 * writes one partial per (token, head, 64-position block) into `part`, pass 2 folds them.
 * Tokens go in chunks whose partials fit `part` (sized by attentionPartialFloats); the chunking
 * changes where partials are stored, never their values.
 */
export function attention(
  enc: StepEncoder,
  b: {
    readonly q: BufferRef;
    readonly kc: BufferRef;
    readonly vc: BufferRef;
    readonly part: BufferRef;
    readonly o: BufferRef;
  },
  o: AttentionOptions,
): void {
  checkShape(o.hq, o.hkv, o.dh);
  const blocksOf = (tokens: number) => Math.ceil((o.pos0 + tokens) / ATTENTION_BLOCK);
  const slots = Math.floor(Number(b.part.size) / (4 * (o.dh + 2)));
  const need = o.hq * blocksOf(o.multi ? 1 : o.tokens);
  const last = o.multi ? o.pos0 : o.pos0 + o.tokens - 1;
  const chunk = Math.min(o.tokens, Math.floor(slots / need));
  if (chunk < 1 && o.tokens > 0) {
    throw new RangeError(
      `Cannot attend at position ${last}: the partials buffer holds ${slots} head-blocks, one token needs ${need}; size it with attentionPartialFloats for this context`,
    );
  }
  const groups = Math.ceil(o.hq / o.hkv / HEADS_PER_WORKGROUP);
  const m = o.multi;
  if (m && m.count !== o.tokens) {
    throw new RangeError(`Cannot attend for ${o.tokens} tokens of ${m.count} sequences: one each`);
  }
  for (let t0 = 0; t0 < o.tokens; t0 += chunk) {
    const tokens = Math.min(chunk, o.tokens - t0);
    // A table's tokens each see up to pos0 (the largest position): blocks past a token's own
    // position exit.
    const nbs = m ? blocksOf(1) : blocksOf(t0 + tokens);
    const tq = m ? 1 : attentionTileTokens(enc.ctx, tokens);
    const buffers: Record<string, BufferRef> = { q: b.q, kc: b.kc, vc: b.vc, part: b.part };
    if (m) buffers.seqs = m.seqs;
    const table = m && { ...m, seq0: m.seq0 + t0, count: tokens };
    enc.dispatch(ATTENTION, { dh: o.dh, tq, multi: !!m }, buffers, {
      hq: o.hq,
      hkv: o.hkv,
      tokens,
      t0: m ? 0 : t0,
      pos0: o.pos0,
      nbs,
      q_offset: o.qOffset ?? 0,
      q_stride_t: o.qStrideT,
      q_stride_h: o.qStrideH,
      scale: 1 / Math.sqrt(o.dh),
      kv_offset: vec4s(o.kvOffset ?? 0),
      kv_stride: m ? vec4s(m.stateStride) : 0,
      seq0: table ? table.seq0 : 0,
    }, { tiles: Math.ceil(tokens / tq) * o.hkv * groups * nbs });
    attentionCombine(enc, { part: b.part, q: b.q, o: b.o }, {
      ...o,
      block: ATTENTION_BLOCK,
      tokens,
      t0: m ? 0 : t0,
      nbs,
      multi: table,
    });
  }
}
