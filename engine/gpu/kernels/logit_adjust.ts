// A run's logit adjustments (engine/stage.ts LogitAdjust) on one logits row on the GPU
// (wgsl/logit_adjust.wgsl): biases and penalties, then the grammar's mask, before argmax and topk.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import { dummyStorage } from "../buffers.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant; `mode` picks the pass. */
export const LOGIT_ADJUST: KernelFamily<void> = {
  file: "logit_adjust.wgsl",
  variant: () => ({ name: "logit_adjust", defines: {} }),
};

const WG = 256;

/**
 * Records, on logits[offset .. offset+n): the `pairs` (id, bias, repeat, subtract) records of
 * `bias` from record biasOffset applied (engine/stage.ts biasLogit), then, when `words` > 0,
 * every token not allowed by the `words`-word mask from word maskOffset set to the masked value.
 */
export function logitAdjust(
  enc: StepEncoder,
  b: { readonly logits: BufferRef; readonly mask?: BufferRef; readonly bias?: BufferRef },
  o: {
    readonly n: number;
    readonly offset: number;
    readonly words: number;
    readonly pairs: number;
    readonly maskOffset?: number;
    readonly biasOffset?: number;
  },
): void {
  const buffers = {
    logits: b.logits,
    mask: b.mask ?? dummyStorage(enc.ctx, 0),
    bias: b.bias ?? dummyStorage(enc.ctx, 1),
  };
  const params = {
    n: o.n,
    offset: o.offset,
    words: o.words,
    pairs: o.pairs,
    mask_offset: o.maskOffset ?? 0,
    bias_offset: o.biasOffset ?? 0,
  };
  if (o.pairs > 0) {
    enc.dispatch(LOGIT_ADJUST, undefined, buffers, { ...params, mode: 0 }, {
      tiles: Math.ceil(o.pairs / WG),
    });
  }
  if (o.words > 0) {
    enc.dispatch(LOGIT_ADJUST, undefined, buffers, { ...params, mode: 1 }, {
      tiles: Math.ceil(o.n / WG),
    });
  }
}
