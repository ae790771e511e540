// Tests for tools/synth/quantize.ts: quantize → dequantize round trips with error bounds per
// format, exact grids, degenerate blocks and the error cases.

import assert from "node:assert/strict";
import { QUANT_TYPES, quantize } from "./quantize.ts";
import { DEQUANT_TYPES, dequantize } from "../../engine/quant/dequant.ts";
import { GgmlType, rowBytes, typeName } from "../../engine/quant/ggml_types.ts";

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function gaussian(n: number, std: number, seed: number): Float32Array {
  const u = lcg(seed);
  return Float32Array.from(
    { length: n },
    () => std * Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u()),
  );
}

/**
 * Per block format: the group that shares one scale, its number of levels, and whether levels are
 * symmetric about 0 (scale only) or affine (scale and min). IQ4's 16 non-uniform levels are
 * counted as 16 steps over ±amax (their mean spacing is about that).
 */
const GROUPS: ReadonlyMap<GgmlType, { group: number; levels: number; symmetric: boolean }> =
  new Map([
    [GgmlType.Q8_0, { group: 32, levels: 255, symmetric: true }],
    [GgmlType.Q4_0, { group: 32, levels: 16, symmetric: true }],
    [GgmlType.Q5_0, { group: 32, levels: 32, symmetric: true }],
    [GgmlType.Q4_1, { group: 32, levels: 16, symmetric: false }],
    [GgmlType.Q5_1, { group: 32, levels: 32, symmetric: false }],
    [GgmlType.IQ4_NL, { group: 32, levels: 16, symmetric: true }],
    [GgmlType.IQ4_XS, { group: 32, levels: 16, symmetric: true }],
    [GgmlType.Q2_K, { group: 16, levels: 4, symmetric: false }],
    [GgmlType.Q3_K, { group: 16, levels: 8, symmetric: true }],
    [GgmlType.Q4_K, { group: 32, levels: 16, symmetric: false }],
    [GgmlType.Q5_K, { group: 32, levels: 32, symmetric: false }],
    [GgmlType.Q6_K, { group: 16, levels: 64, symmetric: true }],
  ]);

/**
 * Round trip error against an ideal uniform quantizer: a group whose values span `range` over
 * L levels has step Δ = range/(L−1) and mean squared rounding error Δ²/12. Returns the measured
 * RMSE divided by that ideal RMSE, and the worst single error in units of its group's Δ.
 */
function errorVsIdeal(type: GgmlType, x: Float32Array): { ratio: number; worstSteps: number } {
  const g = GROUPS.get(type)!;
  const y = dequantize(type, quantize(type, x), x.length);
  let se = 0;
  let ideal = 0;
  let worstSteps = 0;
  for (let o = 0; o < x.length; o += g.group) {
    let lo = Infinity, hi = -Infinity, amax = 0;
    for (let i = o; i < o + g.group; i++) {
      lo = Math.min(lo, x[i]);
      hi = Math.max(hi, x[i]);
      amax = Math.max(amax, Math.abs(x[i]));
    }
    const step = (g.symmetric ? 2 * amax : hi - lo) / (g.levels - 1);
    ideal += (g.group * step * step) / 12;
    for (let i = o; i < o + g.group; i++) {
      assert.ok(Number.isFinite(y[i]), `${typeName(type)} element ${i} is ${y[i]}`);
      se += (y[i] - x[i]) ** 2;
      worstSteps = Math.max(worstSteps, Math.abs(y[i] - x[i]) / step);
    }
  }
  return { ratio: Math.sqrt(se / ideal), worstSteps };
}

// Bounds. RMSE: the fits pick each group's scale (and min) by least squares, so on average they do
// at least as well as rounding onto the group's own min..max grid; 5% covers the f16 rounding of d
// and the 4-, 6- or 8-bit rounding of the sub-block scales. Single values (Gaussian input): half a
// step of rounding plus up to one more step where a fit trades clipping the extreme of a group for
// finer steps or a sub-block scale rounds down, hence 1.5 steps.
Deno.test("block formats: Gaussian round trip within the ideal uniform-quantizer RMSE", () => {
  for (const std of [1, 0.02]) {
    const x = gaussian(256 * 16, std, 11);
    for (const type of GROUPS.keys()) {
      const { ratio, worstSteps } = errorVsIdeal(type, x);
      assert.ok(ratio <= 1.05, `${typeName(type)} std ${std}: RMSE ${ratio.toFixed(3)} × ideal`);
      assert.ok(worstSteps <= 1.5, `${typeName(type)} std ${std}: worst error ${worstSteps} steps`);
    }
  }
});

Deno.test("block formats: heavy-tailed round trip within the ideal uniform-quantizer RMSE", () => {
  // Cubed Gaussians put outliers in some groups and tiny values in others: scale packing stress.
  const x = gaussian(256 * 16, 1, 12).map((v) => v * v * v);
  for (const type of GROUPS.keys()) {
    const { ratio } = errorVsIdeal(type, x);
    assert.ok(ratio <= 1.05, `${typeName(type)}: RMSE ${ratio.toFixed(3)} × ideal`);
  }
});

Deno.test("F32 is exact; F16 and BF16 are within half an ulp of each value", () => {
  const x = gaussian(1024, 3, 13);
  assert.deepEqual(dequantize(GgmlType.F32, quantize(GgmlType.F32, x), 1024), x);
  // Normal values: half an ulp is at most 2^-11 (f16) or 2^-8 (bf16) of the value.
  for (const [type, rel] of [[GgmlType.F16, 2 ** -11], [GgmlType.BF16, 2 ** -8]]) {
    const y = dequantize(type, quantize(type, x), 1024);
    for (let i = 0; i < x.length; i++) {
      assert.ok(
        Math.abs(y[i] - x[i]) <= rel * Math.abs(x[i]),
        `${typeName(type)} ${x[i]} → ${y[i]}`,
      );
    }
  }
  assert.deepEqual(
    Array.from(quantize(GgmlType.F16, Float32Array.of(1, -2, 1e6))),
    [0x00, 0x3c, 0x00, 0xc0, 0x00, 0x7c],
  );
});

Deno.test("values already on a Q8_0 or Q4_0 grid come back exactly", () => {
  // Q8_0: amax = 127·0.25 gives d = 0.25 exactly; every multiple of 0.25 is then a level.
  const q8 = Float32Array.from(
    { length: 32 },
    (_, i) => (i === 0 ? -127 : (i * 7) % 100 - 50) * 0.25,
  );
  assert.deepEqual(dequantize(GgmlType.Q8_0, quantize(GgmlType.Q8_0, q8), 32), q8);
  // Q4_0: the extreme −8·0.5 maps to level −8, so the search finds d = 0.5 and all levels fit.
  const q4 = Float32Array.from({ length: 32 }, (_, i) => ((i * 5) % 16 - 8) * 0.5);
  assert.deepEqual(dequantize(GgmlType.Q4_0, quantize(GgmlType.Q4_0, q4), 32), q4);
});

Deno.test("all-zero and constant blocks quantize to finite, exact-or-close values", () => {
  for (const type of QUANT_TYPES) {
    const n = 256;
    const zeros = dequantize(type, quantize(type, new Float32Array(n)), n);
    assert.ok(zeros.every((v) => v === 0), `${typeName(type)} zeros`);
    // A constant block: the affine formats store it as the min; symmetric ones as one level.
    const c = dequantize(type, quantize(type, new Float32Array(n).fill(0.7)), n);
    for (const v of c) {
      assert.ok(Math.abs(v - 0.7) <= 0.7 * 0.02, `${typeName(type)} constant → ${v}`);
    }
  }
});

Deno.test("quantize sizes its output by the block geometry", () => {
  for (const type of QUANT_TYPES) {
    assert.equal(quantize(type, new Float32Array(512)).length, rowBytes(type, 512), typeName(type));
  }
});

Deno.test("quantize rejects unknown types, partial blocks, non-finite values and f16 overflow", () => {
  assert.throws(
    () => quantize(GgmlType.Q8_K, new Float32Array(256)),
    /Cannot quantize to Q8_K: no quantizer/,
  );
  assert.throws(
    () => quantize(GgmlType.Q4_0, new Float32Array(100)),
    /100 values to Q4_0: not a whole number/,
  );
  const bad = new Float32Array(256);
  bad[77] = NaN;
  assert.throws(() => quantize(GgmlType.Q4_K, bad), /value 77 is NaN/);
  assert.throws(
    () => quantize(GgmlType.Q8_0, new Float32Array(32).fill(1e9)),
    /block scale .* as f16: it is beyond ±65504/,
  );
  assert.equal(quantize(GgmlType.F16, Float32Array.of(NaN))[1], 0x7e); // float formats take anything
});

Deno.test("QUANT_TYPES is the set DEQUANT_TYPES reads", () => {
  assert.deepEqual([...QUANT_TYPES], [...DEQUANT_TYPES]);
});
