// Tests for the sampler's integer arithmetic: its product halves against BigInt, its weights
// against exp in float64, its tables against their formula, and the edges of its constants.

import assert from "node:assert/strict";
import {
  candidateWeights,
  drawIndex,
  EXP2_HI,
  EXP2_LO,
  keptCount,
  logitSteps,
  mulHi,
  samplerConstants,
} from "./sampler.ts";
import { SplitMix64 } from "../lib/sampling/sample.ts";

Deno.test("mulHi is the high half of the 64-bit product", () => {
  const rng = new SplitMix64(5n);
  const edges = [0, 1, 0xffff, 0x10000, 0x7fffffff, 0x80000000, 0xffffffff];
  const pairs = edges.flatMap((a) => edges.map((b) => [a, b]));
  for (let i = 0; i < 2000; i++) pairs.push([rng.nextU32(), rng.nextU32()]);
  for (const [a, b] of pairs) {
    assert.equal(mulHi(a, b), Number((BigInt(a) * BigInt(b)) >> 32n), `${a} * ${b}`);
  }
});

Deno.test("the exponent tables are 2^(-j/64) and 2^(-j/4096) rounded", () => {
  for (let j = 0; j < 64; j++) {
    assert.equal(EXP2_HI[j], Math.round(32768 * 2 ** (-j / 64)));
    assert.equal(EXP2_LO[j], Math.round(65536 * 2 ** (-j / 4096)));
  }
});

Deno.test("weights are exp((logit - best) / T) of the best's, within 4e-4, to 2^-20 of it", () => {
  const rng = new SplitMix64(17n);
  for (const T of [0.1, 0.7, 1, 2, 50]) {
    const logits = [12.5];
    for (let i = 1; i < 64; i++) logits.push(logits[i - 1] - rng.nextFloat() * 0.5 * T);
    const f32 = logits.map(Math.fround);
    const c = samplerConstants({ temperature: T, topK: 0, topP: 1 }, f32.length);
    const w = candidateWeights(f32, c)!;
    assert.equal(w[0], 2 ** (31 - c.shift));
    for (let i = 1; i < w.length; i++) {
      const exact = Math.exp((f32[i] - f32[0]) / T);
      if (exact < 2 ** -20) continue;
      assert.ok(Math.abs(w[i] / w[0] - exact) <= 4e-4 * exact + 2 ** -20, `T ${T} #${i}`);
      assert.ok(w[i] <= w[i - 1], "weights fall with the logits");
    }
    assert.ok(w.reduce((a, b) => a + b, 0) < 2 ** 30);
  }
});

Deno.test("the constants bound every weight, cut and sum at the extremes", () => {
  // The smallest temperature weighs a gap of 0.05 at 0; the largest weighs all alike.
  const ties = [3, 3, 3 - 2 ** -16, 2.95, -1e30, -Infinity, NaN];
  const cold = samplerConstants({ temperature: 1e-9, topK: 0, topP: 1 }, ties.length);
  assert.deepEqual(candidateWeights(ties, cold)!.map((w) => w > 0), [
    true,
    true,
    true,
    false,
    false,
    false,
    false,
  ]);
  const hot = samplerConstants({ temperature: 1000, topK: 0, topP: 1 }, 1024);
  const flat = candidateWeights(Array.from({ length: 1024 }, (_, i) => -i / 100), hot)!;
  assert.ok(flat.every((w) => w > 0.9 * flat[0]));
  assert.ok(flat.reduce((a, b) => a + b, 0) < 2 ** 30);
  assert.equal(logitSteps(1e30), 2 ** 30);
  assert.equal(candidateWeights([-Infinity, -Infinity], hot), undefined);
  assert.throws(() => samplerConstants({ temperature: 1001, topK: 0, topP: 1 }, 4), /temperature/);
  assert.throws(() => samplerConstants({ temperature: 1, topK: 0, topP: 1 }, 0), /candidate/);
});

Deno.test("top-p keeps the shortest prefix reaching p of the mass; min-p trims its tail", () => {
  const c = (topP: number, minP = 0, minKeep = 1) =>
    samplerConstants({ temperature: 1, topK: 0, topP, minP, minKeep }, 4);
  const logits = [0, -Math.log(2), -Math.log(4), -Math.log(8)].map(Math.fround);
  const w = candidateWeights(logits, c(1))!;
  // Probabilities 8/15, 4/15, 2/15, 1/15.
  assert.equal(keptCount(w, c(1)), 4);
  assert.equal(keptCount(w, c(0.5)), 1);
  assert.equal(keptCount(w, c(0.7)), 2);
  assert.equal(keptCount(w, c(0.9)), 3);
  assert.equal(keptCount(w, c(1, 0.2)), 3);
  assert.equal(keptCount(w, c(1, 0.6)), 1);
  assert.equal(keptCount(w, c(0.01, 0, 3)), 3);
});

Deno.test("drawIndex splits the u32 range by the weights, and never draws a zero or skipped one", () => {
  const w = [6, 0, 3, 1];
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < 1000; i++) counts[drawIndex(w, Math.floor((i + 0.5) * 2 ** 32 / 1000))]++;
  assert.deepEqual(counts, [600, 0, 300, 100]);
  assert.equal(drawIndex(w, 0), 0);
  assert.equal(drawIndex(w, 0xffffffff), 3);
  for (let u = 0; u < 2 ** 32; u += 2 ** 28) assert.notEqual(drawIndex(w, u, 0), 0);
});
