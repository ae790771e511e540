// MoE routing on the GPU (wgsl/moe_route.wgsl): softmax, top-k, renormalise, plus the shared
// expert's sigmoid gate. Feeds the expert products of engine/gpu/gpu_forward.ts through ids and weights.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** One variant. */
export const MOE_ROUTE: KernelFamily<void> = {
  file: "moe_route.wgsl",
  variant: () => ({ name: "moe_route", defines: {} }),
};

/**
 * Records, per token: ids (T, k) of the chosen experts by descending probability, weights
 * (T, k+1) their renormalised probabilities and, at index k, sigmoid(logits[E]) when
 * `sharedGate` (else 0).
 */
export function moeRoute(
  enc: StepEncoder,
  b: { readonly logits: BufferRef; readonly ids: BufferRef; readonly weights: BufferRef },
  o: {
    readonly experts: number;
    readonly k: number;
    readonly tokens: number;
    readonly logitsStride: number;
    readonly sharedGate: boolean;
  },
): void {
  if (o.experts > 1024 || o.k > 64 || o.k > o.experts) {
    throw new RangeError(
      `Cannot route to ${o.k} of ${o.experts} experts: the kernel takes up to 1024 experts and 64 per token`,
    );
  }
  enc.dispatch(MOE_ROUTE, undefined, b, {
    e: o.experts,
    k: o.k,
    tokens: o.tokens,
    logits_stride: o.logitsStride,
    shared_gate: o.sharedGate ? 1 : 0,
  }, { tiles: o.tokens });
}
