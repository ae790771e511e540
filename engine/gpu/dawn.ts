// The Dawn GPU provider: Google's Dawn through the npm package `webgpu` (a native addon).
// One of the two implementations behind engine/gpu/provider.ts; its readbacks are ~100x cheaper.
// TANDEM_DAWN_OPTIONS (comma-separated, e.g. "backend=vulkan") is passed to Dawn's create().

import type { GpuProvider } from "./provider.ts";

interface DawnModule {
  create(options: string[]): unknown;
  globals: Record<string, unknown>;
}

let loaded: Promise<GpuProvider> | undefined;

function dawnOptions(): string[] {
  try {
    return (Deno.env.get("TANDEM_DAWN_OPTIONS") ?? "").split(",").filter((o) => o !== "");
  } catch {
    return [];
  }
}

async function load(): Promise<GpuProvider> {
  let mod: DawnModule;
  try {
    mod = await import("webgpu") as unknown as DawnModule;
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    const hint = /ffi|permission|NotCapable/i.test(why)
      ? "run with --allow-ffi or use --gpu=builtin"
      : "check that the npm package webgpu is installed for this platform or use --gpu=builtin";
    throw new Error(`Cannot start the Dawn provider: ${why}; ${hint}`);
  }
  // Dawn's objects (GPUBufferUsage, GPUShaderStage, ...) must be globals for code written
  // against the standard API; Deno's builtin ones are replaced only where Dawn defines them.
  Object.assign(globalThis, mod.globals);
  return { name: "dawn", gpu: mod.create(dawnOptions()) as GPU };
}

/** Loads Dawn once per process; later calls share the same `GPU`. */
export function dawnProvider(): Promise<GpuProvider> {
  loaded ??= load();
  return loaded;
}
