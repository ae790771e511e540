// The tensor-core kernels' WGSL (wgsl/mul_mat_mma.wgsl, wgsl/mma_input.wgsl) through Tint on any
// machine: Dawn's null backend lists subgroup matrices, so it compiles every variant kind and
// builds the pipelines whose workgroup memory fits it; and the variants only a GPU box's workgroup
// memory runs (attention's workgroups of 8 tokens, beyond Mesa's 32 KB); and decode variants whose
// subgroup code Mesa's builtin provider does not compile. A WGSL error fails here, in CI, not on
// the GPU box.

import assert from "node:assert/strict";
import { dawnOptions } from "../engine/gpu/dawn.ts";
import { SUBGROUP_MATRIX_FEATURE } from "../engine/gpu/device.ts";
import { type KernelFamily, type KernelTarget, variantSource } from "../engine/gpu/kernel.ts";
import { ATTENTION, attentionWorkgroupBytes } from "../engine/gpu/kernels/attention.ts";
import { MMA_INPUT } from "../engine/gpu/kernels/mma_input.ts";
import { MUL_MAT_TYPES } from "../engine/gpu/kernels/mul_mat.ts";
import {
  mmaStagesF32,
  mmaTakes,
  type MmaTile,
  mmaWorkgroupBytes,
  MUL_MAT_MMA,
  type MulMatMmaKey,
} from "../engine/gpu/kernels/mul_mat_mma.ts";
import {
  MUL_MAT_VEC,
  type MulMatVecKey,
  workgroupBytes,
} from "../engine/gpu/kernels/mul_mat_vec.ts";
import { GgmlType } from "../engine/quant/ggml_types.ts";

/** Dawn on its null backend, held by the module: the instance must outlive its devices. */
const nullGpu = (await import("webgpu") as unknown as { create(options: string[]): GPU })
  .create(dawnOptions("backend=null"));

const TILES: readonly MmaTile[] = ([64, 128] as const).flatMap((rows) =>
  ([32, 64, 128] as const).flatMap((tokens) =>
    ([1, 2] as const).map((stages) => ({ rows, tokens, stages }))
  )
);

/**
 * Every weight type the tensor cores take in the engine's tiles for the bench model's products
 * (dense with the add epilogue, gathered experts), and two types (one with prefetching, one
 * without) in every tile `target` holds with every flag, the emulated matrix operations and the
 * single-product precision included.
 */
function keys(target: KernelTarget): MulMatMmaKey[] {
  const everyType = MUL_MAT_TYPES.filter(mmaTakes).flatMap((type): MulMatMmaKey[] => [
    { type, tile: { rows: 128, tokens: 128, stages: 1 }, prefetch: true, add: true },
    { type, tile: { rows: 128, tokens: 32, stages: 2 }, prefetch: true, id: true },
  ]);
  const everyTile = [GgmlType.Q8_0, GgmlType.Q6_K].flatMap((type) =>
    TILES.flatMap((tile): MulMatMmaKey[] => [
      { type, tile, prefetch: true },
      { type, tile, add: true },
      { type, tile, prefetch: true, id: true, add: true },
      { type, tile, prefetch: true, id: true, emulate: true },
      { type, tile, precision: "f16", prefetch: true, add: true },
    ])
  );
  return [...everyType, ...everyTile].filter((k) =>
    mmaWorkgroupBytes(k.tile, mmaStagesF32(target, k.emulate), k.precision) <=
      target.limits.maxComputeWorkgroupStorageSize
  );
}

/**
 * The errors Tint and pipeline validation report for one variant, as text ("" if none); the
 * pipeline is built where the device holds its workgroup memory (`bytes`, for other families
 * than the tensor cores').
 */
async function compile<K>(
  device: GPUDevice,
  target: KernelTarget,
  family: KernelFamily<K>,
  key: K,
  bytes = 0,
): Promise<string> {
  const v = family.variant(target, key);
  const { code } = variantSource(family as KernelFamily<unknown>, v);
  const module = device.createShaderModule({ label: v.name, code });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === "error")
    .map((m) => `${v.name}:${m.lineNum}: ${m.message}`);
  const mma = key as MulMatMmaKey;
  const fits = family !== (MUL_MAT_MMA as unknown)
    ? bytes <= device.limits.maxComputeWorkgroupStorageSize
    : mmaWorkgroupBytes(mma.tile, mmaStagesF32(target, mma.emulate), mma.precision) <=
      device.limits.maxComputeWorkgroupStorageSize;
  if (!errors.length && fits) {
    device.pushErrorScope("validation");
    device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    const error = await device.popErrorScope();
    if (error) errors.push(`${v.name} (pipeline): ${error.message}`);
  }
  return errors.join("\n");
}

/**
 * Variants for a device like the GPU box's (48 KB of workgroup memory); the null device has 16 KB,
 * so the larger tiles, and every tile of the split products, compile as modules only.
 */
const BOX: KernelTarget = {
  features: { f16: true, subgroups: true, timestamps: false, subgroupMatrix: true },
  limits: {
    maxBufferSize: 2 ** 30,
    maxStorageBufferBindingSize: 2 ** 30,
    maxComputeWorkgroupStorageSize: 49152,
    maxComputeInvocationsPerWorkgroup: 1024,
    maxComputeWorkgroupsPerDimension: 65535,
    minUniformBufferOffsetAlignment: 256,
    minStorageBufferOffsetAlignment: 256,
    maxStorageBuffersPerShaderStage: 8,
    subgroupMinSize: 32,
  },
};

Deno.test("every tensor-core kernel variant compiles through Tint (Dawn's null backend)", async () => {
  const adapter = await nullGpu.requestAdapter();
  assert.ok(adapter, "Dawn's null backend gives an adapter");
  const requiredFeatures: GPUFeatureName[] = ["shader-f16", "subgroups", SUBGROUP_MATRIX_FEATURE];
  for (const f of requiredFeatures) assert.ok(adapter.features.has(f), `the null adapter has ${f}`);
  const device = await adapter.requestDevice({ requiredFeatures });
  try {
    const target = BOX;
    const errors: string[] = [];
    let pipelines = 0;
    const all = keys(target);
    assert.ok(all.length >= 100, `${all.length} variants fit the box's workgroup memory`);
    for (const key of all) {
      errors.push(await compile(device, target, MUL_MAT_MMA, key));
      const bytes = mmaWorkgroupBytes(key.tile, false, key.precision);
      if (bytes <= device.limits.maxComputeWorkgroupStorageSize) pipelines++;
    }
    for (const swiglu of [false, true]) {
      for (const split of [false, true]) {
        errors.push(await compile(device, target, MMA_INPUT, { swiglu, split }));
      }
    }
    // The emulation on a device without shader-f16 keeps its staged values as f32.
    const noF16 = { ...target, features: { ...target.features, f16: false } };
    const tile: MmaTile = { rows: 64, tokens: 32, stages: 1 };
    errors.push(
      await compile(device, noF16, MUL_MAT_MMA, { type: GgmlType.IQ4_XS, tile, emulate: true }),
    );
    assert.equal(errors.filter((e) => e).join("\n"), "");
    assert.ok(pipelines >= 3, `${pipelines} tile variants were built as whole pipelines`);
  } finally {
    device.destroy();
  }
});

Deno.test("attention's workgroups of 8 tokens compile through Tint (Dawn's null backend)", async () => {
  const adapter = await nullGpu.requestAdapter();
  assert.ok(adapter, "Dawn's null backend gives an adapter");
  const device = await adapter.requestDevice();
  try {
    const bytes = attentionWorkgroupBytes(8);
    assert.ok(
      bytes > 32768 && bytes <= BOX.limits.maxComputeWorkgroupStorageSize,
      `${bytes} bytes`,
    );
    const errors: string[] = [];
    for (const dh of [64, 128, 256]) {
      errors.push(await compile(device, BOX, ATTENTION, { dh, tq: 8 }, bytes));
    }
    assert.equal(errors.filter((e) => e).join("\n"), "");
  } finally {
    device.destroy();
  }
});

Deno.test("the router's pair with two tokens a workgroup compiles through Tint (Dawn's null backend)", async () => {
  const adapter = await nullGpu.requestAdapter();
  assert.ok(adapter, "Dawn's null backend gives an adapter");
  const device = await adapter.requestDevice({ requiredFeatures: ["subgroups"] });
  try {
    // The shared expert's gate|up beside the router in a step of 2-4 rows (mulMatPair), with
    // subgroups, which Mesa's builtin provider does not compile.
    const key: MulMatVecKey = {
      type: GgmlType.Q8_0,
      layout: { wg: 128, cu: 16, rpt: 1, xstage: true },
      norm: true,
      pairF32: true,
      tokens: 2,
    };
    assert.equal(await compile(device, BOX, MUL_MAT_VEC, key, workgroupBytes(key)), "");
  } finally {
    device.destroy();
  }
});
