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

/** u32 words a top-k of `k` and its log-sum-exp fill: k (f32 bits, index) pairs, then one. */
export function topKWords(k: number): number {
  return 2 * k + 1;
}

type TopKBuffers = { readonly src: BufferRef; readonly out: BufferRef };
type TopKOptions = { readonly n: number; readonly k: number; readonly offset?: number };

function dispatchTopK(enc: StepEncoder, b: TopKBuffers, o: TopKOptions, mode: 0 | 1): void {
  if (!Number.isInteger(o.k) || o.k < 1 || o.k > MAX_TOPK) {
    throw new RangeError(`Cannot take the top ${o.k} logits: expected 1..${MAX_TOPK}`);
  }
  enc.dispatch(TOPK, undefined, { src: b.src, dst: b.out }, {
    n: o.n,
    k: o.k,
    src_offset: o.offset ?? 0,
    mode,
  }, { tiles: 1 });
}

/**
 * Records the top `k` of src[offset .. offset+n) into out as k (f32 bits, index) u32 pairs,
 * descending by value, ties by lower index. Entries masked by logit_adjust are skipped; missing
 * entries have index 0xffffffff.
 */
export function topK(enc: StepEncoder, b: TopKBuffers, o: TopKOptions): void {
  dispatchTopK(enc, b, o, 1);
}

/** Records the log-sum-exp of src[offset .. offset+n) into out[2·k] (after topK's k pairs). */
export function logSumExp(enc: StepEncoder, b: TopKBuffers, o: TopKOptions): void {
  dispatchTopK(enc, b, o, 0);
}
