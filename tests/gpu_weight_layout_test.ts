// The GPU layouts of Q8_0 and Q6_K (engine/gpu/weight_layout.ts), as wgsl/repack.wgsl writes them
// at upload: every value of random rows, read back and decoded as wgsl/_include/dequant.wgsl reads
// it, equals engine/quant/dequant.ts on the file's bytes, over split parts and reordered rows.

import assert from "node:assert/strict";
import { readBuffer } from "../engine/gpu/buffers.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import type { GpuTensor } from "../engine/gpu/tensor.ts";
import {
  gpuRowBytes,
  gpuTensorBytes,
  Q6_K_GPU_BLOCK,
  Q8_0_GPU_BLOCK,
} from "../engine/gpu/weight_layout.ts";
import { dequantize } from "../engine/quant/dequant.ts";
import { GgmlType, rowBytes, typeName } from "../engine/quant/ggml_types.ts";
import { randomBlocks } from "../tools/synth/quantize.ts";
import { gpuTest, rng, uploadWeights } from "./_gpu.ts";

/** Value e of the GPU-layout row at byte `o` of `bytes`, in f32 as the shader rounds it. */
function gpuValue(type: GgmlType, bytes: DataView, o: number, e: number): number {
  if (type === GgmlType.Q8_0) {
    const b = o + (e >> 8) * Q8_0_GPU_BLOCK;
    const d = bytes.getFloat16(b + 256 + 2 * ((e >> 5) & 7), true);
    return Math.fround(bytes.getInt8(b + (e & 255)) * d);
  }
  const b = o + (e >> 8) * Q6_K_GPU_BLOCK;
  const d = bytes.getFloat16(b + 272, true);
  const sc = bytes.getInt8(b + 256 + ((e & 255) >> 4));
  return Math.fround(Math.fround(d * sc) * (bytes.getUint8(b + (e & 255)) - 32));
}

/** Every value of every part of `t`, decoded from its GPU bytes, in row order. */
async function readValues(ctx: GpuContext, t: GpuTensor): Promise<Float32Array> {
  const out = new Float32Array(t.matrixRows * t.experts * t.cols);
  for (const part of t.parts) {
    const view = new DataView(await readBuffer(ctx, part.buffer, 0, part.rows * t.rowBytes));
    for (let r = 0; r < part.rows; r++) {
      for (let e = 0; e < t.cols; e++) {
        out[(part.firstRow + r) * t.cols + e] = gpuValue(t.type, view, r * t.rowBytes, e);
      }
    }
  }
  return out;
}

gpuTest("Q8_0 and Q6_K rows keep every value in their GPU layout, bit for bit", async (ctx) => {
  const r = rng(11);
  const cases: [GgmlType, number][] = [
    [GgmlType.Q6_K, 256],
    [GgmlType.Q6_K, 768],
    [GgmlType.Q8_0, 512],
    [GgmlType.Q8_0, 96],
    [GgmlType.Q8_0, 288],
  ];
  for (const [type, cols] of cases) {
    for (const scale of [1e-4, 0.5, 3]) {
      const rows = 7;
      const file = randomBlocks(type, rows * cols, scale, r);
      const want = dequantize(type, file, rows * cols);
      // Parts of three rows: rows past the first part start inside the file's bytes.
      const t = await uploadWeights(ctx, { name: "w", type, shape: [cols, rows] }, file, {
        maxPartBytes: 3 * gpuRowBytes(type, cols),
      });
      assert.equal(t.parts.length, 3);
      assert.equal(t.rowBytes, gpuRowBytes(type, cols));
      const got = await readValues(ctx, t);
      for (let i = 0; i < want.length; i++) {
        assert.ok(
          Object.is(got[i], want[i]),
          `${typeName(type)} ${cols} at ${scale}: value ${i} is ${got[i]}, the file's ${want[i]}`,
        );
      }
    }
  }
});

gpuTest("reordered Q8_0 rows are laid out after their order is applied", async (ctx) => {
  const [cols, rows] = [256, 5];
  const file = randomBlocks(GgmlType.Q8_0, rows * cols, 0.5, rng(3));
  const want = dequantize(GgmlType.Q8_0, file, rows * cols);
  const order = Uint32Array.of(3, 0, 4, 1, 2);
  const t = await uploadWeights(
    ctx,
    { name: "w", type: GgmlType.Q8_0, shape: [cols, rows] },
    file,
    {
      rowOrder: order,
    },
  );
  const got = await readValues(ctx, t);
  for (let r = 0; r < rows; r++) {
    assert.deepEqual(
      got.subarray(r * cols, (r + 1) * cols),
      want.subarray(order[r] * cols, (order[r] + 1) * cols),
      `row ${r} holds file row ${order[r]}`,
    );
  }
});

Deno.test("GPU rows: Q6_K 288 bytes a block, Q8_0 272 a 256 values, others their file size", () => {
  assert.equal(gpuRowBytes(GgmlType.Q6_K, 2048), 8 * 288);
  assert.equal(gpuRowBytes(GgmlType.Q8_0, 2048), rowBytes(GgmlType.Q8_0, 2048));
  assert.equal(gpuRowBytes(GgmlType.Q8_0, 96), 272);
  assert.equal(gpuRowBytes(GgmlType.IQ4_XS, 2048), rowBytes(GgmlType.IQ4_XS, 2048));
  assert.equal(gpuTensorBytes(GgmlType.Q6_K, [512, 3, 2]), 6 * 2 * 288);
});
