// Weighted sum of the routed experts' outputs plus the gated shared expert, added to the
// residual stream (wgsl/moe_sum.wgsl), and moeDownSum, the experts' down products with that sum:
// the end of a MoE FFN in engine/gpu/gpu_forward.ts.

import { type BufferRef, dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";
import type { GpuTensor } from "../tensor.ts";
import { mulMat, type MulMatOptions } from "./mul_mat.ts";

/** One variant. */
export const MOE_SUM: KernelFamily<void> = {
  file: "moe_sum.wgsl",
  variant: () => ({ name: "moe_sum", defines: {} }),
};

/** Records x[t] += Σ_i weights[t,i]·o[t,i] + weights[t,k]·s[t] (the last term if sharedExpert). */
export function moeSum(
  enc: StepEncoder,
  b: {
    readonly o: BufferRef;
    readonly s: BufferRef;
    readonly weights: BufferRef;
    readonly x: BufferRef;
  },
  o: {
    readonly d: number;
    readonly k: number;
    readonly tokens: number;
    readonly sharedExpert: boolean;
  },
): void {
  enc.dispatch(MOE_SUM, undefined, b, {
    d: o.d,
    k: o.k,
    tokens: o.tokens,
    shared_expert: o.sharedExpert ? 1 : 0,
  }, { tiles: Math.ceil((o.tokens * o.d) / 64) });
}

/**
 * The end of a MoE FFN: every token's expert products y_i = W_{ids[t,i]}·x[t][i] (mulMat with
 * ids) into `o`, then summed into x[t] by routing weight with the gated shared expert (moeSum).
 * A decode step instead runs the products, then the shared expert's down with the sum as its
 * epilogue (mulMat's moeSum, the same bits): the products run every rank at once, which beat one
 * dispatch looping over the ranks on both providers (docs/PERFORMANCE.md). With `mma` (and a
 * gather table) the products run on tensor cores where the device has them, the sum as always.
 */
export function moeDownSum(
  enc: StepEncoder,
  b: {
    readonly w: GpuTensor;
    readonly x: BufferRef;
    readonly ids: BufferRef;
    readonly weights: BufferRef;
    readonly shared?: BufferRef;
    /** (T, nUsed, d) scratch for the products. */
    readonly o: BufferRef;
    /** The residual stream (T, d). */
    readonly y: BufferRef;
    /** With `mma`: the products' tensor-core scratch (MulMatBuffers.mmaX). */
    readonly mmaX?: GPUBuffer;
  },
  o: Omit<MulMatOptions, "yOffset" | "yStrideT" | "yStrideI" | "add" | "norm">,
): void {
  mulMat(enc, { w: b.w, x: b.x, ids: b.ids, y: b.o, mmaX: b.mmaX }, o);
  moeSum(enc, { o: b.o, s: b.shared ?? dummyStorage(enc.ctx), weights: b.weights, x: b.y }, {
    d: b.w.matrixRows,
    k: o.nUsed ?? 1,
    tokens: o.tokens,
    sharedExpert: b.shared !== undefined,
  });
}
