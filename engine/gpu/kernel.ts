// Kernel families as the host sees them: a variant key → defines → pipeline, with the binding
// layout and Params struct parsed from the variant's WGSL. engine/gpu/kernels/<op>.ts each
// declare one KernelFamily; engine/gpu/encoder.ts dispatches a (family, key) by binding names.
//
// The WGSL is the one source of a kernel's interface: nothing in TS restates its bindings or
// Params. A dispatch names its buffers and params; the encoder orders them as the WGSL declares
// and refuses a name the WGSL lacks or a name it misses.

import type { GpuContext } from "./device.ts";
import { type Defines, expandWgsl } from "./wgsl.ts";

export type StorageAccess = "read" | "read_write";
export type ParamType = "u32" | "i32" | "f32";

/** What a kernel variant declares: storage bindings in binding order, then Params' fields. */
export interface KernelInterface {
  readonly bindings: readonly { readonly name: string; readonly access: StorageAccess }[];
  readonly params: readonly { readonly name: string; readonly type: ParamType }[];
}

/** What a variant may depend on besides its key: the device's features and limits. */
export type KernelTarget = Pick<GpuContext, "features" | "limits">;

/** A kernel's variant: its pipeline name (which must identify the defines) and its defines. */
export interface Variant {
  readonly name: string;
  readonly defines: Defines;
}

/** One wgsl/<op>.wgsl and the one function mapping a typed key to a variant of it. */
export interface KernelFamily<K> {
  readonly file: string;
  variant(target: KernelTarget, key: K): Variant;
}

/** One compiled variant. */
export interface Kernel {
  readonly name: string;
  readonly file: string;
  readonly iface: KernelInterface;
  readonly pipeline: GPUComputePipeline;
  readonly bindGroupLayout: GPUBindGroupLayout;
}

/** Bytes one dispatch's Params occupy in the uniform arena (64 fields at most). */
export const PARAMS_SLOT_BYTES = 256;

const BINDING =
  /@group\((\d+)\)\s*@binding\((\d+)\)\s*var<(\w+)(?:\s*,\s*(\w+))?>\s*(\w+)\s*:\s*([^;]+);/g;
const PARAM_TYPES: readonly string[] = ["u32", "i32", "f32"];

/**
 * The interface of one expanded variant. The layout rules are checked here, so a kernel that
 * breaks them cannot be built: group 0, bindings numbered 0.. in order, storage buffers first,
 * then `params: Params` as the last binding (uniform), Params fields of u32, i32 or f32.
 */
export function parseInterface(code: string, where: string): KernelInterface {
  const fail = (why: string) => {
    throw new SyntaxError(`Cannot read the interface of ${where}: ${why}`);
  };
  const found = [...code.matchAll(BINDING)];
  const bindings: { name: string; access: StorageAccess }[] = [];
  found.forEach((m, i) => {
    const [, group, index, space, access = "read", name, type] = m;
    if (group !== "0" || Number(index) !== i) {
      fail(`"${name}" is @group(${group}) @binding(${index}), expected @group(0) @binding(${i})`);
    }
    if (i === found.length - 1) {
      if (space !== "uniform" || name !== "params" || type.trim() !== "Params") {
        fail(`the last binding is "${name}", expected "params: Params" (uniform)`);
      }
      return;
    }
    if (space !== "storage" || (access !== "read" && access !== "read_write")) {
      fail(`binding "${name}" is var<${m[3]}${m[4] ? `, ${m[4]}` : ""}>, expected storage`);
    }
    bindings.push({ name, access: access as StorageAccess });
  });
  if (!found.length) fail("it declares no bindings; expected storage buffers, then params");
  const struct = /struct Params\s*\{([^}]*)\}/.exec(code);
  if (!struct) fail("it has no `struct Params`");
  const params = [...struct![1].matchAll(/(\w+)\s*:\s*(\w+)/g)].map(([, name, type]) => {
    if (!PARAM_TYPES.includes(type)) fail(`Params.${name} is ${type}, expected u32, i32 or f32`);
    return { name, type: type as ParamType };
  });
  if (params.length * 4 > PARAMS_SLOT_BYTES) {
    fail(`${params.length} Params fields exceed the ${PARAMS_SLOT_BYTES / 4} of an arena slot`);
  }
  return { bindings, params };
}

/** The expanded WGSL of a variant and its interface; pure, for the contract test too. */
export function variantSource(
  family: KernelFamily<unknown>,
  v: Variant,
): { code: string; iface: KernelInterface } {
  const code = expandWgsl(family.file, v.defines);
  return { code, iface: parseInterface(code, `kernel ${v.name} (${family.file})`) };
}

interface DeviceCache {
  /** Bind group layouts by access pattern: variants with the same layout share one. */
  readonly layouts: Map<string, GPUBindGroupLayout>;
  readonly kernels: Map<string, Kernel>;
  /** Compile errors not yet awaited (settleKernels). */
  pending: Promise<void>[];
  /** Variants compiling asynchronously, by name, until they land in `kernels` or fail. */
  readonly ahead: Map<string, Ahead>;
  /** The recording whose variants are being collected now (collectVariants, compileAhead). */
  recording: { readonly names: Set<string>; readonly ahead: boolean } | undefined;
  /** Variants built synchronously outside any recording: a step that stalled to compile. */
  readonly late: string[];
  /**
   * Each family's variants by their key's JSON (keys are plain data): a decode step asks for ~340,
   * and building each one's defines and name again cost 10-15% of the step's host work where its
   * key's JSON costs little (bench/host_cost.ts).
   */
  readonly variants: Map<KernelFamily<never>, Map<string, Variant>>;
}
const caches = new WeakMap<GPUDevice, DeviceCache>();

function cacheOf(device: GPUDevice): DeviceCache {
  let c = caches.get(device);
  if (!c) {
    c = {
      layouts: new Map(),
      kernels: new Map(),
      pending: [],
      ahead: new Map(),
      recording: undefined,
      late: [],
      variants: new Map(),
    };
    caches.set(device, c);
  }
  return c;
}

function bindGroupLayoutOf(ctx: GpuContext, iface: KernelInterface): GPUBindGroupLayout {
  const cache = cacheOf(ctx.device);
  const key = iface.bindings.map((b) => b.access).join(",");
  let bgl = cache.layouts.get(key);
  if (!bgl) {
    const entries: GPUBindGroupLayoutEntry[] = iface.bindings.map(({ access }, i) => ({
      binding: i,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type: access === "read" ? "read-only-storage" : "storage" },
    }));
    entries.push({
      binding: iface.bindings.length,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type: "uniform" },
    });
    bgl = ctx.device.createBindGroupLayout({ label: key, entries });
    cache.layouts.set(key, bgl);
  }
  return bgl;
}

function pipelineDescriptor(
  device: GPUDevice,
  v: Variant,
  code: string,
  bindGroupLayout: GPUBindGroupLayout,
): GPUComputePipelineDescriptor {
  return {
    label: v.name,
    layout: device.createPipelineLayout({ label: v.name, bindGroupLayouts: [bindGroupLayout] }),
    compute: { module: device.createShaderModule({ label: v.name, code }), entryPoint: "main" },
  };
}

function compileError(family: KernelFamily<unknown>, v: Variant, message: string): Error {
  return new Error(`Cannot compile kernel ${v.name} (${family.file}): ${message}`);
}

/**
 * Builds a variant's pipeline synchronously inside an error scope, whose outcome joins the
 * device's pending list: a recording that meets a variant not built yet cannot wait for it.
 */
function build(ctx: GpuContext, family: KernelFamily<unknown>, v: Variant): Kernel {
  const { code, iface } = variantSource(family, v);
  const { device } = ctx;
  const bindGroupLayout = bindGroupLayoutOf(ctx, iface);
  device.pushErrorScope("validation");
  const pipeline = device.createComputePipeline(
    pipelineDescriptor(device, v, code, bindGroupLayout),
  );
  const cache = cacheOf(device);
  cache.pending.push(
    device.popErrorScope().then((error) => {
      if (!error) return;
      cache.kernels.delete(v.name);
      throw compileError(family, v, error.message);
    }),
  );
  return { name: v.name, file: family.file, iface, pipeline, bindGroupLayout };
}

/** A variant compiling with createComputePipelineAsync. */
interface Ahead {
  readonly family: KernelFamily<unknown>;
  readonly variant: Variant;
  /** What a planning recording gets: the interface, and no pipeline to encode. */
  readonly placeholder: Kernel;
  /** Undefined while compiling, then the kernel (in the cache) or why it failed. */
  outcome: Kernel | Error | undefined;
  /** Settles (never rejects) once `outcome` is set. */
  readonly done: Promise<void>;
}

/**
 * Starts compiling a variant off the caller's path: Dawn's Vulkan backend compiles async
 * pipelines on its worker threads. The kernel joins the cache when it is ready, unless a
 * synchronous build of the same name got there first (settle's deadline), so a name is never
 * compiled into the cache twice.
 */
function buildAhead(ctx: GpuContext, family: KernelFamily<unknown>, v: Variant): Ahead {
  const { code, iface } = variantSource(family, v);
  const { device } = ctx;
  const cache = cacheOf(device);
  const bindGroupLayout = bindGroupLayoutOf(ctx, iface);
  const { name } = v;
  const { file } = family;
  device.pushErrorScope("validation");
  let pipeline: Promise<GPUComputePipeline>;
  try {
    pipeline = device.createComputePipelineAsync(
      pipelineDescriptor(device, v, code, bindGroupLayout),
    );
  } catch (e) {
    pipeline = Promise.reject(e);
  }
  // The shader module's own validation errors land in the scope, the pipeline's in the promise.
  const scope = device.popErrorScope();
  const entry: Ahead = {
    family,
    variant: v,
    placeholder: {
      name,
      file,
      iface,
      bindGroupLayout,
      get pipeline(): GPUComputePipeline {
        throw new Error(
          `Cannot encode kernel ${name}: it is compiling ahead; a recording that plans kernels is not for encoding`,
        );
      },
    },
    outcome: undefined,
    done: Promise.all([pipeline, scope]).then(
      ([pipeline, error]) => {
        if (error) throw new Error(error.message);
        const kernel: Kernel = { name, file, iface, pipeline, bindGroupLayout };
        if (!cache.kernels.has(name)) cache.kernels.set(name, kernel);
        entry.outcome = cache.kernels.get(name);
      },
    ).catch((e: unknown) => {
      entry.outcome = compileError(family, v, e instanceof Error ? e.message : String(e));
    }).finally(() => {
      if (cache.ahead.get(name) === entry) cache.ahead.delete(name);
    }),
  };
  return entry;
}

/**
 * The pipeline of a family's variant for `key`, built on first use (once per device). Encoding
 * is synchronous, so a stage compiles the variants of its steps while it opens (compileAhead),
 * then records one step of each shape to check that they are all built. Inside compileAhead's
 * recording, a missing variant starts compiling and comes back without a pipeline. A name
 * stands for one define set (wgsl_contract_test.ts checks the families), so a cached name is
 * reused without comparing defines: this runs per dispatch.
 */
export function kernelFor<K>(ctx: GpuContext, family: KernelFamily<K>, key: K): Kernel {
  const cache = cacheOf(ctx.device);
  let known = cache.variants.get(family);
  if (!known) cache.variants.set(family, known = new Map());
  // A void key (one-variant families) has no JSON.
  const json = JSON.stringify(key) ?? "";
  let v = known.get(json);
  if (!v) known.set(json, v = family.variant(ctx, key));
  const recording = cache.recording;
  recording?.names.add(v.name);
  let kernel = cache.kernels.get(v.name);
  if (!kernel) {
    if (recording?.ahead) {
      let entry = cache.ahead.get(v.name);
      if (!entry) {
        entry = buildAhead(ctx, family as KernelFamily<unknown>, v);
        cache.ahead.set(v.name, entry);
      }
      return entry.placeholder;
    }
    if (!recording) cache.late.push(v.name);
    kernel = build(ctx, family as KernelFamily<unknown>, v);
    cache.kernels.set(v.name, kernel);
  }
  return kernel;
}

function collect(ctx: GpuContext, ahead: boolean, record: () => void): Set<string> {
  const cache = cacheOf(ctx.device);
  if (cache.recording) throw new Error("Cannot collect kernel variants: a collection is running");
  const names = new Set<string>();
  cache.recording = { names, ahead };
  try {
    record();
  } finally {
    cache.recording = undefined;
  }
  return names;
}

/** The names of the variants `record` asks for; it builds the missing ones as usual. */
export function collectVariants(ctx: GpuContext, record: () => void): Set<string> {
  return collect(ctx, false, record);
}

/**
 * A variant the weight loader runs (wgsl/repack.wgsl), built now if missing: not a step's, so
 * never reported as built late (lateKernels).
 */
export function loaderKernel<K>(ctx: GpuContext, family: KernelFamily<K>, key: K): Kernel {
  let kernel: Kernel | undefined;
  collect(ctx, false, () => {
    kernel = kernelFor(ctx, family, key);
  });
  return kernel!;
}

/**
 * Starts compiling, with createComputePipelineAsync, every variant `record` asks for that is
 * not built yet, and returns at once. `record` must only record: its dispatches get kernels
 * without pipelines, so what it records cannot be encoded. A stage records its steps against
 * the shapes of its weights, before reading them, to compile while they load.
 */
export function compileAhead(ctx: GpuContext, record: () => void): KernelsAhead {
  const names = collect(ctx, true, record);
  const ahead = cacheOf(ctx.device).ahead;
  const entries = [...names].flatMap((n) => ahead.get(n) ?? []);
  return new KernelsAhead(ctx, names, entries);
}

/** The variants of one compileAhead, and their wait. */
export class KernelsAhead {
  readonly #ctx: GpuContext;
  readonly #entries: readonly Ahead[];

  constructor(ctx: GpuContext, readonly names: ReadonlySet<string>, entries: readonly Ahead[]) {
    this.#ctx = ctx;
    this.#entries = entries;
  }

  /** Variants this plan started or joined (the others were built already). */
  get compiling(): number {
    return this.#entries.length;
  }

  /** Those of them not finished yet. */
  get unfinished(): number {
    return this.#entries.filter((e) => e.outcome === undefined).length;
  }

  /**
   * Waits for the variants, up to `deadlineMs`, then builds the unfinished ones synchronously
   * (Dawn under Deno was seen to leave async pipelines unresolved; a late one is dropped when
   * it lands). Throws the first compile error, naming the kernel. Returns how many were late.
   */
  async settle(deadlineMs: number): Promise<number> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, deadlineMs);
    });
    try {
      await Promise.race([Promise.all(this.#entries.map((e) => e.done)), deadline]);
    } finally {
      clearTimeout(timer);
    }
    const failed = this.#entries.find((e) => e.outcome instanceof Error);
    if (failed) throw failed.outcome;
    const cache = cacheOf(this.#ctx.device);
    let late = 0;
    for (const { family, variant, outcome } of this.#entries) {
      if (outcome !== undefined || cache.kernels.has(variant.name)) continue;
      cache.kernels.set(variant.name, build(this.#ctx, family, variant));
      late++;
    }
    await settleKernels(this.#ctx);
    return late;
  }
}

/** Waits for every pipeline built so far; throws the first that failed to compile. */
export async function settleKernels(ctx: GpuContext): Promise<void> {
  const cache = cacheOf(ctx.device);
  const pending = cache.pending;
  cache.pending = [];
  await Promise.all(pending);
}

/** Builds one variant and waits for its compilation (tools that time or check one kernel). */
export async function compileKernel<K>(
  ctx: GpuContext,
  family: KernelFamily<K>,
  key: K,
): Promise<Kernel> {
  const kernel = kernelFor(ctx, family, key);
  await settleKernels(ctx);
  return kernel;
}

/**
 * The variants built on first use outside a recording, in order: each stalled the step that met
 * it while its pipeline compiled (a stage's recordSteps should have asked for it), unless a tool
 * built it on purpose (compileKernel).
 */
export function lateKernels(ctx: GpuContext): readonly string[] {
  return cacheOf(ctx.device).late;
}

/** A variant built earlier, by pipeline name (profiles report kernels by name). */
export function builtKernel(ctx: GpuContext, name: string): Kernel {
  const kernel = cacheOf(ctx.device).kernels.get(name);
  if (!kernel) throw new Error(`Cannot find kernel ${name}: no variant of that name was built`);
  return kernel;
}

/** Own enumerable keys of a plain object, without allocating their list (runs per dispatch). */
function countKeys(o: object): number {
  let n = 0;
  for (const _ in o) n++;
  return n;
}

/** What the name checks need of a kernel. */
type Named = Pick<Kernel, "name" | "file" | "iface">;

/** `named` in the kernel's binding order; every binding given, no other name. */
export function orderBindings<T>(kernel: Named, named: Readonly<Record<string, T>>): T[] {
  const { bindings } = kernel.iface;
  const out = bindings.map(({ name }) => {
    const b = named[name];
    if (b === undefined) {
      throw new TypeError(
        `Cannot dispatch ${kernel.name}: buffer "${name}" is missing; ${kernel.file} binds ${
          bindings.map((x) => x.name).join(", ")
        }`,
      );
    }
    return b;
  });
  if (countKeys(named) !== bindings.length) {
    const extra = Object.keys(named).filter((n) => !bindings.some((b) => b.name === n));
    throw new TypeError(
      `Cannot dispatch ${kernel.name}: ${kernel.file} has no binding ${extra.join(", ")}`,
    );
  }
  return out;
}

/** Writes `values` into `view` at `offset` in the order and types of the kernel's Params. */
export function packParams(
  kernel: Named,
  values: Readonly<Record<string, number>>,
  view: DataView,
  offset: number,
): void {
  const fields = kernel.iface.params;
  for (let i = 0; i < fields.length; i++) {
    const { name, type } = fields[i];
    const v = values[name];
    if (v === undefined || Number.isNaN(v)) {
      throw new TypeError(
        `Cannot pack the params of ${kernel.name}: "${name}" is ${v}, expected a ${type}`,
      );
    }
    if (type === "f32") view.setFloat32(offset + 4 * i, v, true);
    else if (type === "i32") view.setInt32(offset + 4 * i, v, true);
    else view.setUint32(offset + 4 * i, v, true);
  }
  if (countKeys(values) !== fields.length) {
    const extra = Object.keys(values).filter((n) => !fields.some((f) => f.name === n));
    throw new TypeError(
      `Cannot pack the params of ${kernel.name}: ${kernel.file}'s Params has no ${
        extra.join(", ")
      }`,
    );
  }
}
