// Tests of the random tensor bytes: spreads per distribution and type, seeding by name and chunk,
// and that worker threads make exactly the bytes the calling thread makes.

import assert from "node:assert/strict";
import { dequantize } from "../../engine/quant/dequant.ts";
import { GgmlType } from "../../engine/quant/ggml_types.ts";
import {
  chunkCount,
  ChunkPool,
  type SynthTensor,
  tensorChunks,
  tensorData,
} from "./weight_synth.ts";
import { stats } from "./_weight_stats.ts";

const EXPERTS: SynthTensor = {
  name: "blk.0.ffn_up_exps.weight",
  shape: [512, 64, 40],
  type: GgmlType.IQ4_XS,
  init: { dist: "normal", a: 0, b: 0.05 },
};
const N = 512 * 64 * 40;

Deno.test("blocks synthesis: valid blocks of the requested spread, seeded by name", () => {
  const bytes = tensorData(EXPERTS, 7, "blocks");
  assert.equal(bytes.length, N / 256 * 136);
  const s = stats(dequantize(GgmlType.IQ4_XS, bytes, N));
  assert.ok(Math.abs(s.std / 0.05 - 1) < 0.1 && Math.abs(s.mean) < 0.005, JSON.stringify(s));
  assert.deepEqual(tensorData(EXPERTS, 7, "blocks"), bytes);
  assert.notDeepEqual(
    tensorData({ ...EXPERTS, name: "blk.1.ffn_up_exps.weight" }, 7, "blocks"),
    bytes,
  );
  assert.notDeepEqual(tensorData(EXPERTS, 8, "blocks"), bytes);
});

Deno.test("quantize synthesis draws each distribution; chunks are independent streams", () => {
  const base = { name: "v", shape: [256, 4096], type: GgmlType.F32 } as const;
  const normal = stats(
    new Float32Array(
      tensorData({ ...base, init: { dist: "normal", a: 1, b: 0.1 } }, 1, "quantize").buffer,
    ),
  );
  assert.ok(Math.abs(normal.mean - 1) < 0.002 && Math.abs(normal.std - 0.1) < 0.002);
  const uniform = stats(
    new Float32Array(
      tensorData({ ...base, init: { dist: "uniform", a: -4, b: -1 } }, 1, "quantize").buffer,
    ),
  );
  assert.ok(uniform.min >= -4 && uniform.max < -1 && Math.abs(uniform.mean + 2.5) < 0.01);
  const negExp = {
    ...base,
    init: { dist: "neg-exp-uniform", a: -1, b: 1 },
  } as const;
  const a = stats(new Float32Array(tensorData(negExp, 1, "quantize").buffer));
  assert.ok(a.max <= -Math.exp(-1) + 1e-6 && a.min >= -Math.exp(1) - 1e-5, JSON.stringify(a));
  // Any split of the chunk range concatenates to the whole tensor.
  const n = chunkCount(negExp);
  assert.ok(n > 2);
  const whole = tensorData(negExp, 1, "quantize");
  const head = tensorChunks(negExp, 1, "quantize", 0, 1);
  const tail = tensorChunks(negExp, 1, "quantize", 1, n - 1);
  assert.deepEqual(new Uint8Array([...head, ...tail]), whole);
  assert.notDeepEqual(head, whole.subarray(head.length, 2 * head.length));
});

Deno.test("a worker pool makes the same bytes as the calling thread", async () => {
  const pool = new ChunkPool(2);
  try {
    const quantized = { ...EXPERTS, type: GgmlType.Q8_0, shape: [256, 64, 80] };
    assert.ok(chunkCount(quantized) > 4);
    assert.deepEqual(
      await pool.tensor(quantized, 3, "quantize"),
      tensorData(quantized, 3, "quantize"),
    );
    assert.deepEqual(await pool.tensor(EXPERTS, 3, "blocks"), tensorData(EXPERTS, 3, "blocks"));
    await assert.rejects(
      pool.tensor({ ...EXPERTS, type: GgmlType.Q8_1 }, 3, "blocks"),
      /Cannot make tensor chunks/,
    );
  } finally {
    pool.close();
  }
});
