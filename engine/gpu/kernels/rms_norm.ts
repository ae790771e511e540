// RMSNorm of rows (wgsl/rms_norm.wgsl): the pre-mixer, pre-FFN and output norms of engine/gpu/gpu_forward.ts.
// y = x·1/√(mean(x²)+ε)·w per row of n values.

import type { BufferRef } from "../buffers.ts";
import type { GpuContext } from "../device.ts";
import type { StepEncoder } from "../encoder.ts";
import { getKernel, type KernelLayout, readyKernel } from "../kernel.ts";

export const RMS_NORM: KernelLayout = {
  file: "rms_norm.wgsl",
  bindings: [["x", "read"], ["w", "read"], ["y", "read_write"]],
  params: [
    ["n", "u32"],
    ["rows", "u32"],
    ["x_offset", "u32"],
    ["x_stride", "u32"],
    ["y_offset", "u32"],
    ["y_stride", "u32"],
    ["eps", "f32"],
  ],
};

export async function prepareRmsNorm(ctx: GpuContext): Promise<void> {
  await getKernel(ctx, RMS_NORM, "rms_norm", {});
}

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
  enc.dispatch(readyKernel(enc.ctx, "rms_norm"), b, {
    n: o.n,
    rows: o.rows,
    x_offset: o.xOffset ?? 0,
    x_stride: o.xStride ?? o.n,
    y_offset: o.yOffset ?? 0,
    y_stride: o.yStride ?? o.n,
    eps: o.eps,
  }, { tiles: o.rows });
}
