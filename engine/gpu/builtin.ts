// The builtin GPU provider: Deno's own WebGPU (`navigator.gpu`, wgpu underneath).
// One of the two implementations behind engine/gpu/provider.ts.

import type { GpuProvider } from "./provider.ts";

/** Deno's `navigator.gpu`; throws when this Deno build has no WebGPU. */
export function builtinProvider(): GpuProvider {
  const gpu = (globalThis.navigator as { gpu?: GPU } | undefined)?.gpu;
  if (!gpu) {
    throw new Error(
      "Cannot start the builtin GPU provider: navigator.gpu is missing in this Deno; use --gpu=dawn",
    );
  }
  return { name: "builtin", gpu };
}
