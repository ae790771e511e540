// One step's GPU work: dispatches, copies and clears recorded, then encoded in one command
// buffer with every dispatch's Params written to a uniform arena by a single writeBuffer.
// The forward pass (engine/gpu/gpu_forward.ts) records into a StepEncoder; kernel modules add dispatches.

import { type BufferRef, type GpuMemory, isSlice } from "./buffers.ts";
import type { GpuContext } from "./device.ts";
import {
  type Kernel,
  type KernelFamily,
  kernelFor,
  orderBindings,
  packParams,
  PARAMS_SLOT_BYTES,
} from "./kernel.ts";
import type { DispatchProfiler } from "./profiler.ts";

/** Workgroups of a dispatch: `tiles` along x (folded into y past the per-dimension limit), z. */
export interface Grid {
  readonly tiles: number;
  readonly z?: number;
}

type Command =
  | {
    readonly kind: "dispatch";
    readonly kernel: Kernel;
    readonly buffers: readonly BufferRef[];
    readonly slot: number;
    readonly size: readonly [number, number, number];
  }
  | {
    readonly kind: "copy";
    readonly src: GPUBuffer;
    readonly srcOffset: number;
    readonly dst: GPUBuffer;
    readonly dstOffset: number;
    readonly size: number;
  }
  | {
    readonly kind: "clear";
    readonly buffer: GPUBuffer;
    readonly offset: number;
    readonly size: number;
  };

/**
 * GPU timestamps of a step (timestamp-query): the first compute pass writes index 0 at its
 * start, the last writes index 1 at its end, and both are resolved into `resolve` (2 u64 ns).
 */
export interface StepTimer {
  readonly querySet: GPUQuerySet;
  readonly resolve: GPUBuffer;
}

/** A timer owned by `mem`, or undefined where the device has no timestamp-query. */
export function createStepTimer(mem: GpuMemory): StepTimer | undefined {
  if (!mem.ctx.features.timestamps) return undefined;
  return {
    querySet: mem.querySet({ type: "timestamp", count: 2 }),
    resolve: mem.buffer({
      label: "step timestamps",
      size: 16,
      // COPY_DST: a DispatchProfiler copies its first start and last end here instead.
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    }),
  };
}

/** A bind group built over one arena slot, and the layout and buffers it binds. */
interface SlotGroup {
  readonly layout: GPUBindGroupLayout;
  readonly refs: readonly BufferRef[];
  readonly group: GPUBindGroup;
}

/**
 * Bind groups kept per arena slot, most recent first: one per sequence slot whose step binds
 * its own state at that dispatch, so interleaved sequences reuse theirs.
 */
const GROUPS_PER_SLOT = 16;

function sameRefs(a: readonly BufferRef[], b: readonly BufferRef[]): boolean {
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    if (x === y) continue;
    if (!isSlice(x) || !isSlice(y)) return false;
    if (x.buffer !== y.buffer || x.offset !== y.offset || x.size !== y.size) return false;
  }
  return true;
}

const SLOT_WORDS = PARAMS_SLOT_BYTES / 4;

/**
 * The uniform buffer holding every dispatch's Params for a step, plus the bind groups built
 * over it. Dispatch i of a step always uses slot i, so a step that repeats the previous step's
 * sequence reuses all its bind groups. One arena per stage, its buffer owned by the stage's
 * GpuMemory.
 */
export class ParamArena {
  #mem: GpuMemory;
  #buffer: GPUBuffer;
  #slots: number;
  /** Per slot, the bind groups built over it (SlotGroup). */
  readonly bindGroups: SlotGroup[][] = [];

  constructor(mem: GpuMemory, slots = 256) {
    this.#mem = mem;
    this.#slots = slots;
    this.#buffer = this.#create(slots);
  }

  #create(slots: number): GPUBuffer {
    return this.#mem.buffer({
      label: "params arena",
      size: slots * PARAMS_SLOT_BYTES,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
  }

  get buffer(): GPUBuffer {
    return this.#buffer;
  }

  /** Slots the arena holds: a step recording at most this many dispatches never regrows it. */
  get slots(): number {
    return this.#slots;
  }

  /**
   * Makes room for `slots` slots before a step's bind groups are built: growing replaces the
   * buffer and drops the bind groups, so steps encoded earlier must be encoded again.
   */
  reserve(slots: number): void {
    if (slots <= this.#slots) return;
    this.#mem.free(this.#buffer);
    this.#slots = Math.max(slots, 2 * this.#slots);
    this.#buffer = this.#create(this.#slots);
    this.bindGroups.length = 0;
  }

  /** Uploads `slots` slots of packed Params (queued before the step that reads them). */
  upload(words: Uint32Array<ArrayBuffer>, slots: number): void {
    // A typed array's offset and size count elements.
    this.#mem.ctx.device.queue.writeBuffer(this.#buffer, 0, words, 0, slots * SLOT_WORDS);
  }
}

/** Where a command buffer puts a StepTimer's marks (a step encoded in several puts each once). */
export interface TimerMarks {
  readonly timer: StepTimer;
  /** Writes the GPU time at this buffer's first dispatch (index 0). */
  readonly start: boolean;
  /** Writes the GPU time after its last dispatch (index 1) and resolves both. */
  readonly end: boolean;
}

/** Words written into a buffer when the step that reads them is submitted (StepEncoder.upload). */
interface Upload {
  readonly buffer: GPUBuffer;
  readonly offset: number;
  readonly data: Uint32Array<ArrayBuffer>;
}

/**
 * A step encoded into a command buffer and not yet submitted: its Params (and its uploads) go to
 * the GPU when it is submitted, so it can be encoded while the GPU still runs the step before it.
 */
export class EncodedStep {
  readonly dispatches: number;
  readonly #ctx: GpuContext;
  readonly #arena: ParamArena;
  readonly #arenaBuffer: GPUBuffer;
  readonly #words: Uint32Array<ArrayBuffer>;
  readonly #uploads: readonly Upload[];
  readonly #commands: GPUCommandBuffer;

  constructor(
    ctx: GpuContext,
    arena: ParamArena,
    words: Uint32Array<ArrayBuffer>,
    dispatches: number,
    uploads: readonly Upload[],
    commands: GPUCommandBuffer,
  ) {
    this.#ctx = ctx;
    this.#arena = arena;
    this.#arenaBuffer = arena.buffer;
    this.#words = words;
    this.dispatches = dispatches;
    this.#uploads = uploads;
    this.#commands = commands;
  }

  /** Its bind groups name an arena that was replaced since: encode the step again. */
  get stale(): boolean {
    return this.#arena.buffer !== this.#arenaBuffer;
  }

  /** Uploads the Params and the step's uploads, and submits; once only. */
  submit(): void {
    if (this.dispatches) this.#arena.upload(this.#words, this.dispatches);
    const { queue } = this.#ctx.device;
    for (const u of this.#uploads) queue.writeBuffer(u.buffer, u.offset, u.data);
    queue.submit([this.#commands]);
  }
}

export class StepEncoder {
  readonly ctx: GpuContext;
  #arena: ParamArena;
  #commands: Command[] = [];
  #uploads: Upload[] = [];
  /** Packed Params, one arena slot per dispatch; allocated at the first dispatch, arena-sized. */
  #words = new Uint32Array(0);
  #view = new DataView(this.#words.buffer);
  #dispatches = 0;

  constructor(ctx: GpuContext, arena: ParamArena) {
    this.ctx = ctx;
    this.#arena = arena;
  }

  /** Number of dispatches recorded so far. */
  get dispatches(): number {
    return this.#dispatches;
  }

  /**
   * Records one dispatch of the family's variant for `key` (built on first use). `buffers` and
   * `params` are keyed by the names the variant's WGSL declares: its bindings and its Params
   * fields, all of them and nothing else.
   */
  dispatch<K>(
    family: KernelFamily<K>,
    key: K,
    buffers: Readonly<Record<string, BufferRef>>,
    params: Readonly<Record<string, number>>,
    grid: Grid,
  ): void {
    const kernel = kernelFor(this.ctx, family, key);
    const refs = orderBindings(kernel, buffers);
    const max = this.ctx.limits.maxComputeWorkgroupsPerDimension;
    const z = grid.z ?? 1;
    if (grid.tiles <= 0 || z <= 0) return;
    const y = Math.ceil(grid.tiles / max);
    const x = Math.ceil(grid.tiles / y);
    if (y > max || z > max) {
      throw new RangeError(
        `Cannot dispatch ${kernel.name}: ${grid.tiles} x ${z} workgroups exceed the device's grid`,
      );
    }
    const slot = this.#dispatches;
    if ((slot + 1) * SLOT_WORDS > this.#words.length) {
      const grown = new Uint32Array(
        Math.max(2 * this.#words.length, this.#arena.slots * SLOT_WORDS),
      );
      grown.set(this.#words);
      this.#words = grown;
      this.#view = new DataView(grown.buffer);
    }
    packParams(kernel, params, this.#view, slot * PARAMS_SLOT_BYTES);
    this.#commands.push({ kind: "dispatch", kernel, buffers: refs, slot, size: [x, y, z] });
    this.#dispatches++;
  }

  /** Records a buffer-to-buffer copy (sizes and offsets multiples of 4). */
  copy(src: GPUBuffer, srcOffset: number, dst: GPUBuffer, dstOffset: number, size: number): void {
    if (size > 0) this.#commands.push({ kind: "copy", src, srcOffset, dst, dstOffset, size });
  }

  /**
   * Writes `data` at byte `offset` of `buffer` when the step is submitted, before its commands
   * run: what a step's dispatches read that its recording decides (a list of rows), written no
   * earlier, since the step before may still be reading the buffer.
   */
  upload(buffer: GPUBuffer, offset: number, data: Uint32Array<ArrayBuffer>): void {
    if (data.length) this.#uploads.push({ buffer, offset, data });
  }

  /** Records zero-filling `size` bytes of `buffer` from `offset`. */
  clear(buffer: GPUBuffer, offset = 0, size = buffer.size - offset): void {
    if (size > 0) this.#commands.push({ kind: "clear", buffer, offset, size });
  }

  #bindGroup(kernel: Kernel, refs: readonly BufferRef[], slot: number): GPUBindGroup {
    const arena = this.#arena;
    const built = (arena.bindGroups[slot] ??= []);
    const layout = kernel.bindGroupLayout;
    const at = built.findIndex((g) => g.layout === layout && sameRefs(g.refs, refs));
    if (at >= 0) {
      const hit = built[at];
      if (at > 0) {
        built.splice(at, 1);
        built.unshift(hit);
      }
      return hit.group;
    }
    const entries: GPUBindGroupEntry[] = refs.map((r, i) => ({
      binding: i,
      resource: isSlice(r) ? { buffer: r.buffer, offset: r.offset, size: r.size } : { buffer: r },
    }));
    entries.push({
      binding: refs.length,
      resource: { buffer: arena.buffer, offset: slot * PARAMS_SLOT_BYTES, size: PARAMS_SLOT_BYTES },
    });
    const group = this.ctx.device.createBindGroup({ label: kernel.name, layout, entries });
    built.unshift({ layout, refs, group });
    if (built.length > GROUPS_PER_SLOT) built.pop();
    return group;
  }

  /** Records a dispatch into `pass`, whose pipeline is `bound`; returns the pipeline now set. */
  #record(
    pass: GPUComputePassEncoder,
    c: Extract<Command, { kind: "dispatch" }>,
    bound: GPUComputePipeline | undefined,
  ): GPUComputePipeline {
    // Each call crosses into the provider (Node-API for Dawn): skip the ones that change nothing.
    const pipeline = c.kernel.pipeline;
    if (pipeline !== bound) pass.setPipeline(pipeline);
    pass.setBindGroup(0, this.#bindGroup(c.kernel, c.buffers, c.slot));
    pass.dispatchWorkgroups(c.size[0], c.size[1], c.size[2]);
    return pipeline;
  }

  /**
   * Encodes everything recorded into one command buffer and submits it. With a timer, the
   * step's GPU start and end land in timer.resolve before any copy recorded after the last
   * dispatch, so such a copy can read them back. With a profiler, every dispatch gets a pass of
   * its own, labelled with its kernel, whose start and end the profiler records.
   */
  submit(timer?: StepTimer, profiler?: DispatchProfiler): void {
    this.encode(timer && { timer, start: true, end: true }, profiler).submit();
  }

  /**
   * Encodes everything recorded into one command buffer, to submit later (EncodedStep), and
   * starts the encoder afresh. `marks` and `profiler` as in submit().
   */
  encode(marks?: TimerMarks, profiler?: DispatchProfiler): EncodedStep {
    const n = this.#dispatches;
    this.#arena.reserve(n);
    const enc = this.ctx.device.createCommandEncoder();
    profiler?.begin(this.#commands.flatMap((c) => c.kind === "dispatch" ? [c.kernel.name] : []));
    const timer = marks?.timer;
    const first = marks?.start ? this.#commands.findIndex((c) => c.kind === "dispatch") : -1;
    const last = this.#commands.findLastIndex((c) => c.kind === "dispatch");
    let lastPass = false;
    let pass: GPUComputePassEncoder | undefined;
    let pipeline: GPUComputePipeline | undefined;
    const endPass = () => {
      pass?.end();
      pass = undefined;
      pipeline = undefined;
      if (timer && lastPass) enc.resolveQuerySet(timer.querySet, 0, 2, timer.resolve, 0);
      lastPass = false;
    };
    for (const [i, c] of this.#commands.entries()) {
      if (c.kind === "dispatch" && profiler) {
        const own = enc.beginComputePass({
          label: c.kernel.name,
          timestampWrites: profiler.timestampWrites(c.slot),
        });
        this.#record(own, c, undefined);
        own.end();
        if (i === last) profiler.resolve(enc, marks?.end ? timer?.resolve : undefined);
        continue;
      }
      if (c.kind === "dispatch") {
        if (!pass) {
          // The pass starting here runs until the next copy/clear: does it hold the last dispatch?
          const next = this.#commands.findIndex((d, j) => j > i && d.kind !== "dispatch");
          lastPass = !!marks?.end && last < (next < 0 ? Infinity : next);
          pass = enc.beginComputePass(
            timer && (i === first || lastPass)
              ? {
                timestampWrites: {
                  querySet: timer.querySet,
                  beginningOfPassWriteIndex: i === first ? 0 : undefined,
                  endOfPassWriteIndex: lastPass ? 1 : undefined,
                },
              }
              : undefined,
          );
        }
        pipeline = this.#record(pass, c, pipeline);
        continue;
      }
      endPass();
      if (c.kind === "copy") enc.copyBufferToBuffer(c.src, c.srcOffset, c.dst, c.dstOffset, c.size);
      else enc.clearBuffer(c.buffer, c.offset, c.size);
    }
    endPass();
    const step = new EncodedStep(
      this.ctx,
      this.#arena,
      this.#words,
      n,
      this.#uploads,
      enc.finish(),
    );
    // The step owns the words now; an encoder that records again starts new ones.
    this.#words = new Uint32Array(0);
    this.#view = new DataView(this.#words.buffer);
    this.#commands = [];
    this.#uploads = [];
    this.#dispatches = 0;
    return step;
  }
}
