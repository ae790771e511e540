// Opens a WebGPU device on a provider: adapter checks, limits, optional features, logging.
// Everything GPU-side (buffers, kernels, stages) takes the GpuContext this returns.

import { subgroupMatrixWantedByEnv } from "./dawn.ts";
import {
  isSoftwareAdapter,
  type ProviderChoice,
  type ProviderName,
  selectProvider,
} from "./provider.ts";

/** Optional features the kernels use when present; each has a fallback path. */
export interface GpuFeatures {
  /** `shader-f16`: f16 arithmetic in WGSL (fallback: f16 only as packed storage). */
  readonly f16: boolean;
  /**
   * `subgroups` with lanes laid out as local_invocation_index mod subgroup size and at least
   * SUBGROUP_MIN_LANES lanes, so a kernel may reduce over aligned runs of that many lanes
   * (fallback: workgroup-memory trees).
   */
  readonly subgroups: boolean;
  /** `timestamp-query`: GPU timing of steps (fallback: wall clock). */
  readonly timestamps: boolean;
  /**
   * Tensor cores: `chromium-experimental-subgroup-matrix` with an f16 × f16 → f32 16×16×16
   * configuration, `shader-f16`, and subgroups of exactly SUBGROUP_MATRIX_LANES lanes, which the
   * prefill products' layout of four subgroups a workgroup assumes (engine/gpu/kernels/
   * mul_mat_mma.ts; fallback: the f32 tiles). On only under TANDEM_MMA=1, and not then with
   * OpenGpuOptions.subgroupMatrix false.
   */
  readonly subgroupMatrix: boolean;
}

/** The limits the engine sizes things by, as numbers (Deno once returned bigints). */
export interface GpuLimits {
  readonly maxBufferSize: number;
  readonly maxStorageBufferBindingSize: number;
  readonly maxComputeWorkgroupStorageSize: number;
  readonly maxComputeInvocationsPerWorkgroup: number;
  readonly maxComputeWorkgroupsPerDimension: number;
  readonly minUniformBufferOffsetAlignment: number;
  readonly minStorageBufferOffsetAlignment: number;
  readonly maxStorageBuffersPerShaderStage: number;
  /** Smallest subgroup size the adapter may use (0 when unknown). */
  readonly subgroupMinSize: number;
}

export interface GpuContext {
  readonly provider: ProviderName;
  readonly device: GPUDevice;
  readonly info: GPUAdapterInfo;
  readonly software: boolean;
  readonly features: GpuFeatures;
  readonly limits: GpuLimits;
  /** One-line description for logs: provider, adapter, features. */
  readonly summary: string;
  /** When the GPU work about to be awaited should end (performance.now() ms); see GpuProvider. */
  readonly expectDone: (at: number) => void;
  /** The least an awaited map costs, ms; see GpuProvider. */
  readonly mapFloorMs: number;
}

export interface OpenGpuOptions {
  readonly gpu?: ProviderChoice;
  /** Accept a CPU adapter (also allowed by TANDEM_ALLOW_SOFTWARE_GPU=1). */
  readonly allowSoftware?: boolean;
  /** Where start-up and device-lost lines go; default stderr. */
  readonly log?: (line: string) => void;
  /** false: leave subgroup matrices off even under TANDEM_MMA=1. */
  readonly subgroupMatrix?: boolean;
}

/** Smallest subgroup the subgroup reduction paths accept (their lanes per output row). */
export const SUBGROUP_MIN_LANES = 16;

/** The one subgroup size the tensor-core kernels are laid out for (NVIDIA's warp). */
export const SUBGROUP_MATRIX_LANES = 32;

/** Dawn's experimental feature behind subgroup matrices (not in the WebGPU type list). */
export const SUBGROUP_MATRIX_FEATURE = "chromium-experimental-subgroup-matrix" as GPUFeatureName;

/** What subgroupMatrixUsable reads of an adapter's info (Dawn's fields, absent elsewhere). */
export interface SubgroupMatrixInfo {
  readonly subgroupMinSize?: number;
  readonly subgroupMaxSize?: number;
  /** Dawn's GPUSubgroupMatrixConfig objects: their fields are getters, read by name. */
  readonly subgroupMatrixConfigs?: readonly {
    readonly componentType: string;
    readonly resultComponentType: string;
    readonly M: number;
    readonly N: number;
    readonly K: number;
  }[];
}

/**
 * Whether an adapter with these features and info can run the tensor-core kernels: shader-f16,
 * subgroups and subgroup matrices, an f16 → f32 16×16×16 configuration, and every subgroup
 * SUBGROUP_MATRIX_LANES wide (a pipeline using subgroup matrices runs full subgroups; with one
 * possible size, a 128-invocation workgroup is exactly four of them).
 */
export function subgroupMatrixUsable(
  features: Pick<ReadonlySet<string>, "has">,
  info: SubgroupMatrixInfo,
): boolean {
  const needed = ["shader-f16", "subgroups", SUBGROUP_MATRIX_FEATURE];
  if (!needed.every((f) => features.has(f))) return false;
  if (
    info.subgroupMinSize !== SUBGROUP_MATRIX_LANES || info.subgroupMaxSize !== SUBGROUP_MATRIX_LANES
  ) {
    return false;
  }
  return (info.subgroupMatrixConfigs ?? []).some((c) =>
    c.componentType === "f16" && c.resultComponentType === "f32" && c.M === 16 && c.N === 16 &&
    c.K === 16
  );
}

/**
 * Whether subgroup lane i of a 64-wide workgroup is invocation i mod size, with size ≥
 * SUBGROUP_MIN_LANES. WGSL does not promise this layout, so it is measured once per device.
 */
async function subgroupLayoutIsLinear(device: GPUDevice): Promise<boolean> {
  const code = `enable subgroups;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32,
        @builtin(subgroup_size) size: u32) {
  out[lid] = select(0u, 1u, sid == lid % size && size >= ${SUBGROUP_MIN_LANES}u);
}`;
  device.pushErrorScope("validation");
  const out = device.createBuffer({
    size: 256,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  });
  const read = device.createBuffer({
    size: 256,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  try {
    const pipeline = device.createComputePipeline({
      layout: "auto",
      compute: { module: device.createShaderModule({ code }), entryPoint: "main" },
    });
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(
      0,
      device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [{ binding: 0, resource: { buffer: out } }],
      }),
    );
    pass.dispatchWorkgroups(1);
    pass.end();
    enc.copyBufferToBuffer(out, 0, read, 0, 256);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const ok = new Uint32Array(read.getMappedRange()).every((v) => v === 1);
    read.unmap();
    return ok && !(await device.popErrorScope());
  } catch {
    await device.popErrorScope();
    return false;
  } finally {
    out.destroy();
    read.destroy();
  }
}

const LIMIT_NAMES = [
  "maxBufferSize",
  "maxStorageBufferBindingSize",
  "maxComputeWorkgroupStorageSize",
  "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupSizeX",
  "maxStorageBuffersPerShaderStage",
] as const;

function softwareAllowedByEnv(): boolean {
  try {
    return Deno.env.get("TANDEM_ALLOW_SOFTWARE_GPU") === "1";
  } catch {
    return false;
  }
}

/**
 * Selects the provider, takes its high-performance adapter, refuses software adapters unless
 * allowed, and requests a device with the adapter's full buffer/workgroup limits plus those of
 * `shader-f16`, `subgroups`, `timestamp-query` that the adapter has, and subgroup matrices where
 * subgroupMatrixUsable and not turned off.
 */
export async function openGpu(options: OpenGpuOptions = {}): Promise<GpuContext> {
  const log = options.log ?? ((line: string) => console.error(line));
  const provider = await selectProvider(options.gpu ?? "auto");
  const adapter = await provider.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) {
    throw new Error(
      `Cannot open a GPU with the ${provider.name} provider: no WebGPU adapter was found; install a Vulkan driver (mesa-vulkan-drivers for a CPU adapter) or try --gpu=${
        provider.name === "dawn" ? "builtin" : "dawn"
      }`,
    );
  }
  const info = adapter.info;
  const software = isSoftwareAdapter(info);
  const allowed = options.allowSoftware || softwareAllowedByEnv();
  if (software && !allowed) {
    throw new Error(
      `Cannot use GPU adapter "${
        info.description || info.vendor
      }": it is a software (CPU) adapter; pass --allow-software-gpu or set TANDEM_ALLOW_SOFTWARE_GPU=1 to run on it anyway`,
    );
  }
  const wanted: GPUFeatureName[] = ["shader-f16", "subgroups", "timestamp-query"];
  const mma = options.subgroupMatrix !== false && subgroupMatrixWantedByEnv() &&
    subgroupMatrixUsable(adapter.features, info as SubgroupMatrixInfo);
  if (mma) wanted.push(SUBGROUP_MATRIX_FEATURE);
  const requiredFeatures = wanted.filter((f) => adapter.features.has(f));
  const requiredLimits: Record<string, number> = {};
  const adapterLimits = adapter.limits as unknown as Record<string, number | bigint>;
  for (const name of LIMIT_NAMES) requiredLimits[name] = Number(adapterLimits[name]);
  const device = await adapter.requestDevice({ requiredFeatures, requiredLimits });
  const has = (f: GPUFeatureName) => device.features.has(f);
  const features: GpuFeatures = {
    f16: has("shader-f16"),
    subgroups: has("subgroups") && await subgroupLayoutIsLinear(device),
    timestamps: has("timestamp-query"),
    subgroupMatrix: mma && has(SUBGROUP_MATRIX_FEATURE) && has("shader-f16") && has("subgroups"),
  };
  const dl = device.limits as unknown as Record<string, number | bigint>;
  const n = (name: string) => Number(dl[name]);
  const limits: GpuLimits = {
    maxBufferSize: n("maxBufferSize"),
    maxStorageBufferBindingSize: n("maxStorageBufferBindingSize"),
    maxComputeWorkgroupStorageSize: n("maxComputeWorkgroupStorageSize"),
    maxComputeInvocationsPerWorkgroup: n("maxComputeInvocationsPerWorkgroup"),
    maxComputeWorkgroupsPerDimension: n("maxComputeWorkgroupsPerDimension"),
    minUniformBufferOffsetAlignment: n("minUniformBufferOffsetAlignment"),
    minStorageBufferOffsetAlignment: n("minStorageBufferOffsetAlignment"),
    maxStorageBuffersPerShaderStage: n("maxStorageBuffersPerShaderStage"),
    subgroupMinSize: Number((info as { subgroupMinSize?: number }).subgroupMinSize ?? 0),
  };
  const featureList = Object.entries(features).filter(([, on]) => on).map(([f]) => f);
  const summary = `${provider.name} provider, adapter "${
    info.description || info.device
  }" (vendor ${info.vendor || "?"}, ${info.architecture || "?"}${
    software ? ", software" : ""
  }), features [${
    featureList.join(", ")
  }], max binding ${limits.maxStorageBufferBindingSize} B, max buffer ${limits.maxBufferSize} B`;
  log(`GPU: ${summary}`);
  device.lost.then((lost) => {
    if (lost.reason !== "destroyed") log(`GPU device lost (${lost.reason}): ${lost.message}`);
  });
  const expectDone = provider.expectDone ?? (() => {});
  return {
    provider: provider.name,
    device,
    info,
    software,
    features,
    limits,
    summary,
    expectDone,
    mapFloorMs: provider.mapFloorMs ?? 0,
  };
}
