// Top-k (id, logit) and the log-sum-exp of logits rows on the GPU (wgsl/topk.wgsl), for any k up
// to MAX_TOPK. The last stage in engine/gpu/gpu_forward.ts returns these for sampling.

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
  /** topKScratchWords(n, k) words a row for the first pass's partials. */
  readonly scratch: BufferRef;
  readonly out: BufferRef;
};
type TopKOptions = {
  readonly n: number;
  readonly k: number;
  /** Where row 0 starts in src. */
  readonly offset?: number;
  /** Rows, each n values, `stride` apart in src (default 1 row, stride n). */
  readonly rows?: number;
  readonly stride?: number;
  /** Where row 0's results start in out, and the words between rows' (default topKWords(k)). */
  readonly outOffset?: number;
  readonly outStride?: number;
};

function dispatchTopK(enc: StepEncoder, b: TopKBuffers, o: TopKOptions, mode: 0 | 1): void {
  if (!Number.isInteger(o.k) || o.k < 1 || o.k > MAX_TOPK) {
    throw new RangeError(`Cannot take the top ${o.k} logits: expected 1..${MAX_TOPK}`);
  }
  const rows = o.rows ?? 1;
  const groups = groupsOf(o.n);
  const chunk = Math.ceil(o.n / groups);
  const params = {
    k: o.k,
    src_offset: o.offset ?? 0,
    mode,
    chunk,
    groups,
    src_stride: o.stride ?? o.n,
    scratch_stride: topKScratchWords(o.n, o.k),
    dst_offset: o.outOffset ?? 0,
    dst_stride: o.outStride ?? topKWords(o.k),
  };
  const first = groups > 1 ? b.scratch : b.out;
  enc.dispatch(TOPK, false, { src: b.src, dst: first }, { ...params, n: o.n }, {
    tiles: groups,
    z: rows,
  });
  if (groups === 1) return;
  // The merge reads groups·k candidates (mode 1) or groups partials (mode 0) a row.
  const n = mode === 1 ? groups * o.k : groups;
  enc.dispatch(TOPK, true, { src: b.scratch, dst: b.out }, { ...params, n }, { tiles: 1, z: rows });
}

/**
 * Records the top `k` of each row (src[offset + r·stride ..][0 .. n)) into out as k (f32 bits,
 * index) u32 pairs from outOffset + r·outStride, descending by value, ties by lower index.
 * Entries masked by logit_adjust are skipped; missing entries have index 0xffffffff.
 */
export function topK(enc: StepEncoder, b: TopKBuffers, o: TopKOptions): void {
  dispatchTopK(enc, b, o, 1);
}

/** Records the log-sum-exp of each row into out[outOffset + r·outStride + 2·k] (after topK's). */
export function logSumExp(enc: StepEncoder, b: TopKBuffers, o: TopKOptions): void {
  dispatchTopK(enc, b, o, 0);
}
