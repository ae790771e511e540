// GPU providers: where the WebGPU `GPU` object comes from (Deno's builtin or Dawn via npm).
// The first step of the data path's GPU side: engine/gpu/device.ts opens a device on one of them.

import { builtinProvider } from "./builtin.ts";
import { dawnProvider } from "./dawn.ts";

export type ProviderName = "builtin" | "dawn";
/** `--gpu` values: `auto` prefers Dawn when it loads and finds a real adapter. */
export type ProviderChoice = "auto" | ProviderName;
export const PROVIDER_CHOICES: readonly ProviderChoice[] = ["auto", "builtin", "dawn"];

/** A standard WebGPU entry point and the name of the implementation behind it. */
export interface GpuProvider {
  readonly name: ProviderName;
  readonly gpu: GPU;
  /**
   * Hears when the GPU work now awaited should end (performance.now() ms), for a provider that
   * polls for it (Dawn polls finely around then).
   */
  readonly expectDone?: (at: number) => void;
  /**
   * The least an awaited mapAsync costs, ms (default 0): Deno's builtin provider polls the
   * device and then sleeps 10 ms, so ≥ 11; Dawn answers in ~0.1.
   */
  readonly mapFloorMs?: number;
}

/** Adapter descriptions of CPU rasterisers that pretend to be GPUs. */
const SOFTWARE_ADAPTERS = /llvmpipe|lavapipe|swiftshader|softpipe|warp/i;

/** True for a fallback or CPU adapter (Mesa llvmpipe/lavapipe, SwiftShader, WARP). */
export function isSoftwareAdapter(info: GPUAdapterInfo): boolean {
  const text = `${info.vendor} ${info.architecture} ${info.device} ${info.description}`;
  return Boolean((info as { isFallbackAdapter?: boolean }).isFallbackAdapter) ||
    SOFTWARE_ADAPTERS.test(text);
}

/**
 * The provider for a `--gpu` choice. `auto` takes Dawn when its module loads and it returns an
 * adapter that is not a software one, and the builtin provider otherwise.
 */
export async function selectProvider(choice: ProviderChoice): Promise<GpuProvider> {
  if (choice === "builtin") return builtinProvider();
  if (choice === "dawn") return await dawnProvider();
  if (!PROVIDER_CHOICES.includes(choice)) {
    throw new TypeError(
      `Cannot select GPU provider "${choice}": expected one of ${PROVIDER_CHOICES.join(", ")}`,
    );
  }
  try {
    const dawn = await dawnProvider();
    const adapter = await dawn.gpu.requestAdapter({ powerPreference: "high-performance" });
    if (adapter && !isSoftwareAdapter(adapter.info)) return dawn;
  } catch {
    // Dawn is optional under `auto`: a missing binary or FFI permission means builtin.
  }
  return builtinProvider();
}
