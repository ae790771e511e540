// Tests for tools/synth/random_blocks.ts: every dequantizable type gives finite values with the
// requested spread, reproducibly, into aligned or misaligned buffers; bad requests fail clearly.

import assert from "node:assert/strict";
import { randomBlocks } from "./random_blocks.ts";
import { DEQUANT_TYPES, dequantize } from "../../engine/quant/dequant.ts";
import { GgmlType, rowBytes, typeName } from "../../engine/quant/ggml_types.ts";

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

// The scales come from exact level statistics of each layout, so the expected std is the request
// up to the f16 rounding of d (< 0.1%), the K-quant min rounding (< 1%) and sampling noise over
// 16384 values (about 1%): 10% is a wide margin that still catches a wrong field or formula.
Deno.test("every type: finite values, std within 10% of the request, mean near 0", () => {
  const n = 256 * 64;
  for (const type of DEQUANT_TYPES) {
    for (const std of [0.02, 1.5]) {
      const y = dequantize(type, randomBlocks(type, n, std, lcg(1)), n);
      let sum = 0;
      let sum2 = 0;
      for (const v of y) {
        assert.ok(Number.isFinite(v), `${typeName(type)}: ${v}`);
        sum += v;
        sum2 += v * v;
      }
      const mean = sum / n;
      const got = Math.sqrt(sum2 / n - mean * mean);
      assert.ok(Math.abs(got / std - 1) < 0.1, `${typeName(type)} std ${std}: got ${got}`);
      assert.ok(Math.abs(mean) < 0.05 * std, `${typeName(type)} std ${std}: mean ${mean}`);
    }
  }
});

Deno.test("the same rng gives the same bytes; another seed gives others", () => {
  for (const type of DEQUANT_TYPES) {
    const a = randomBlocks(type, 512, 1, lcg(5));
    assert.equal(a.length, rowBytes(type, 512));
    assert.deepEqual(randomBlocks(type, 512, 1, lcg(5)), a, typeName(type));
    assert.notDeepEqual(randomBlocks(type, 512, 1, lcg(6)), a, typeName(type));
  }
});

Deno.test("writes into out, aligned or not, and leaves bytes past the blocks alone", () => {
  for (const type of DEQUANT_TYPES) {
    const size = rowBytes(type, 256);
    const want = randomBlocks(type, 256, 0.5, lcg(9));
    const backing = new Uint8Array(size + 8).fill(0xee);
    const misaligned = backing.subarray(3, 3 + size + 2);
    const got = randomBlocks(type, 256, 0.5, lcg(9), misaligned);
    assert.equal(got.length, size);
    assert.equal(got.byteOffset, 3);
    assert.deepEqual(got, want, typeName(type));
    assert.equal(backing[3 + size], 0xee);
    const exact = new Uint8Array(size);
    assert.equal(randomBlocks(type, 256, 0.5, lcg(9), exact), exact);
    assert.deepEqual(exact, want);
  }
});

Deno.test("F16 std is limited by the f16 range; zero std gives zeros", () => {
  assert.throws(() => randomBlocks(GgmlType.F16, 16, 1e6, lcg(1)), /F16 values with std 1000000/);
  const y = dequantize(GgmlType.Q4_K, randomBlocks(GgmlType.Q4_K, 256, 0, lcg(1)), 256);
  assert.ok(y.every((v) => v === 0));
});

Deno.test("randomBlocks rejects unknown types, partial blocks, bad std and a short out", () => {
  assert.throws(
    () => randomBlocks(GgmlType.Q8_K, 256, 1, lcg(1)),
    /Q8_K blocks: the type is not dequantizable/,
  );
  assert.throws(
    () => randomBlocks(GgmlType.Q6_K, 300, 1, lcg(1)),
    /not a multiple of the block size 256/,
  );
  assert.throws(() => randomBlocks(GgmlType.Q8_0, 32, -1, lcg(1)), /std -1: need a finite std/);
  assert.throws(() => randomBlocks(GgmlType.Q8_0, 32, NaN, lcg(1)), /std NaN/);
  assert.throws(
    () => randomBlocks(GgmlType.Q8_0, 32, 1e9, lcg(1)),
    /block scale .* is not a finite nonzero f16/,
  );
  assert.throws(
    () => randomBlocks(GgmlType.Q8_0, 64, 1, lcg(1), new Uint8Array(67)),
    /\(68 bytes\) into 67 bytes/,
  );
});
