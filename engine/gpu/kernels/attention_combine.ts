// Pass 2 of the GQA attention of engine/gpu/kernels/attention.ts (wgsl/attention_combine.wgsl):
// folds the 64-position block partials of each (token, query head) and applies the output gate.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, Variant } from "../kernel.ts";
import type { SequenceTable } from "./ssm_conv.ts";

/** A variant per head dim and block length (pass 1's); `multi` takes a table's tokens. */
export const ATTENTION_COMBINE: KernelFamily<
  { readonly dh: number; readonly block: number; readonly multi?: boolean }
> = {
  file: "attention_combine.wgsl",
  variant: (_, { dh, block, multi }): Variant => {
    const name = `attention_combine_dh${dh}_b${block}`;
    return multi
      ? { name: `${name}_multi`, defines: { DH: dh, B: block, MULTI: true } }
      : { name, defines: { DH: dh, B: block } };
  },
};

/** Dims per run of a workgroup (wgsl/attention_combine.wgsl DC). */
const COMBINE_DIMS = 16;
/**
 * Workgroups wanted per call. Below this a workgroup folds one run of dims (decode); above, it
 * folds several, so the per-head max and sum are not redone for every 16 dims. The runs per
 * workgroup change no arithmetic, only which workgroup does it.
 */
const COMBINE_WORKGROUPS = 2048;

/**
 * Records o[t][h] = (Σ_b acc_b·e^(m_b − M) / Σ_b l_b·e^(m_b − M)) ⊙ sigmoid(gate) for tokens
 * t0 .. t0+tokens of one pass-1 call, whose partials (nbs blocks a head) are in `part`.
 */
export function attentionCombine(
  enc: StepEncoder,
  b: { readonly part: BufferRef; readonly q: BufferRef; readonly o: BufferRef },
  o: {
    readonly dh: number;
    /** Positions per block of pass 1. */
    readonly block: number;
    readonly hq: number;
    readonly tokens: number;
    readonly t0: number;
    readonly pos0: number;
    readonly nbs: number;
    readonly qOffset?: number;
    readonly oOffset?: number;
    readonly qStrideT: number;
    readonly qStrideH: number;
    readonly gateOffset: number;
    readonly oStrideT: number;
    /** Pass 1's table: token tl is the one token of entry seq0 + tl, at its row and position. */
    readonly multi?: SequenceTable;
  },
): void {
  const runs = Math.ceil(o.dh / COMBINE_DIMS);
  const dcs = Math.min(runs, Math.max(1, Math.floor(o.tokens * o.hq * runs / COMBINE_WORKGROUPS)));
  const m = o.multi;
  const buffers: Record<string, BufferRef> = m ? { ...b, seqs: m.seqs } : b;
  enc.dispatch(ATTENTION_COMBINE, { dh: o.dh, block: o.block, multi: !!m }, buffers, {
    hq: o.hq,
    tokens: o.tokens,
    t0: o.t0,
    pos0: o.pos0,
    nbs: o.nbs,
    q_offset: o.qOffset ?? 0,
    q_stride_t: o.qStrideT,
    q_stride_h: o.qStrideH,
    gate_offset: o.gateOffset,
    o_offset: o.oOffset ?? 0,
    o_stride_t: o.oStrideT,
    dcs,
    seq0: m?.seq0 ?? 0,
  }, { tiles: o.tokens * o.hq * Math.ceil(runs / dcs) });
}
