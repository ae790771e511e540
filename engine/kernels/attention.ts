// Causal GQA attention with the sigmoid output gate over the f16 KV cache (wgsl/attention.wgsl),
// for the full-attention blocks of engine/forward/.

import type { BufferRef } from "../gpu/buffers.ts";
import type { GpuContext } from "../gpu/device.ts";
import type { StepEncoder } from "../gpu/encoder.ts";
import { getKernel, type KernelLayout, readyKernel } from "../gpu/kernel.ts";

export const ATTENTION: KernelLayout = {
  file: "attention.wgsl",
  bindings: [["q", "read"], ["kc", "read"], ["vc", "read"], ["o", "read_write"]],
  params: [
    ["dh", "u32"],
    ["hq", "u32"],
    ["hkv", "u32"],
    ["tokens", "u32"],
    ["pos0", "u32"],
    ["q_stride_t", "u32"],
    ["q_stride_h", "u32"],
    ["gate_offset", "u32"],
    ["o_stride_t", "u32"],
    ["scale", "f32"],
  ],
};

export async function prepareAttention(ctx: GpuContext): Promise<void> {
  await getKernel(ctx, ATTENTION, "attention", {});
}

export interface AttentionOptions {
  readonly tokens: number;
  readonly hq: number;
  readonly hkv: number;
  readonly dh: number;
  /** Position of the first token; token t attends to positions 0 ..= pos0 + t. */
  readonly pos0: number;
  readonly qStrideT: number;
  readonly qStrideH: number;
  readonly gateOffset: number;
  readonly oStrideT: number;
}

/** Records o[t][h] = softmax(q·K/√dh)·V ⊙ sigmoid(gate) for every token and query head. */
export function attention(
  enc: StepEncoder,
  b: {
    readonly q: BufferRef;
    readonly kc: BufferRef;
    readonly vc: BufferRef;
    readonly o: BufferRef;
  },
  o: AttentionOptions,
): void {
  if (o.dh > 512 || o.dh % 2 !== 0 || o.hq % o.hkv !== 0) {
    throw new RangeError(
      `Cannot attend with ${o.hq} query heads, ${o.hkv} KV heads of ${o.dh}: need even dh ≤ 512 and Hq a multiple of Hkv`,
    );
  }
  enc.dispatch(readyKernel(enc.ctx, "attention"), b, {
    dh: o.dh,
    hq: o.hq,
    hkv: o.hkv,
    tokens: o.tokens,
    pos0: o.pos0,
    q_stride_t: o.qStrideT,
    q_stride_h: o.qStrideH,
    gate_offset: o.gateOffset,
    o_stride_t: o.oStrideT,
    scale: 1 / Math.sqrt(o.dh),
  }, { tiles: o.tokens * o.hq });
}
