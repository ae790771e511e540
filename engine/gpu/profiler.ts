// Per-dispatch GPU timing (timestamp-query), opt-in from outside the forward pass: given one,
// StepEncoder.submit opens a compute pass per dispatch and writes its start and end here.

import type { GpuContext } from "./device.ts";

/** One dispatch's GPU interval, in the order the step encoded it. */
export interface DispatchTiming {
  /** The kernel variant's name (its pipeline label), e.g. "mul_mat_Q4_K_t8_add". */
  readonly kernel: string;
  readonly startNs: number;
  readonly endNs: number;
}

/** One profiled step: every dispatch, and the span from the first start to the last end. */
export interface ProfiledStep {
  readonly dispatches: readonly DispatchTiming[];
  readonly spanNs: number;
}

/** Timestamps per query set: WebGPU caps a query set at 4096 queries. */
const QUERIES_PER_SET = 4096;

/**
 * Collects the timestamps of one step at a time: pass it to StepEncoder.submit, then `collect()`
 * once the step's outputs are back (a GPU stage given one collects each step itself). A pass per
 * dispatch costs some overlap and a little launch time, so wall times under a profiler are an
 * upper bound of the unprofiled ones.
 */
export class DispatchProfiler {
  readonly #ctx: GpuContext;
  #sets: GPUQuerySet[] = [];
  #resolve: GPUBuffer | undefined;
  #readback: GPUBuffer | undefined;
  #pending: readonly string[] | undefined;

  constructor(ctx: GpuContext) {
    if (!ctx.features.timestamps) {
      throw new Error(
        `Cannot profile dispatches on "${ctx.summary}": the device has no timestamp-query; time whole steps by the wall clock instead`,
      );
    }
    this.#ctx = ctx;
  }

  /** Capacity for `n` dispatches (2 timestamps each), reallocated only when it grows. */
  #reserve(n: number): void {
    const sets = Math.ceil((2 * n) / QUERIES_PER_SET);
    if (sets <= this.#sets.length) return;
    this.#destroyBuffers();
    const { device } = this.#ctx;
    this.#sets = Array.from(
      { length: sets },
      (_, i) =>
        device.createQuerySet({
          label: `dispatch timestamps ${i}`,
          type: "timestamp",
          count: QUERIES_PER_SET,
        }),
    );
    const bytes = sets * QUERIES_PER_SET * 8;
    this.#resolve = device.createBuffer({
      label: "dispatch timestamps",
      size: bytes,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    });
    this.#readback = device.createBuffer({
      label: "dispatch timestamps readback",
      size: bytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
  }

  /** Starts a step of dispatches running `kernels` (names, in encoding order). */
  begin(kernels: readonly string[]): void {
    if (this.#pending) {
      throw new Error(
        `Cannot profile a new step: the previous one (${this.#pending.length} dispatches) was not collected; await collect() after each step`,
      );
    }
    this.#reserve(kernels.length);
    this.#pending = kernels;
  }

  /** Where dispatch `i` of the step begun last writes its start and end. */
  timestampWrites(i: number): GPUComputePassTimestampWrites {
    const q = 2 * i;
    return {
      querySet: this.#sets[Math.floor(q / QUERIES_PER_SET)],
      beginningOfPassWriteIndex: q % QUERIES_PER_SET,
      endOfPassWriteIndex: (q % QUERIES_PER_SET) + 1,
    };
  }

  /**
   * Encodes, after the last dispatch, the resolve of every timestamp into the readback and,
   * where `span` is given, the first start and last end as 2 u64 ns at its offsets 0 and 8
   * (the layout of a StepTimer's resolve buffer).
   */
  resolve(enc: GPUCommandEncoder, span?: GPUBuffer): void {
    const n = this.#pending?.length ?? 0;
    if (!n || !this.#resolve || !this.#readback) return;
    const queries = 2 * n;
    for (let s = 0; s * QUERIES_PER_SET < queries; s++) {
      const count = Math.min(QUERIES_PER_SET, queries - s * QUERIES_PER_SET);
      enc.resolveQuerySet(this.#sets[s], 0, count, this.#resolve, s * QUERIES_PER_SET * 8);
    }
    enc.copyBufferToBuffer(this.#resolve, 0, this.#readback, 0, queries * 8);
    if (span) {
      enc.copyBufferToBuffer(this.#resolve, 0, span, 0, 8);
      enc.copyBufferToBuffer(this.#resolve, (queries - 1) * 8, span, 8, 8);
    }
  }

  /** The timings of the step begun last; call once its command buffer was submitted. */
  async collect(): Promise<ProfiledStep> {
    const kernels = this.#pending;
    if (!kernels) {
      throw new Error("Cannot collect dispatch timings: no profiled step was submitted");
    }
    this.#pending = undefined;
    if (!kernels.length || !this.#readback) return { dispatches: [], spanNs: 0 };
    const bytes = 2 * kernels.length * 8;
    await this.#readback.mapAsync(GPUMapMode.READ, 0, bytes);
    const ns = new BigUint64Array(this.#readback.getMappedRange(0, bytes).slice(0));
    this.#readback.unmap();
    const base = ns[0];
    const at = (q: number) => Number(ns[q] - base);
    const dispatches = kernels.map((kernel, i) => ({
      kernel,
      startNs: at(2 * i),
      endNs: at(2 * i + 1),
    }));
    return { dispatches, spanNs: at(ns.length - 1) };
  }

  #destroyBuffers(): void {
    for (const s of this.#sets) s.destroy();
    this.#resolve?.destroy();
    this.#readback?.destroy();
  }

  destroy(): void {
    this.#destroyBuffers();
    this.#sets = [];
    this.#resolve = this.#readback = undefined;
  }
}
