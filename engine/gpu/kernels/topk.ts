// Top-k (id, logit) and the log-sum-exp of one logits row on the GPU (wgsl/topk.wgsl), for any k
// up to MAX_TOPK. The last stage in engine/gpu/gpu_forward.ts returns these for sampling.

import { MAX_TOPK } from "../../stage.ts";
import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant. */
export const TOPK: KernelFamily<void> = {
  file: "topk.wgsl",
  variant: () => ({ name: "topk", defines: {} }),
};

/** u32 words a top-k of `k` writes: k (f32 bits, index) pairs and the log-sum-exp. */
export function topKWords(k: number): number {
  return 2 * k + 1;
}

/**
 * Records the top `k` of src[offset .. offset+n) into out as k (f32 bits, index) u32 pairs,
 * descending by value, ties by lower index, then the row's log-sum-exp (f32 bits). Entries masked
 * by logit_adjust are skipped; missing entries have index 0xffffffff.
 */
export function topK(
  enc: StepEncoder,
  b: { readonly src: BufferRef; readonly out: BufferRef },
  o: { readonly n: number; readonly k: number; readonly offset?: number },
): void {
  if (!Number.isInteger(o.k) || o.k < 1 || o.k > MAX_TOPK) {
    throw new RangeError(`Cannot take the top ${o.k} logits: expected 1..${MAX_TOPK}`);
  }
  enc.dispatch(TOPK, undefined, { src: b.src, dst: b.out }, {
    n: o.n,
    k: o.k,
    src_offset: o.offset ?? 0,
  }, { tiles: 1 });
}
