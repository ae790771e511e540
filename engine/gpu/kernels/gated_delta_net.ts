// The DeltaNet recurrence + gated output norm (wgsl/gated_delta_net.wgsl) for single tokens and
// prefill runs: the core of a DeltaNet block in engine/gpu/gpu_forward.ts.
//
// Dimensions: Nk/Nv key/value heads, Dk/Dv their head dims; Dv·R threads per workgroup, R the
// row slices each state column is split into (up to 8, as the device's workgroup size allows).

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, KernelTarget } from "../kernel.ts";

/**
 * Row slices per column: the most (≤ 8, each slice a whole number of vec4 rows) that fit the
 * device's workgroup size.
 */
function rowSlices(target: KernelTarget, dk: number, dv: number): number {
  let r = 8;
  while (
    r > 1 && (dv * r > target.limits.maxComputeInvocationsPerWorkgroup || dk % (4 * r) !== 0)
  ) {
    r /= 2;
  }
  return r;
}

/** A variant per head shape dk × dv (dv a power of two up to 256). */
export const GATED_DELTA_NET: KernelFamily<{ readonly dk: number; readonly dv: number }> = {
  file: "gated_delta_net.wgsl",
  variant: (target, { dk, dv }) => {
    if ((dv & (dv - 1)) !== 0 || dv > 256 || dk > 256 || dk < 4 || dk % 4 !== 0) {
      throw new RangeError(
        `Cannot run DeltaNet heads of ${dk} x ${dv}: value heads must be a power of two ≤ 256, key heads a multiple of 4 up to 256`,
      );
    }
    const r = rowSlices(target, dk, dv);
    return {
      name: `gated_delta_net_dk${dk}_dv${dv}_r${r}`,
      defines: { DK: dk, DV: dv, R: r, GS: Math.min(16, dv) },
    };
  },
};

export interface GatedDeltaNetOptions {
  readonly nk: number;
  readonly nv: number;
  readonly dk: number;
  readonly dv: number;
  readonly tokens: number;
  /** Value head h reads key head ⌊h/(Nv/Nk)⌋ (qwen3next) instead of h mod Nk (qwen35*). */
  readonly interleave: boolean;
  readonly uStrideT: number;
  readonly baOffset?: number;
  readonly baStrideT: number;
  readonly zOffset: number;
  readonly zStrideT: number;
  readonly yStrideT: number;
  readonly eps: number;
}

/** Records the recurrence over `tokens` tokens for every value head, updating the state. */
export function gatedDeltaNet(
  enc: StepEncoder,
  b: {
    readonly u: BufferRef;
    readonly ba: BufferRef;
    readonly z: BufferRef;
    readonly p: BufferRef;
    readonly state: BufferRef;
    readonly y: BufferRef;
  },
  o: GatedDeltaNetOptions,
): void {
  enc.dispatch(GATED_DELTA_NET, { dk: o.dk, dv: o.dv }, b, {
    nk: o.nk,
    nv: o.nv,
    tokens: o.tokens,
    interleave: o.interleave ? 1 : 0,
    u_stride_t: o.uStrideT,
    ba_offset: o.baOffset ?? 0,
    ba_stride_t: o.baStrideT,
    z_offset: o.zOffset,
    z_stride_t: o.zStrideT,
    y_stride_t: o.yStrideT,
    eps: o.eps,
  }, { tiles: o.nv });
}
