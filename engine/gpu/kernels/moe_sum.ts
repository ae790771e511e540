// Weighted sum of the routed experts' outputs plus the gated shared expert, added to the
// residual stream (wgsl/moe_sum.wgsl): the end of a MoE FFN in engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

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
