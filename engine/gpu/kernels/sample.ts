// A sampled id on the GPU (wgsl/sample.wgsl): engine/sampler.ts's draw from one row's top-k, so a
// whole-model stage feeds each sampled step's id to the next without a readback (decodeFused).

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant. */
export const SAMPLE: KernelFamily<void> = {
  file: "sample.wgsl",
  variant: () => ({ name: "sample", defines: {} }),
};

/**
 * Records out[outOffset] = the id drawn from the top-k pairs at top[topOffset..] with the
 * constants at draws[drawsOffset..] (samplerWords) and the draw after them at `draw`; where every
 * candidate is banned out keeps what it held (the argmax's id).
 */
export function sample(
  enc: StepEncoder,
  b: { readonly top: BufferRef; readonly draws: BufferRef; readonly out: BufferRef },
  o: {
    readonly topOffset: number;
    readonly drawsOffset: number;
    readonly draw: number;
    readonly outOffset: number;
  },
): void {
  enc.dispatch(SAMPLE, undefined, b, {
    top_offset: o.topOffset,
    draws_offset: o.drawsOffset,
    draw: o.draw,
    out_offset: o.outOffset,
  }, { tiles: 1 });
}
