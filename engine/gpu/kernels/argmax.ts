// Greedy ids of logits rows on the GPU (wgsl/argmax.wgsl), so decode needs no logits readback.
// Used by the last stage in engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { GpuContext } from "../device.ts";
import type { StepEncoder } from "../encoder.ts";
import { getKernel, type KernelLayout, readyKernel } from "../kernel.ts";

export const ARGMAX: KernelLayout = {
  file: "argmax.wgsl",
  bindings: [["src", "read"], ["out", "read_write"]],
  params: [["n", "u32"], ["rows", "u32"], ["stride", "u32"], ["offset", "u32"], [
    "out_offset",
    "u32",
  ]],
};

export async function prepareArgmax(ctx: GpuContext): Promise<void> {
  await getKernel(ctx, ARGMAX, "argmax", {});
}

/** Records out[outOffset + r] = argmax of row r (n values; ties: lower id) for r < rows. */
export function argmax(
  enc: StepEncoder,
  b: { readonly src: BufferRef; readonly out: BufferRef },
  o: {
    readonly n: number;
    readonly rows: number;
    readonly stride?: number;
    readonly offset?: number;
    readonly outOffset?: number;
  },
): void {
  enc.dispatch(readyKernel(enc.ctx, "argmax"), b, {
    n: o.n,
    rows: o.rows,
    stride: o.stride ?? o.n,
    offset: o.offset ?? 0,
    out_offset: o.outOffset ?? 0,
  }, { tiles: o.rows });
}
