// DeltaNet causal depthwise conv + SiLU with its rolling state (wgsl/ssm_conv.wgsl), the first
// step of a DeltaNet block in engine/gpu/gpu_forward.ts after the input projections.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";

/** Tokens a thread walks (wgsl RUN): at least kc − 1, so only the first group reads the state. */
const CONV_RUN = 8;

/** One variant. */
export const SSM_CONV: KernelFamily<void> = {
  file: "ssm_conv.wgsl",
  variant: () => ({ name: "ssm_conv", defines: {} }),
};

/** Records u[t] = silu(conv(state ++ x[0..t])) and advances the state by `tokens` inputs. */
export function ssmConv(
  enc: StepEncoder,
  b: {
    readonly x: BufferRef;
    readonly w: BufferRef;
    readonly state: BufferRef;
    readonly u: BufferRef;
  },
  o: {
    readonly channels: number;
    readonly kc: number;
    readonly tokens: number;
    readonly xOffset?: number;
    readonly xStrideT: number;
    /** Where token 0's outputs start in u (default 0). */
    readonly uOffset?: number;
    readonly uStrideT: number;
  },
): void {
  if (o.kc < 2 || o.kc > CONV_RUN + 1) {
    throw new RangeError(
      `Cannot run a conv of ${o.kc} taps: the kernel takes 2 to ${CONV_RUN + 1}`,
    );
  }
  enc.dispatch(SSM_CONV, undefined, b, {
    channels: o.channels,
    kc: o.kc,
    tokens: o.tokens,
    x_offset: o.xOffset ?? 0,
    x_stride_t: o.xStrideT,
    u_offset: o.uOffset ?? 0,
    u_stride_t: o.uStrideT,
  }, { tiles: Math.ceil(o.channels / 64), z: Math.ceil(o.tokens / CONV_RUN) });
}
