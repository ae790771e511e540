// Q6_K's GPU layout holds the file's values: every element of repacked random blocks, read as
// wgsl/_include/dequant.wgsl reads it, equals engine/quant/dequant.ts on the file's bytes.

import assert from "node:assert/strict";
import { dequantize } from "../quant/dequant.ts";
import { GgmlType, rowBytes } from "../quant/ggml_types.ts";
import { rng } from "../../tests/_fuzz.ts";
import { randomBlocks } from "../../tools/synth/random_blocks.ts";
import { gpuRowBytes, gpuTensorBytes, Q6_K_GPU_BLOCK, repackRows } from "./weight_layout.ts";

/** Element e of a GPU-layout Q6_K block at `o`: (d·sc)·(q − 32), in f32 as the shader rounds. */
function gpuQ6K(bytes: Uint8Array, o: number, e: number): number {
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  const d = view.getFloat16(o + 272, true);
  const sc = view.getInt8(o + 256 + (e >> 4));
  return Math.fround(Math.fround(d * sc) * (bytes[o + e] - 32));
}

Deno.test("repackRows() keeps every Q6_K value, bit for bit", () => {
  const r = rng(11);
  for (const scale of [1e-4, 0.02, 3]) {
    const n = 256 * 12;
    const file = randomBlocks(GgmlType.Q6_K, n, scale, r);
    const want = dequantize(GgmlType.Q6_K, file, n);
    const gpu = new Uint8Array((n / 256) * Q6_K_GPU_BLOCK);
    repackRows(GgmlType.Q6_K, file, gpu);
    for (let e = 0; e < n; e++) {
      const got = gpuQ6K(gpu, (e >> 8) * Q6_K_GPU_BLOCK, e & 255);
      assert.ok(Object.is(got, want[e]), `element ${e} at scale ${scale}: ${got} != ${want[e]}`);
    }
  }
});

Deno.test("Q6_K rows take 288 bytes a block on the GPU; other types their file size", () => {
  assert.equal(gpuRowBytes(GgmlType.Q6_K, 2048), 8 * 288);
  assert.equal(gpuRowBytes(GgmlType.Q8_0, 2048), rowBytes(GgmlType.Q8_0, 2048));
  assert.equal(gpuTensorBytes(GgmlType.Q6_K, [512, 3, 2]), 6 * 2 * 288);
  const same = new Uint8Array([1, 2, 3]);
  const out = new Uint8Array(3);
  repackRows(GgmlType.Q8_0, same, out);
  assert.deepEqual(out, same);
  assert.throws(
    () => repackRows(GgmlType.Q6_K, new Uint8Array(211), new Uint8Array(288)),
    /not whole blocks/,
  );
});
