// Groups a prefill run's routed (token, rank) slots by expert (wgsl/moe_gather.wgsl), so the
// expert products of engine/gpu/gpu_forward.ts run token tiles per expert instead of one slot at a time.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** The kernel's three passes, run in this order. */
type GatherPass = "count" | "scan" | "place";
const PASSES: readonly GatherPass[] = ["count", "scan", "place"];

/** A variant a pass. */
export const MOE_GATHER: KernelFamily<GatherPass> = {
  file: "moe_gather.wgsl",
  variant: (_, pass) => ({ name: `moe_gather_${pass}`, defines: { [pass.toUpperCase()]: true } }),
};

/** Slots a workgroup of the count and place passes takes (wgsl WG). */
const BLOCK = 256;

/** Most tiles `slots` slots over `experts` experts can need with `tt` slots a tile. */
export function gatherTiles(slots: number, experts: number, tt: number): number {
  return Math.min(slots, Math.ceil(slots / tt) + experts);
}

/** u32 words of the gather table proper: tile count, tiles, entries (what mul_mat reads). */
export function gatherTableWords(slots: number, experts: number, tt: number): number {
  return 1 + gatherTiles(slots, experts, tt) + slots;
}

/** u32 words of a gather table's buffer: the table, then the passes' scratch (ranks, blocks). */
export function gatherWords(slots: number, experts: number, tt: number): number {
  return gatherTableWords(slots, experts, tt) + slots + Math.ceil(slots / BLOCK) * experts;
}

/** Records the gather table of the first `slots` entries of ids, in tiles of `tt`. */
export function moeGather(
  enc: StepEncoder,
  b: { readonly ids: BufferRef; readonly table: BufferRef },
  o: { readonly slots: number; readonly experts: number; readonly tt: number },
): void {
  if (o.slots > 65535 || o.experts > 1024 || o.tt > 63) {
    throw new RangeError(
      `Cannot gather ${o.slots} slots over ${o.experts} experts in tiles of ${o.tt}: the table packs up to 65535 slots, 1024 experts, 63 a tile`,
    );
  }
  const params = {
    slots: o.slots,
    experts: o.experts,
    tt: o.tt,
    max_tiles: gatherTiles(o.slots, o.experts, o.tt),
  };
  const blocks = Math.ceil(o.slots / BLOCK);
  for (const pass of PASSES) {
    enc.dispatch(MOE_GATHER, pass, b, params, { tiles: pass === "scan" ? 1 : blocks });
  }
}
