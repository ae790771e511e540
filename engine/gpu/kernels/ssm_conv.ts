// DeltaNet causal depthwise conv + SiLU with its rolling state (wgsl/ssm_conv.wgsl), the first
// step of a DeltaNet block in engine/gpu/gpu_forward.ts after the input projections.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, Variant } from "../kernel.ts";

/** Tokens a thread walks (wgsl RUN): at least kc − 1, so only the first group reads the state. */
const CONV_RUN = 8;

/**
 * A run of one sequence ("run"), the same keeping its history for a rewind ("trail"), or one
 * token of each of several sequences of a table ("multi").
 */
export const SSM_CONV: KernelFamily<"run" | "trail" | "multi"> = {
  file: "ssm_conv.wgsl",
  variant: (_, how): Variant =>
    how === "multi"
      ? { name: "ssm_conv_multi", defines: { MULTI: true } }
      : how === "trail"
      ? { name: "ssm_conv_trail", defines: { TRAIL: true } }
      : { name: "ssm_conv", defines: {} },
};

/**
 * Where a run keeps what a rewind needs (engine/stage.ts rewindable): a buffer and the float
 * offset of the run's trail in it.
 */
export interface TrailRef {
  readonly buffer: BufferRef;
  readonly offset: number;
}

/**
 * One token of each of `count` sequences, from entry seq0 of a step's sequence table
 * (engine/gpu/gpu_forward.ts): each at its row of x and u, with its state at its index ×
 * stateStride floats of the state buffer. The same bits as a run of each alone.
 */
export interface SequenceTable {
  readonly seqs: BufferRef;
  readonly seq0: number;
  readonly count: number;
  readonly stateStride: number;
}

/**
 * Records u[t] = silu(conv(state ++ x[0..t])) and advances the state (from stateOffset floats)
 * by `tokens` inputs; with `multi`, one token of each sequence of the table instead. With
 * `trail`, also writes the run's history there: (kc − 1 + tokens) rows of `channels`, the old
 * state then each token's input, so the state after token t is its rows t + 1 … t + kc − 1.
 */
export function ssmConv(
  enc: StepEncoder,
  b: {
    readonly x: BufferRef;
    readonly w: BufferRef;
    readonly state: BufferRef;
    readonly u: BufferRef;
  },
  o: {
    readonly channels: number;
    readonly kc: number;
    readonly tokens: number;
    readonly xOffset?: number;
    readonly xStrideT: number;
    /** Where token 0's outputs start in u (default 0). */
    readonly uOffset?: number;
    readonly uStrideT: number;
    readonly stateOffset?: number;
    readonly multi?: SequenceTable;
    readonly trail?: TrailRef;
  },
): void {
  if (o.kc < 2 || o.kc > CONV_RUN + 1) {
    throw new RangeError(
      `Cannot run a conv of ${o.kc} taps: the kernel takes 2 to ${CONV_RUN + 1}`,
    );
  }
  const m = o.multi;
  if (m && o.trail) {
    throw new RangeError("Cannot keep a trail of a table of sequences: run it alone");
  }
  const buffers = m ? { ...b, seqs: m.seqs } : o.trail ? { ...b, trail: o.trail.buffer } : b;
  enc.dispatch(SSM_CONV, m ? "multi" : o.trail ? "trail" : "run", buffers, {
    channels: o.channels,
    kc: o.kc,
    tokens: o.tokens,
    x_offset: o.xOffset ?? 0,
    x_stride_t: o.xStrideT,
    u_offset: o.uOffset ?? 0,
    u_stride_t: o.uStrideT,
    state_offset: o.stateOffset ?? 0,
    state_stride: m?.stateStride ?? 0,
    seq0: m?.seq0 ?? 0,
    trail_offset: o.trail?.offset ?? 0,
  }, { tiles: Math.ceil(o.channels / 64), z: m ? m.count : Math.ceil(o.tokens / CONV_RUN) });
}
