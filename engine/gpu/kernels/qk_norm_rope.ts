// Per-head q/k RMSNorm + partial RoPE (wgsl/qk_norm_rope.wgsl) of the attention blocks in
// engine/gpu/gpu_forward.ts: q in place, k (with v) stored as f16 into the layer's KV cache.

import type { BufferRef } from "../buffers.ts";
import { dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant; `store` picks q in place or k (with v) into the cache. */
export const QK_NORM_ROPE: KernelFamily<void> = {
  file: "qk_norm_rope.wgsl",
  variant: () => ({ name: "qk_norm_rope", defines: {} }),
};

/** Head geometry and rotation of one call. Positions are pos0 + t. */
export interface QkNormRopeOptions {
  readonly tokens: number;
  readonly heads: number;
  readonly dh: number;
  readonly nRot: number;
  /** powf(base, −2/nRot) in f32 (engine/reference/rope.ts ropeThetaScale). */
  readonly thetaScale: number;
  /** IMROPE sections ([] for NEOX). */
  readonly sections: readonly number[];
  readonly eps: number;
  readonly pos0: number;
  readonly xOffset?: number;
  readonly xStrideT: number;
  readonly xStrideH: number;
}

function params(o: QkNormRopeOptions, store: boolean, vOffset: number): Record<string, number> {
  if (o.dh > 512 || o.dh % 2 !== 0 || o.nRot > o.dh) {
    throw new RangeError(
      `Cannot rotate heads of ${o.dh} values with ${o.nRot} rotated: the kernel takes even head sizes up to 512`,
    );
  }
  const s = o.sections;
  return {
    dh: o.dh,
    n_rot: o.nRot,
    heads: o.heads,
    tokens: o.tokens,
    x_offset: o.xOffset ?? 0,
    x_stride_t: o.xStrideT,
    x_stride_h: o.xStrideH,
    v_offset: vOffset,
    pos0: o.pos0,
    store: store ? 1 : 0,
    sect0: s[0] ?? 0,
    sect1: s[1] ?? 0,
    sect2: s[2] ?? 0,
    sect3: s[3] ?? 0,
    theta_scale: o.thetaScale,
    eps: o.eps,
  };
}

/** Records in-place norm + RoPE of every q head in x. */
export function qNormRope(
  enc: StepEncoder,
  b: { readonly x: BufferRef; readonly w: BufferRef },
  o: QkNormRopeOptions,
): void {
  const kc = dummyStorage(enc.ctx, 0);
  const vc = dummyStorage(enc.ctx, 1);
  enc.dispatch(QK_NORM_ROPE, undefined, { ...b, kc, vc }, params(o, false, 0), {
    tiles: o.tokens * o.heads,
  });
}

/**
 * Records norm + RoPE of every k head in x and stores it, with the v head at vOffset (same
 * strides), as f16 into the caches at positions pos0 + t.
 */
export function kNormRopeStore(
  enc: StepEncoder,
  b: {
    readonly x: BufferRef;
    readonly w: BufferRef;
    readonly kc: BufferRef;
    readonly vc: BufferRef;
  },
  o: QkNormRopeOptions & { readonly vOffset: number },
): void {
  enc.dispatch(QK_NORM_ROPE, undefined, b, params(o, true, o.vOffset), {
    tiles: o.tokens * o.heads,
  });
}
