// RMSNorm of rows (wgsl/rms_norm.wgsl): the pre-mixer, pre-FFN and output norms of engine/gpu/gpu_forward.ts.
// y = x·1/√(mean(x²)+ε)·w per row of n values.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant. */
export const RMS_NORM: KernelFamily<void> = {
  file: "rms_norm.wgsl",
  variant: () => ({ name: "rms_norm", defines: {} }),
};

export interface RmsNormOptions {
  readonly n: number;
  readonly rows: number;
  readonly eps: number;
  readonly xOffset?: number;
  readonly xStride?: number;
  readonly yOffset?: number;
  readonly yStride?: number;
}

/** Records y[r] = RMSNorm(x[r])·w for `rows` rows (x and y distinct buffers). */
export function rmsNorm(
  enc: StepEncoder,
  b: { readonly x: BufferRef; readonly w: BufferRef; readonly y: BufferRef },
  o: RmsNormOptions,
): void {
  enc.dispatch(RMS_NORM, undefined, b, {
    n: o.n,
    rows: o.rows,
    x_offset: o.xOffset ?? 0,
    x_stride: o.xStride ?? o.n,
    y_offset: o.yOffset ?? 0,
    y_stride: o.yStride ?? o.n,
    eps: o.eps,
  }, { tiles: o.rows });
}
