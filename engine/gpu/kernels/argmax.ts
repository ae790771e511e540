// Greedy ids of logits rows on the GPU (wgsl/argmax.wgsl), so decode needs no logits readback.
// Used by the last stage in engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant. */
export const ARGMAX: KernelFamily<void> = {
  file: "argmax.wgsl",
  variant: () => ({ name: "argmax", defines: {} }),
};

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
  enc.dispatch(ARGMAX, undefined, b, {
    n: o.n,
    rows: o.rows,
    stride: o.stride ?? o.n,
    offset: o.offset ?? 0,
    out_offset: o.outOffset ?? 0,
  }, { tiles: o.rows });
}
