// Top-k (id, logit) and the log-sum-exp of one logits row on the GPU (wgsl/topk.wgsl), for any k
// up to MAX_TOPK. The last stage in engine/gpu/gpu_forward.ts returns these for sampling.

import { MAX_TOPK } from "../../stage.ts";
import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, Variant } from "../kernel.ts";

/** The per-chunk pass, or (merge) the one workgroup finishing what the chunks left. */
export const TOPK: KernelFamily<boolean> = {
  file: "topk.wgsl",
  variant: (_, merge): Variant =>
    merge ? { name: "topk_merge", defines: { MERGE: true } } : { name: "topk", defines: {} },
};

/** Values a workgroup of the first pass takes at least. */
const CHUNK = 2048;
/** Most workgroups of the first pass: the merge reads k candidates from each. */
const MAX_GROUPS = 64;

function groupsOf(n: number): number {
  return Math.max(1, Math.min(MAX_GROUPS, Math.ceil(n / CHUNK)));
}

/** u32 words a top-k of `k` and its log-sum-exp fill: k (f32 bits, index) pairs, then one. */
export function topKWords(k: number): number {
  return 2 * k + 1;
}

/** u32 words of scratch the first pass over a row of n values writes for a top-k of k. */
export function topKScratchWords(n: number, k: number): number {
  return 2 * k * groupsOf(n);
}

type TopKBuffers = {
  readonly src: BufferRef;
  /** topKScratchWords(n, k) words for the first pass's partials. */
  readonly scratch: BufferRef;
  readonly out: BufferRef;
};
type TopKOptions = { readonly n: number; readonly k: number; readonly offset?: number };

function dispatchTopK(enc: StepEncoder, b: TopKBuffers, o: TopKOptions, mode: 0 | 1): void {
  if (!Number.isInteger(o.k) || o.k < 1 || o.k > MAX_TOPK) {
    throw new RangeError(`Cannot take the top ${o.k} logits: expected 1..${MAX_TOPK}`);
  }
  const groups = groupsOf(o.n);
  const chunk = Math.ceil(o.n / groups);
  const params = { k: o.k, src_offset: o.offset ?? 0, mode, chunk, groups };
  const first = groups > 1 ? b.scratch : b.out;
  enc.dispatch(TOPK, false, { src: b.src, dst: first }, { ...params, n: o.n }, { tiles: groups });
  if (groups === 1) return;
  // The merge reads groups·k candidates (mode 1) or groups partials (mode 0).
  const n = mode === 1 ? groups * o.k : groups;
  enc.dispatch(TOPK, true, { src: b.scratch, dst: b.out }, { ...params, n }, { tiles: 1 });
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
