// Weighted sum of the routed experts' outputs plus the gated shared expert, added to the
// residual stream (wgsl/moe_sum.wgsl): the end of a MoE FFN in engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { GpuContext } from "../device.ts";
import type { StepEncoder } from "../encoder.ts";
import { getKernel, type KernelLayout, readyKernel } from "../kernel.ts";

export const MOE_SUM: KernelLayout = {
  file: "moe_sum.wgsl",
  bindings: [["o", "read"], ["s", "read"], ["weights", "read"], ["x", "read_write"]],
  params: [["d", "u32"], ["k", "u32"], ["tokens", "u32"], ["shared_expert", "u32"]],
};

export async function prepareMoeSum(ctx: GpuContext): Promise<void> {
  await getKernel(ctx, MOE_SUM, "moe_sum", {});
}

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
  enc.dispatch(readyKernel(enc.ctx, "moe_sum"), b, {
    d: o.d,
    k: o.k,
    tokens: o.tokens,
    shared_expert: o.sharedExpert ? 1 : 0,
  }, { tiles: Math.ceil((o.tokens * o.d) / 64) });
}
