// The tensor-core products' input pass (wgsl/mma_input.wgsl): activation rows as f16 with a
// power-of-two scale a row, written once per product by engine/gpu/kernels/mul_mat_mma.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";
import type { Defines } from "../wgsl.ts";

/** A variant per input: plain rows, or [gate | up] rows read as silu(gate)·up. */
export const MMA_INPUT: KernelFamily<{ readonly swiglu: boolean }> = {
  file: "mma_input.wgsl",
  variant: (_, v) => {
    const defines: Defines = v.swiglu ? { SWIGLU: true } : {};
    return { name: `mma_input${v.swiglu ? "_swiglu" : ""}`, defines };
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
}

/**
 * Records xh[r] = f16(x_r / s_r) and xscale[r] = s_r for the tokens·ranks rows r = t·ranks + i
 * (k values each; k even).
 */
export function mmaInput(
  enc: StepEncoder,
  b: { readonly x: BufferRef; readonly xh: BufferRef; readonly xscale: BufferRef },
  o: MmaInputOptions,
): void {
  const rows = o.tokens * o.ranks;
  enc.dispatch(MMA_INPUT, { swiglu: o.swiglu }, b, {
    k: o.k,
    rows,
    n_rank: o.ranks,
    x_offset: o.xOffset,
    x_stride_t: o.xStrideT,
    x_stride_i: o.xStrideI,
    up_offset: o.upOffset,
  }, { tiles: rows });
}
