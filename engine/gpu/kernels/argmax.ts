// Greedy ids of logits rows on the GPU (wgsl/argmax.wgsl), so decode needs no logits readback:
// the best of each group of a row first, then of the groups. Used by the last stage in
// engine/gpu/gpu_forward.ts.

import { type BufferRef, dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant; `mode` picks the pass. */
export const ARGMAX: KernelFamily<void> = {
  file: "argmax.wgsl",
  variant: () => ({ name: "argmax", defines: {} }),
};

/** Values a pass-1 workgroup takes at least: 4 a thread. */
const GROUP_VALUES = 1024;
/** Pass-1 workgroups wanted per call, so one row (decode) spreads over the GPU. */
const WORKGROUPS = 256;

function groupsOf(n: number, rows: number): number {
  return Math.max(1, Math.min(Math.ceil(n / GROUP_VALUES), Math.ceil(WORKGROUPS / rows)));
}

/** u32 words of scratch an argmax of up to `rows` rows needs. */
export function argmaxScratchWords(rows: number): number {
  return 2 * (WORKGROUPS + rows);
}

/** Records out[outOffset + r] = argmax of row r (n values; ties: lower id) for r < rows. */
export function argmax(
  enc: StepEncoder,
  b: { readonly src: BufferRef; readonly scratch: BufferRef; readonly out: BufferRef },
  o: {
    readonly n: number;
    readonly rows: number;
    readonly stride?: number;
    readonly offset?: number;
    readonly outOffset?: number;
  },
): void {
  const groups = groupsOf(o.n, o.rows);
  const params = {
    n: o.n,
    rows: o.rows,
    stride: o.stride ?? o.n,
    offset: o.offset ?? 0,
    out_offset: o.outOffset ?? 0,
    groups,
    chunk: Math.ceil(o.n / groups),
  };
  enc.dispatch(ARGMAX, undefined, { src: b.src, cand: b.scratch, out: dummyStorage(enc.ctx, 1) }, {
    ...params,
    mode: 0,
  }, { tiles: o.rows * groups });
  enc.dispatch(ARGMAX, undefined, { src: dummyStorage(enc.ctx), cand: b.scratch, out: b.out }, {
    ...params,
    mode: 1,
  }, { tiles: o.rows });
}
