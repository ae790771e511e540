// Shared set-up for the GPU tests: one device per test process, the skip flag, seeded random
// data, readbacks and error bounds. Imported by tests/gpu_*_test.ts.
//
// Tests skip only when there is no WebGPU adapter at all; CI's Mesa CPU adapter runs them.
// TANDEM_GPU=dawn|auto runs them on another provider (default: Deno's builtin WebGPU).

import { GpuMemory, readBuffer, uploadStorage } from "../engine/gpu/buffers.ts";
import { type GpuContext, openGpu } from "../engine/gpu/device.ts";
import type { ProviderChoice } from "../engine/gpu/provider.ts";
import {
  type GpuTensor,
  type TensorDesc,
  type UploadOptions,
  uploadTensorBytes,
} from "../engine/gpu/tensor.ts";
import { ParamArena, StepEncoder } from "../engine/gpu/encoder.ts";

/** Seeded uniforms in [0, 1) for test data (shared with the fuzz tests). */
export { rng } from "./_fuzz.ts";

/** A device of its own on the tests' provider (a fresh kernel cache); undefined without one. */
export async function openTestGpu(): Promise<GpuContext | undefined> {
  try {
    const gpu = (Deno.env.get("TANDEM_GPU") ?? "builtin") as ProviderChoice;
    return await openGpu({ gpu, allowSoftware: true, log: () => {} });
  } catch {
    return undefined;
  }
}

const opened = await openTestGpu();

/** True when no adapter could be opened: GPU tests are then skipped. */
export const ignore = opened === undefined;

/** Registers a GPU test that receives the shared device. */
export function gpuTest(name: string, fn: (ctx: GpuContext) => Promise<void>): void {
  Deno.test({ name, ignore, fn: () => fn(opened!) });
}

/** Records GPU work with `record`, submits it as one step, and fails on a validation error. */
export async function submit(ctx: GpuContext, record: (enc: StepEncoder) => void): Promise<void> {
  const enc = new StepEncoder(ctx, new ParamArena(new GpuMemory(ctx), 16));
  record(enc);
  ctx.device.pushErrorScope("validation");
  enc.submit();
  const error = await ctx.device.popErrorScope();
  if (error) throw new Error(`The GPU rejected the step: ${error.message}`);
}

/** n values uniform on [-scale, scale). */
export function randomF32(n: number, r: () => number, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, () => (2 * r() - 1) * scale);
}

/** A storage buffer holding f32 or u32 values. */
export function upload(
  ctx: GpuContext,
  data: Float32Array | Uint32Array,
  label = "test",
): GPUBuffer {
  return uploadStorage(ctx, label, data);
}

/** A weight tensor from GGUF-layout bytes, in memory the test process keeps until it ends. */
export function uploadWeights(
  ctx: GpuContext,
  desc: TensorDesc,
  bytes: Uint8Array,
  options?: UploadOptions,
): Promise<GpuTensor> {
  return uploadTensorBytes(new GpuMemory(ctx), desc, bytes, options);
}

export async function readF32(
  ctx: GpuContext,
  b: GPUBuffer,
  n: number,
  at = 0,
): Promise<Float32Array> {
  return new Float32Array(await readBuffer(ctx, b, at * 4, n * 4));
}

export async function readU32(
  ctx: GpuContext,
  b: GPUBuffer,
  n: number,
  at = 0,
): Promise<Uint32Array> {
  return new Uint32Array(await readBuffer(ctx, b, at * 4, n * 4));
}

/**
 * Asserts |actual[i] − expected[i]| ≤ tol·scale[i] for every i, where scale[i] is the size of the
 * terms that made expected[i] (e.g. Σ|w·x| of a dot product), so the bound follows the
 * conditioning of each value instead of failing on cancellation. Reports the worst element.
 */
export function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  scale: ArrayLike<number> | number,
  tol: number,
  what: string,
): void {
  if (actual.length !== expected.length) {
    throw new Error(`${what}: got ${actual.length} values, expected ${expected.length}`);
  }
  let worst = -1;
  let worstRatio = 0;
  for (let i = 0; i < expected.length; i++) {
    const s = typeof scale === "number" ? scale : scale[i];
    const ratio = Math.abs(actual[i] - expected[i]) / Math.max(s, 1e-30);
    if (!(ratio <= worstRatio)) {
      worstRatio = ratio;
      worst = i;
    }
  }
  if (worst >= 0 && !(worstRatio <= tol)) {
    throw new Error(
      `${what}: element ${worst} is ${actual[worst]}, expected ${expected[worst]} (error ${
        worstRatio.toExponential(2)
      } of its scale, bound ${tol})`,
    );
  }
}
