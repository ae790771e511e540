// The DeltaNet recurrence + gated output norm (wgsl/gated_delta_net.wgsl) for single tokens and
// prefill runs: the core of a DeltaNet block in engine/gpu/gpu_forward.ts.
//
// Dimensions: Nk/Nv key/value heads, Dk/Dv their head dims; Dv·R threads per workgroup, R the
// row slices each state column is split into (up to 8, as the device's workgroup size allows).

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, KernelTarget } from "../kernel.ts";
import type { SequenceTable, TrailRef } from "./ssm_conv.ts";

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

/**
 * Columns of a head one workgroup of a prefill run takes (wgsl COLS): a head's columns spread over
 * dv/32 SMs instead of one. A one-token step keeps the head in one workgroup, which also applies
 * the output norm, so it stays one dispatch.
 */
const SPLIT_COLS = 32;
/** Threads of the NORM_PASS workgroup (wgsl WG). */
const NORM_WG = 256;

/** What a dispatch runs: a whole step (one workgroup a head), a split recurrence, or the norm. */
export type DeltaNetPass = "fused" | "split" | "norm";

/**
 * A variant per head shape dk × dv and pass; `multi` (fused only) runs a table of sequences,
 * `trail` (fused or split, alone) keeps the state after each token for a rewind.
 */
export const GATED_DELTA_NET: KernelFamily<
  {
    readonly dk: number;
    readonly dv: number;
    readonly pass?: DeltaNetPass;
    readonly multi?: boolean;
    readonly trail?: boolean;
  }
> = {
  file: "gated_delta_net.wgsl",
  variant: (target, { dk, dv, pass = "fused", multi = false, trail = false }) => {
    if ((dv & (dv - 1)) !== 0 || dv > 256 || dk > 256 || dk < 4 || dk % 4 !== 0) {
      throw new RangeError(
        `Cannot run DeltaNet heads of ${dk} x ${dv}: value heads must be a power of two ≤ 256, key heads a multiple of 4 up to 256`,
      );
    }
    // The fused and split recurrences sum a column's slices alike only with the same R.
    const r = rowSlices(target, dk, dv);
    const kept = trail && pass !== "norm" && !multi;
    const base = {
      DK: dk,
      DV: dv,
      R: r,
      GS: Math.min(16, dv),
      ...(kept ? { TRAIL: true as const } : {}),
    };
    const name = `gated_delta_net_dk${dk}_dv${dv}_r${r}${kept ? "_trail" : ""}`;
    if (pass === "norm") {
      return { name: `${name}_norm`, defines: { ...base, COLS: dv, NORM_PASS: true } };
    }
    if (pass === "split") {
      const cols = Math.min(SPLIT_COLS, dv);
      return { name: `${name}_c${cols}`, defines: { ...base, COLS: cols } };
    }
    const fused = { ...base, COLS: dv, NORM_FUSED: true as const };
    return multi
      ? { name: `${name}_multi`, defines: { ...fused, MULTI: true } }
      : { name, defines: fused };
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
  /** Where token 0's conv outputs start in u (default 0). */
  readonly uOffset?: number;
  readonly uStrideT: number;
  readonly baOffset?: number;
  readonly baStrideT: number;
  readonly zOffset: number;
  readonly zStrideT: number;
  /** Where token 0's outputs start in y (default 0). */
  readonly yOffset?: number;
  readonly yStrideT: number;
  readonly eps: number;
  /** Where the state starts in `state`, floats (default 0). */
  readonly stateOffset?: number;
  /**
   * The sequences of a table instead, each its tokens from its row, in one dispatch (fused: each
   * a whole head a workgroup); offsets and strides above are then of row 0.
   */
  readonly multi?: SequenceTable;
  /** Keeps the state after each token there, (tokens, nv, dk, dv) floats (not with `multi`). */
  readonly trail?: TrailRef;
}

/** Whether a run of `tokens` takes the one-dispatch recurrence (a whole head a workgroup). */
export function fusedDeltaNet(tokens: number, dv: number): boolean {
  return tokens === 1 || dv <= SPLIT_COLS;
}

/**
 * Records the recurrence over `tokens` tokens for every value head, updating the state: one
 * dispatch for one token, else the column-split recurrence and then the output norm. With
 * `multi`, one dispatch for the table's sequences, each of which must be fusedDeltaNet.
 */
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
  const params = {
    nk: o.nk,
    nv: o.nv,
    tokens: o.tokens,
    interleave: o.interleave ? 1 : 0,
    u_offset: o.uOffset ?? 0,
    u_stride_t: o.uStrideT,
    ba_offset: o.baOffset ?? 0,
    ba_stride_t: o.baStrideT,
    z_offset: o.zOffset,
    z_stride_t: o.zStrideT,
    y_offset: o.yOffset ?? 0,
    y_stride_t: o.yStrideT,
    eps: o.eps,
    state_offset: o.stateOffset ?? 0,
    state_stride: o.multi?.stateStride ?? 0,
    seq0: o.multi?.seq0 ?? 0,
    trail_offset: o.trail?.offset ?? 0,
  };
  const m = o.multi;
  if (m && o.trail) {
    throw new RangeError("Cannot keep a trail of a table of sequences: run it alone");
  }
  const shape = { dk: o.dk, dv: o.dv, trail: !!o.trail };
  const kept = o.trail ? { ...b, trail: o.trail.buffer } : b;
  if (m) {
    enc.dispatch(
      GATED_DELTA_NET,
      { dk: o.dk, dv: o.dv, multi: true },
      { ...b, seqs: m.seqs },
      params,
      {
        tiles: o.nv,
        z: m.count,
      },
    );
    return;
  }
  if (fusedDeltaNet(o.tokens, o.dv)) {
    enc.dispatch(GATED_DELTA_NET, shape, kept, params, { tiles: o.nv });
    return;
  }
  enc.dispatch(GATED_DELTA_NET, { ...shape, pass: "split" }, kept, params, {
    tiles: o.nv * (o.dv / SPLIT_COLS),
  });
  // NP: the tokens of a norm workgroup, GS columns a thread of each.
  const np = NORM_WG / (o.dv / Math.min(16, o.dv));
  enc.dispatch(GATED_DELTA_NET, { dk: o.dk, dv: o.dv, pass: "norm" }, b, params, {
    tiles: o.nv,
    z: Math.ceil(o.tokens / np),
  });
}
