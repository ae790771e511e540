// The tensor-core products' input pass (wgsl/mma_input.wgsl): activation rows as f16 pairs (hi +
// lo) with a power-of-two scale a row, written once per product by engine/gpu/kernels/mul_mat_mma.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** An input pass: plain rows or [gate | up] rows read as silu(gate)·up; hi + lo, or hi alone. */
export interface MmaInputKey {
  readonly swiglu: boolean;
  /** Each value as hi + lo (the engine's products), or rounded to one f16 (MmaPrecision "f16"). */
  readonly split: boolean;
}

/** A variant per input and precision. */
export const MMA_INPUT: KernelFamily<MmaInputKey> = {
  file: "mma_input.wgsl",
  variant: (_, v) => {
    const defines: Record<string, true> = {};
    if (v.swiglu) defines.SWIGLU = true;
    if (v.split) defines.SPLIT = true;
    const name = `mma_input${v.swiglu ? "_swiglu" : ""}${v.split ? "" : "_f16"}`;
    return { name, defines };
  },
};

/** Where a product's input rows sit, in f32 elements (MulMatOptions' fields). */
export interface MmaInputOptions {
  readonly k: number;
  readonly tokens: number;
  /** Rows a token: 1, or an expert stack's nUsed when each rank has its own input row. */
  readonly ranks: number;
  readonly xOffset: number;
  readonly xStrideT: number;
  readonly xStrideI: number;
  readonly swiglu: boolean;
  readonly upOffset: number;
  readonly split: boolean;
}

/**
 * Records xscale[r] = s_r and xh[r] = x_r / s_r as f16 (hi and lo chunk by chunk, or hi alone) for
 * the tokens·ranks rows r = t·ranks + i (k values each; k a multiple of 32).
 */
export function mmaInput(
  enc: StepEncoder,
  b: { readonly x: BufferRef; readonly xh: BufferRef; readonly xscale: BufferRef },
  o: MmaInputOptions,
): void {
  const rows = o.tokens * o.ranks;
  enc.dispatch(MMA_INPUT, { swiglu: o.swiglu, split: o.split }, b, {
    k: o.k,
    rows,
    n_rank: o.ranks,
    x_offset: o.xOffset,
    x_stride_t: o.xStrideT,
    x_stride_i: o.xStrideI,
    up_offset: o.upOffset,
  }, { tiles: rows });
}
