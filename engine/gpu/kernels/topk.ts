// Top-k (id, logit) of one logits row on the GPU (wgsl/topk.wgsl), in two passes: per-group
// candidates, then a merge. The last stage in engine/gpu/gpu_forward.ts returns these for sampling.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import { dummyStorage } from "../buffers.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant; `mode` picks the pass. */
export const TOPK: KernelFamily<void> = {
  file: "topk.wgsl",
  variant: () => ({ name: "topk", defines: {} }),
};

/** Largest k the kernels take. */
export const MAX_TOPK = 256;
/** Groups of the first pass; their k candidates each are merged by the second. */
const GROUPS = 64;

/** u32 words of scratch a top-k of `k` needs (candidates of every group). */
export function topKScratchWords(k: number): number {
  return 2 * GROUPS * k;
}

/**
 * Records the top `k` of src[offset .. offset+n) into out as k (f32 bits, index) u32 pairs,
 * descending by value, ties by lower index; missing entries have index 0xffffffff.
 */
export function topK(
  enc: StepEncoder,
  b: { readonly src: BufferRef; readonly scratch: BufferRef; readonly out: BufferRef },
  o: { readonly n: number; readonly k: number; readonly offset?: number },
): void {
  if (!Number.isInteger(o.k) || o.k < 1 || o.k > MAX_TOPK) {
    throw new RangeError(`Cannot take the top ${o.k} logits: expected 1..${MAX_TOPK}`);
  }
  const chunk = Math.ceil(o.n / GROUPS);
  const groups = Math.ceil(o.n / chunk);
  const dummy = dummyStorage(enc.ctx);
  enc.dispatch(TOPK, undefined, { src: b.src, cand: dummy, dst: b.scratch }, {
    n: o.n,
    k: o.k,
    chunk,
    src_offset: o.offset ?? 0,
    mode: 0,
  }, { tiles: groups });
  enc.dispatch(TOPK, undefined, { src: dummy, cand: b.scratch, dst: b.out }, {
    n: groups * o.k,
    k: o.k,
    chunk: groups * o.k,
    src_offset: 0,
    mode: 1,
  }, { tiles: 1 });
}
