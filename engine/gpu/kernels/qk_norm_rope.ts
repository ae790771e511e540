// Per-head q/k RMSNorm + partial RoPE (wgsl/qk_norm_rope.wgsl) of the attention blocks in
// engine/gpu/gpu_forward.ts, in one dispatch: q in place, k (with v) stored as f16 into the
// layer's KV cache.

import type { BufferRef } from "../buffers.ts";
import { dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, Variant } from "../kernel.ts";
import type { SequenceTable } from "./ssm_conv.ts";

/** A run of one sequence, or (multi) one token of each of several sequences of a table. */
export const QK_NORM_ROPE: KernelFamily<boolean> = {
  file: "qk_norm_rope.wgsl",
  variant: (_, multi): Variant =>
    multi
      ? { name: "qk_norm_rope_multi", defines: { MULTI: true } }
      : { name: "qk_norm_rope", defines: {} },
};

/** Head geometry and rotation of one call. Positions are pos0 + t. */
export interface QkNormRopeOptions {
  readonly tokens: number;
  readonly dh: number;
  readonly nRot: number;
  /** powf(base, −2/nRot) in f32 (engine/reference/rope.ts ropeThetaScale). */
  readonly thetaScale: number;
  /** IMROPE sections ([] for NEOX). */
  readonly sections: readonly number[];
  readonly eps: number;
  readonly pos0: number;
  /** Token t's row starts at xOffset + t·xStrideT (xOffset default 0). */
  readonly xOffset?: number;
  readonly xStrideT: number;
  /** q heads at h·strideH of the row, rotated in place. */
  readonly q?: { readonly heads: number; readonly strideH: number };
  /** k heads at offset + h·strideH, stored with their v heads (at vOffset + h·strideH). */
  readonly k?: {
    readonly heads: number;
    readonly offset: number;
    readonly strideH: number;
    readonly vOffset: number;
  };
  /** Where the caches start in kc and vc, u32 words (default 0). */
  readonly kvOffset?: number;
  /**
   * One token of each sequence of the table instead (tokens = its count), at its row and
   * position, its caches at its index × stateStride words.
   */
  readonly multi?: SequenceTable;
}

/**
 * Records norm + RoPE of every q head of x in place and of every k head, stored with its v head
 * as f16 into the caches at positions pos0 + t.
 */
export function qkNormRope(
  enc: StepEncoder,
  b: {
    readonly x: BufferRef;
    readonly wq?: BufferRef;
    readonly wk?: BufferRef;
    readonly kc?: BufferRef;
    readonly vc?: BufferRef;
  },
  o: QkNormRopeOptions,
): void {
  if (o.dh > 512 || o.dh % 2 !== 0 || o.nRot > o.dh) {
    throw new RangeError(
      `Cannot rotate heads of ${o.dh} values with ${o.nRot} rotated: the kernel takes even head sizes up to 512`,
    );
  }
  const s = o.sections;
  const qHeads = o.q?.heads ?? 0;
  const kHeads = o.k?.heads ?? 0;
  const m = o.multi;
  if (m && m.count !== o.tokens) {
    throw new RangeError(`Cannot rotate ${o.tokens} tokens of ${m.count} sequences: one each`);
  }
  const buffers: Record<string, BufferRef> = {
    x: b.x,
    wq: b.wq ?? dummyStorage(enc.ctx),
    wk: b.wk ?? dummyStorage(enc.ctx),
    kc: b.kc ?? dummyStorage(enc.ctx, 1),
    vc: b.vc ?? dummyStorage(enc.ctx, 2),
  };
  if (m) buffers.seqs = m.seqs;
  enc.dispatch(QK_NORM_ROPE, !!m, buffers, {
    dh: o.dh,
    n_rot: o.nRot,
    q_heads: qHeads,
    k_heads: kHeads,
    tokens: o.tokens,
    x_offset: o.xOffset ?? 0,
    x_stride_t: o.xStrideT,
    q_stride_h: o.q?.strideH ?? 0,
    k_offset: o.k?.offset ?? 0,
    k_stride_h: o.k?.strideH ?? 0,
    v_offset: o.k?.vOffset ?? 0,
    pos0: o.pos0,
    sect0: s[0] ?? 0,
    sect1: s[1] ?? 0,
    sect2: s[2] ?? 0,
    sect3: s[3] ?? 0,
    theta_scale: o.thetaScale,
    eps: o.eps,
    kv_offset: o.kvOffset ?? 0,
    kv_stride: m?.stateStride ?? 0,
    seq0: m?.seq0 ?? 0,
  }, { tiles: o.tokens * (qHeads + kHeads) });
}
