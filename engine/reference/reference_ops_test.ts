// Unit tests of the CPU reference ops on small cases whose results are worked out by hand.
// Guards engine/reference/{math,norms,rope,gqa_attention,deltanet,ffn,logits}.ts, the GPU kernels' oracle.

import assert from "node:assert/strict";
import type { Arch } from "../hparams.ts";
import { attention } from "./gqa_attention.ts";
import { convStep, deltaNetGates, deltaNetStep } from "./deltanet.ts";
import { moeRoute, swiglu, swigluFfn } from "./ffn.ts";
import { argmaxTopK } from "./logits.ts";
import { matVec, softplus } from "./math.ts";
import { gatedRmsNorm, l2NormHeads, rmsNorm } from "./norms.ts";
import { ropeAnglesImrope, ropeAnglesNeox, ropeImrope, ropeNeox, ropeThetaScale } from "./rope.ts";
import { deltaNetHParams } from "../../tests/_hparams.ts";

/** Float64 results of a few operations: agreement to 1e-12 relative is exact for our purpose. */
function assertClose(actual: ArrayLike<number>, expected: readonly number[], what: string): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  for (let i = 0; i < expected.length; i++) {
    const tol = 1e-12 * Math.max(1, Math.abs(expected[i]));
    assert.ok(
      Math.abs(actual[i] - expected[i]) <= tol,
      `${what}[${i}]: got ${actual[i]}, expected ${expected[i]}`,
    );
  }
}

const sig = (x: number) => 1 / (1 + Math.exp(-x));

Deno.test("matVec multiplies rows and rejects a ragged weight", () => {
  const w = new Float32Array([1, 2, 3, 4, 5, 6]);
  assertClose(matVec(w, new Float64Array([1, 0, -1])), [-2, -2], "W·x");
  assert.throws(() => matVec(w, new Float64Array([1, 2, 3, 4])), RangeError);
});

Deno.test("softplus passes x through above 20 and is ln 2 at 0", () => {
  assert.equal(softplus(30), 30);
  assertClose([softplus(0)], [Math.LN2], "softplus(0)");
});

Deno.test("rmsNorm scales each row by 1/sqrt(mean(x²)+eps) and the weight", () => {
  // Row [3, 4]: mean of squares 12.5, + eps 0.5 = 13.
  assertClose(
    rmsNorm(new Float32Array([3, 4]), new Float32Array([1, 2]), 0.5),
    [3 / Math.sqrt(13), 8 / Math.sqrt(13)],
    "one row",
  );
  // Two rows of 2 with a shared weight: [0, 2] has mean square 2.
  assertClose(
    rmsNorm(new Float64Array([3, 4, 0, 2]), new Float32Array([1, 1]), 0),
    [3 / Math.sqrt(12.5), 4 / Math.sqrt(12.5), 0, Math.SQRT2],
    "two rows",
  );
  assert.throws(() => rmsNorm(new Float64Array(3), new Float32Array(2), 0), RangeError);
});

Deno.test("l2NormHeads divides each head by max(norm, eps)", () => {
  // Head 0 has norm 5; head 1 has norm 1e-7 < eps 1e-6, so it is divided by eps.
  assertClose(
    l2NormHeads(new Float64Array([3, 4, 1e-7, 0]), 2, 1e-6),
    [0.6, 0.8, 0.1, 0],
    "heads",
  );
});

Deno.test("gatedRmsNorm multiplies the normalised row by the weight and silu(z)", () => {
  // o = [1, 1] has RMS 1; silu(0) = 0, silu(2) = 2·sigmoid(2).
  assertClose(
    gatedRmsNorm(new Float64Array([1, 1]), new Float64Array([0, 2]), new Float32Array([3, 3]), 0),
    [0, 3 * 2 * sig(2)],
    "gated",
  );
});

Deno.test("RoPE theta chain is repeated f32 multiplication from (float)pos", () => {
  // base 10000, nRot 8: theta_scale = f32(10000^(-1/4)) = f32(0.1).
  const scale = ropeThetaScale(10000, 8);
  assert.equal(scale, Math.fround(0.1));
  const t0 = 1000;
  const t1 = Math.fround(t0 * scale);
  const t2 = Math.fround(t1 * scale);
  const t3 = Math.fround(t2 * scale);
  const a = ropeAnglesNeox(1000, 8, 10000);
  assert.deepEqual(
    Array.from(a.cos),
    [t0, t1, t2, t3].map((t) => Math.fround(Math.cos(t))),
  );
  assert.deepEqual(
    Array.from(a.sin),
    [t0, t1, t2, t3].map((t) => Math.fround(Math.sin(t))),
  );
  // The f32 chain is not the closed form p·base^(−2i/n) rounded once: at p 12345, base 1e7,
  // nRot 64 some of the 32 angles differ in their last bits.
  const chained = ropeAnglesNeox(12345, 64, 1e7);
  const closed = Array.from(
    { length: 32 },
    (_, i) => Math.fround(Math.cos(Math.fround(12345 * Math.pow(1e7, -2 * i / 64)))),
  );
  assert.ok(closed.some((c, i) => c !== chained.cos[i]));
});

Deno.test("ropeNeox rotates pairs (i, i+nRot/2) of each head and copies the rest", () => {
  // headDim 6, nRot 4: pairs (0,2), (1,3); dims 4, 5 untouched. Two heads.
  const x = new Float32Array([1, 2, 3, 4, 5, 6, -1, 0, 0, 1, 7, 8]);
  const pos = 3;
  const t0 = 3;
  const t1 = Math.fround(3 * Math.fround(0.01)); // theta_scale = f32(10000^(−1/2))
  const [c0, s0, c1, s1] = [Math.cos(t0), Math.sin(t0), Math.cos(t1), Math.sin(t1)].map(
    Math.fround,
  );
  const y = ropeNeox(x, { headDim: 6, nRot: 4, base: 10000, pos });
  assertClose(y, [
    1 * c0 - 3 * s0,
    2 * c1 - 4 * s1,
    1 * s0 + 3 * c0,
    2 * s1 + 4 * c1,
    5,
    6,
    -1 * c0 - 0 * s0,
    0 * c1 - 1 * s1,
    -1 * s0 + 0 * c0,
    0 * s1 + 1 * c1,
    7,
    8,
  ], "rotated");
  // Position 0 is the identity.
  assertClose(ropeNeox(x, { headDim: 6, nRot: 4, base: 10000, pos: 0 }), Array.from(x), "pos 0");
});

Deno.test("IMROPE with text positions [p,p,p,0] equals NEOX; the h stream drives its sectors", () => {
  const x = Float64Array.from({ length: 2 * 256 }, (_, i) => Math.sin(i * 0.37));
  const opts = { headDim: 256, nRot: 64, base: 1e7 };
  assert.deepEqual(
    ropeImrope(x, { ...opts, positions: [77, 77, 77, 0], sections: [11, 11, 10, 0] }),
    ropeNeox(x, { ...opts, pos: 77 }),
  );
  // sections [2, 2, 1, 0] (sum 5), nRot 10: sectors 1 and 4 read h (sector%3 = 1, < 6),
  // sector 2 reads w (< 3), sectors 0 and 3 read t (< 6).
  const scale = ropeThetaScale(10000, 10);
  const chain = (p: number, i: number) => {
    let t = Math.fround(p);
    for (let j = 0; j < i; j++) t = Math.fround(t * scale);
    return t;
  };
  const a = ropeAnglesImrope([5, 9, 11, 0], [2, 2, 1, 0], 10, 10000);
  const streams = [5, 9, 11, 5, 9];
  for (let i = 0; i < 5; i++) {
    assert.equal(a.cos[i], Math.fround(Math.cos(chain(streams[i], i))), `pair ${i}`);
  }
});

Deno.test("attention: softmax over cached positions, GQA head mapping, sigmoid gate", () => {
  // Hq 2, Hkv 1, Dh 4 (scale 1/2). k₀ = 0, k₁ = [ln 9, 0, 0, 0]; q₀ = [1,0,0,0] gives scores
  // [0, ln 3] → probs [1/4, 3/4]; q₁ = −q₀ gives [3/4, 1/4]. v₀ = 4·e₀, v₁ = 8·e₀.
  const k = new Float64Array([0, 0, 0, 0, Math.log(9), 0, 0, 0]);
  const v = new Float32Array([4, 0, 0, 0, 8, 0, 0, 0]);
  const q = new Float64Array([1, 0, 0, 0, -1, 0, 0, 0]);
  const gate = new Float64Array([0, 0, 0, 0, Math.log(3), 0, 0, 0]);
  const o = attention({ q, gate, k, v }, { Hq: 2, Hkv: 1, Dh: 4, nPos: 2 });
  assertClose(Array.from(o).filter((_, i) => i % 4 === 0), [7 * 0.5, 5 * 0.75], "heads");
  // nPos 1 is causal: only position 0 is visible.
  const first = attention({ q, gate, k, v }, { Hq: 2, Hkv: 1, Dh: 4, nPos: 1 });
  assertClose([first[0], first[4]], [2, 3], "position 0 only");
  // Hq 4 over Hkv 2: heads 0, 1 read KV head 0 and heads 2, 3 read KV head 1.
  const o4 = attention(
    {
      q: new Float64Array(4),
      gate: new Float64Array(4),
      k: new Float32Array(2),
      v: new Float32Array([1, 2]),
    },
    { Hq: 4, Hkv: 2, Dh: 1, nPos: 1 },
  );
  assertClose(o4, [0.5, 0.5, 1, 1], "GQA");
});

Deno.test("convStep convolves state ++ x per channel, applies SiLU and shifts the state", () => {
  // C 2, Kc 3: state rows are the two previous raw inputs, oldest first.
  const state = new Float64Array([1, 2, 3, 4]); // oldest [1, 2], newest [3, 4]
  const w = new Float32Array([0.5, -1, 2, 1, 0, -0.25]); // channel 0: [0.5,−1,2], 1: [1,0,−0.25]
  const u = convStep(state, new Float32Array([5, 6]), w);
  const pre = [0.5 * 1 - 1 * 3 + 2 * 5, 1 * 2 + 0 * 4 - 0.25 * 6];
  assertClose(u, pre.map((s) => s * sig(s)), "output");
  assert.deepEqual(Array.from(state), [3, 4, 5, 6]);
});

Deno.test("deltaNetGates: beta = sigmoid(b), g = softplus(a + dt)·ssm_a", () => {
  const { beta, g } = deltaNetGates(
    new Float32Array([0, 2]),
    new Float32Array([0, 25]),
    new Float32Array([0, 5]),
    new Float32Array([-2, -0.5]),
  );
  assertClose(beta, [0.5, sig(2)], "beta");
  assertClose(g, [-2 * Math.LN2, -0.5 * 30], "g");
});

Deno.test("deltaNetStep on a 2x2 state: decay, delta from decayed state, read-out after update", () => {
  // S = I, decay ½ → ½I. k = e₀, v = [2, 3], β = ½: kv = [½, 0], δ = [¾, 3/2];
  // S = [[5/4, 3/2], [0, ½]]; q = e₁: o = S[1][·]/√2 = [0, ½/√2].
  const hp = deltaNetHParams("qwen35", 1, 1, 2, 2);
  const state = new Float64Array([1, 0, 0, 1]);
  const o = deltaNetStep({
    state,
    q: new Float64Array([0, 1]),
    k: new Float64Array([1, 0]),
    v: new Float64Array([2, 3]),
    beta: new Float64Array([0.5]),
    g: new Float64Array([Math.log(0.5)]),
  }, hp);
  assertClose(o, [0, 0.5 / Math.SQRT2], "o");
  // Layout (h, j, i): column j of S contiguous over i.
  assertClose(state, [1.25, 0, 1.5, 0.5], "state");
});

Deno.test("deltaNetStep pairs value heads with key heads per arch", () => {
  // Nk 2, Nv 4, zero state, no decay, β 1: S_h = k vᵀ, o_h = (k·q) v_h / √2 with v_h = [1, 1].
  // Key head 0 has k·q = 2, key head 1 has k·q = 3.
  const run = (arch: Arch) =>
    deltaNetStep({
      state: new Float64Array(4 * 2 * 2),
      q: new Float64Array([2, 0, 0, 3]),
      k: new Float64Array([1, 0, 0, 1]),
      v: new Float64Array(8).fill(1),
      beta: new Float64Array(4).fill(1),
      g: new Float64Array(4),
    }, deltaNetHParams(arch, 2, 4, 2, 2));
  const r = Math.SQRT2;
  assertClose(run("qwen3next"), [2, 2, 2, 2, 3, 3, 3, 3].map((x) => x / r), "interleaved");
  assertClose(run("qwen35moe"), [2, 2, 3, 3, 2, 2, 3, 3].map((x) => x / r), "tiled");
});

Deno.test("swiglu and swigluFfn", () => {
  assertClose(
    swiglu(new Float64Array([0, 1]), new Float64Array([5, 2])),
    [0, 2 * sig(1)],
    "swiglu",
  );
  // D 2, F 1: gate row [1, 0], up row [0, 1], down column [1, −1]; x = [1, 3].
  const y = swigluFfn(
    new Float32Array([1, 0]),
    new Float32Array([0, 1]),
    new Float32Array([1, -1]),
    new Float64Array([1, 3]),
  );
  assertClose(y, [3 * sig(1), -3 * sig(1)], "ffn");
});

Deno.test("moeRoute: softmax, top-k with lower id first on ties, renormalised", () => {
  // probs ∝ [1, 2, 4, 3]: top-2 = experts 2 and 3 with weights 4/7 and 3/7.
  const r = moeRoute(new Float64Array([1, 2, 4, 3].map(Math.log)), 2);
  assert.deepEqual(Array.from(r.ids), [2, 3]);
  assertClose(r.weights, [4 / 7, 3 / 7], "weights");
  // Equal logits: ids ascending.
  const tie = moeRoute(new Float64Array([0, 1, 1, 1]), 3);
  assert.deepEqual(Array.from(tie.ids), [1, 2, 3]);
  assertClose(tie.weights, [1 / 3, 1 / 3, 1 / 3], "tie weights");
  // 20000 equal experts, k 1: the one weight 1/20000 is below the clamp 6.103515625e−5.
  const clamp = moeRoute(new Float64Array(20000), 1);
  assert.deepEqual(Array.from(clamp.ids), [0]);
  assertClose(clamp.weights, [0.8192], "clamped");
  assert.throws(() => moeRoute(new Float64Array(4), 5), RangeError);
});

Deno.test("argmaxTopK: descending, ties to the lower id", () => {
  const logits = new Float64Array([1, 5, 3, 5, 2]);
  const r = argmaxTopK(logits, 3);
  assert.equal(r.argmax, 1);
  assert.deepEqual(r.top, [{ id: 1, logit: 5 }, { id: 3, logit: 5 }, { id: 2, logit: 3 }]);
  assert.deepEqual(argmaxTopK(logits, 0).top, []);
  assert.deepEqual(
    argmaxTopK(logits, 9).top.map((e) => e.id),
    [1, 3, 2, 4, 0],
  );
  assert.deepEqual(argmaxTopK(new Float32Array([2, 2, 2]), 2).top.map((e) => e.id), [0, 1]);
});
