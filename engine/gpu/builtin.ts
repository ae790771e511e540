// The builtin GPU provider: Deno's own WebGPU (`navigator.gpu`, wgpu underneath).
// One of the two implementations behind engine/gpu/provider.ts.

import type { GpuProvider } from "./provider.ts";

/**
 * Keeps Deno's wgpu off its GL backend on Linux. Left to itself it probes every backend, GL through
 * libglvnd's libEGL, whose per-thread state is freed both by a thread's exit and by the library's
 * destructor at process exit. When a thread that touched EGL ends as the process exits (deno
 * test's per-module threads do), both frees can run at once and corrupt the heap: the run dies
 * with SIGABRT ("corrupted double-linked list") after its summary. The engine needs compute, which
 * it gets from Vulkan here, so only Vulkan is asked for unless DENO_WEBGPU_BACKEND says otherwise.
 * wgpu reads the variable when the first adapter is requested, so this runs before that.
 */
function vulkanOnlyOnLinux(): void {
  if (Deno.build.os !== "linux") return;
  try {
    if (Deno.env.get("DENO_WEBGPU_BACKEND") === undefined) {
      Deno.env.set("DENO_WEBGPU_BACKEND", "vulkan");
    }
  } catch (e) {
    // Without --allow-env (a worker with narrowed permissions) wgpu keeps its default; such a
    // process opens its device on the main thread, which outlives nothing at exit.
    if (!(e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied)) {
      throw e;
    }
  }
}

/** Deno's `navigator.gpu`; throws when this Deno build has no WebGPU. */
export function builtinProvider(): GpuProvider {
  vulkanOnlyOnLinux();
  const gpu = (globalThis.navigator as { gpu?: GPU } | undefined)?.gpu;
  if (!gpu) {
    throw new Error(
      "Cannot start the builtin GPU provider: navigator.gpu is missing in this Deno; use --gpu=dawn",
    );
  }
  return { name: "builtin", gpu, mapFloorMs: 11 };
}
