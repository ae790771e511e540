// Kernel families as the host sees them: bindings, the Params layout, and cached pipelines.
// Each engine/gpu/kernels/<family>.ts declares one KernelLayout; engine/gpu/encoder.ts dispatches it.

import type { GpuContext } from "./device.ts";
import { type Defines, expandWgsl } from "./wgsl.ts";

/** A storage binding: its WGSL `var` name and access mode. `params` (uniform) always comes last. */
export type StorageBinding = readonly [name: string, access: "read" | "read_write"];
export type ParamType = "u32" | "i32" | "f32";
export type ParamField = readonly [name: string, type: ParamType];

/** The host side of one wgsl/<file>: same names, order and types as the WGSL declares. */
export interface KernelLayout {
  readonly file: string;
  readonly bindings: readonly StorageBinding[];
  readonly params: readonly ParamField[];
}

/** One compiled variant of a family. */
export interface Kernel {
  readonly name: string;
  readonly layout: KernelLayout;
  readonly pipeline: GPUComputePipeline;
  readonly bindGroupLayout: GPUBindGroupLayout;
}

/** Bytes one dispatch's Params occupy in the uniform arena (64 fields at most). */
export const PARAMS_SLOT_BYTES = 256;

interface DeviceCache {
  readonly layouts: Map<KernelLayout, GPUBindGroupLayout>;
  readonly kernels: Map<string, Promise<Kernel>>;
  /** Compiled kernels, for the synchronous lookups made while encoding a step. */
  readonly ready: Map<string, Kernel>;
}
const caches = new WeakMap<GPUDevice, DeviceCache>();

function cacheOf(device: GPUDevice): DeviceCache {
  let c = caches.get(device);
  if (!c) {
    c = { layouts: new Map(), kernels: new Map(), ready: new Map() };
    caches.set(device, c);
  }
  return c;
}

function bindGroupLayoutOf(ctx: GpuContext, layout: KernelLayout): GPUBindGroupLayout {
  const cache = cacheOf(ctx.device);
  let bgl = cache.layouts.get(layout);
  if (!bgl) {
    if (layout.params.length * 4 > PARAMS_SLOT_BYTES) {
      throw new RangeError(
        `Cannot lay out kernel ${layout.file}: ${layout.params.length} params exceed ${
          PARAMS_SLOT_BYTES / 4
        }`,
      );
    }
    const entries: GPUBindGroupLayoutEntry[] = layout.bindings.map(([, access], i) => ({
      binding: i,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type: access === "read" ? "read-only-storage" : "storage" },
    }));
    entries.push({
      binding: layout.bindings.length,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type: "uniform" },
    });
    bgl = ctx.device.createBindGroupLayout({ label: layout.file, entries });
    cache.layouts.set(layout, bgl);
  }
  return bgl;
}

/**
 * Compiles one variant. Pipelines are created synchronously inside an error scope: stages compile
 * at open time, where blocking is fine, and Dawn under Deno was seen to leave
 * createComputePipelineAsync unresolved now and then.
 */
async function build(
  ctx: GpuContext,
  layout: KernelLayout,
  name: string,
  defines: Defines,
): Promise<Kernel> {
  const code = expandWgsl(layout.file, defines);
  const { device } = ctx;
  const bindGroupLayout = bindGroupLayoutOf(ctx, layout);
  device.pushErrorScope("validation");
  const pipeline = device.createComputePipeline({
    label: name,
    layout: device.createPipelineLayout({ label: name, bindGroupLayouts: [bindGroupLayout] }),
    compute: { module: device.createShaderModule({ label: name, code }), entryPoint: "main" },
  });
  const error = await device.popErrorScope();
  if (error) throw new Error(`Cannot compile kernel ${name} (${layout.file}): ${error.message}`);
  return { name, layout, pipeline, bindGroupLayout };
}

/**
 * The pipeline of variant `name` of a family (compiled once per device). `name` must identify
 * the defines, e.g. "mul_mat_Q4_K_t8_add"; it labels the pipeline in errors and profiles.
 */
export function getKernel(
  ctx: GpuContext,
  layout: KernelLayout,
  name: string,
  defines: Defines,
): Promise<Kernel> {
  const cache = cacheOf(ctx.device);
  let k = cache.kernels.get(name);
  if (!k) {
    k = build(ctx, layout, name, defines);
    cache.kernels.set(name, k);
    k.then((kernel) => cache.ready.set(name, kernel), () => cache.kernels.delete(name));
  }
  return k;
}

/**
 * A kernel compiled earlier by getKernel, looked up without waiting. Encoding is synchronous,
 * so stages compile every variant they use when they open.
 */
export function readyKernel(ctx: GpuContext, name: string): Kernel {
  const k = cacheOf(ctx.device).ready.get(name);
  if (!k) {
    throw new Error(
      `Cannot dispatch kernel ${name}: it was not compiled; prepare it (getKernel) before encoding`,
    );
  }
  return k;
}

/** Writes `values` into `view` at `offset` in the order and types of `fields`. */
export function packParams(
  fields: readonly ParamField[],
  values: Readonly<Record<string, number>>,
  view: DataView,
  offset: number,
): void {
  for (let i = 0; i < fields.length; i++) {
    const [name, type] = fields[i];
    const v = values[name];
    if (v === undefined || Number.isNaN(v)) {
      throw new TypeError(`Cannot pack kernel params: "${name}" is ${v}, expected a ${type}`);
    }
    if (type === "f32") view.setFloat32(offset + 4 * i, v, true);
    else if (type === "i32") view.setInt32(offset + 4 * i, v, true);
    else view.setUint32(offset + 4 * i, v, true);
  }
}
