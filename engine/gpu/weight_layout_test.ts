// Q8_0's and Q6_K's GPU layouts hold the file's values: every element of repacked random rows,
// read as wgsl/_include/dequant.wgsl reads it, equals engine/quant/dequant.ts on the file's bytes.

import assert from "node:assert/strict";
import { dequantize } from "../quant/dequant.ts";
import { GgmlType, rowBytes } from "../quant/ggml_types.ts";
import { rng } from "../../tests/_fuzz.ts";
import { randomBlocks } from "../../tools/synth/random_blocks.ts";
import {
  gpuRowBytes,
  gpuTensorBytes,
  Q6_K_GPU_BLOCK,
  Q8_0_GPU_BLOCK,
  repackRows,
} from "./weight_layout.ts";

/** Element e of a GPU-layout row at `o`, in f32 as the shader rounds it. */
function gpuValue(type: GgmlType, bytes: Uint8Array, o: number, e: number): number {
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  if (type === GgmlType.Q8_0) {
    const b = o + (e >> 8) * Q8_0_GPU_BLOCK;
    const d = view.getFloat16(b + 256 + 2 * ((e >> 5) & 7), true);
    return Math.fround(view.getInt8(b + (e & 255)) * d);
  }
  const b = o + (e >> 8) * Q6_K_GPU_BLOCK;
  const d = view.getFloat16(b + 272, true);
  const sc = view.getInt8(b + 256 + ((e & 255) >> 4));
  return Math.fround(Math.fround(d * sc) * (bytes[b + (e & 255)] - 32));
}

Deno.test("repackRows() keeps every Q8_0 and Q6_K value, bit for bit", () => {
  const r = rng(11);
  const cases: [GgmlType, number][] = [
    [GgmlType.Q6_K, 256],
    [GgmlType.Q6_K, 768],
    [GgmlType.Q8_0, 2048],
    [GgmlType.Q8_0, 96],
    [GgmlType.Q8_0, 288],
  ];
  for (const [type, cols] of cases) {
    for (const scale of [1e-4, 0.02, 3]) {
      const rows = 5;
      const file = randomBlocks(type, rows * cols, scale, r);
      const want = dequantize(type, file, rows * cols);
      const gpu = new Uint8Array(rows * gpuRowBytes(type, cols));
      repackRows(type, cols, file, gpu);
      for (let i = 0; i < rows * cols; i++) {
        const row = Math.floor(i / cols);
        const got = gpuValue(type, gpu, row * gpuRowBytes(type, cols), i % cols);
        assert.ok(Object.is(got, want[i]), `${type} ${cols}: value ${i} at ${scale}: ${got}`);
      }
    }
  }
});

Deno.test("GPU rows: Q6_K 288 bytes a block, Q8_0 272 a 256 values, others their file size", () => {
  assert.equal(gpuRowBytes(GgmlType.Q6_K, 2048), 8 * 288);
  assert.equal(gpuRowBytes(GgmlType.Q8_0, 2048), rowBytes(GgmlType.Q8_0, 2048));
  assert.equal(gpuRowBytes(GgmlType.Q8_0, 96), 272);
  assert.equal(gpuRowBytes(GgmlType.IQ4_XS, 2048), rowBytes(GgmlType.IQ4_XS, 2048));
  assert.equal(gpuTensorBytes(GgmlType.Q6_K, [512, 3, 2]), 6 * 2 * 288);
  const same = new Uint8Array(136).map((_, i) => i);
  const out = new Uint8Array(136);
  repackRows(GgmlType.IQ4_XS, 256, same, out);
  assert.deepEqual(out, same);
  assert.throws(
    () => repackRows(GgmlType.Q6_K, 256, new Uint8Array(211), new Uint8Array(288)),
    /not whole rows/,
  );
});
