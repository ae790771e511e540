// Tests for LogitAdjuster: which ids each penalty window names, the values llama.cpp's formula
// gives, f32 rounding, the bounds, and that biasLogit applies a record as documented.

import assert from "node:assert/strict";
import { BAN, biasLogit, MAX_BIAS_PAIRS } from "../../engine/stage.ts";
import { LogitAdjuster, MAX_LOGIT_BIAS, MAX_PENALTY_WINDOW, noPenalties } from "./penalties.ts";

Deno.test("no options: no adjustments, whatever the tokens", () => {
  const a = new LogitAdjuster({}, [1, 2, 3]);
  a.accept(4);
  assert.deepEqual(a.adjustments(), []);
  assert.ok(noPenalties({ repeat: 1, presence: 0, frequency: 0, logitBias: new Map() }));
  assert.ok(!noPenalties({ presence: 0.5 }));
});

Deno.test("repeat_penalty names the last repeat_last_n tokens of prompt and output", () => {
  const a = new LogitAdjuster({ repeat: 1.5, repeatLastN: 3 }, [10, 11, 12, 13]);
  assert.deepEqual(a.adjustments().map((e) => e.id), [11, 12, 13]);
  a.accept(20);
  a.accept(12);
  // Window: 13, 20, 12.
  assert.deepEqual(
    a.adjustments(),
    [12, 13, 20].map((id) => ({ id, bias: 0, repeat: 1.5, subtract: 0 })),
  );
});

Deno.test("presence and frequency: once per id plus once per occurrence, output-only scope", () => {
  const a = new LogitAdjuster(
    { presence: 0.5, frequency: 0.25, penaltyScope: "output" },
    [7, 7, 7],
  );
  assert.deepEqual(a.adjustments(), [], "prompt tokens do not count in the output scope");
  for (const id of [5, 6, 5, 5]) a.accept(id);
  assert.deepEqual(a.adjustments(), [
    { id: 5, bias: 0, repeat: 1, subtract: 0.5 + 3 * 0.25 },
    { id: 6, bias: 0, repeat: 1, subtract: 0.5 + 0.25 },
  ]);
  const context = new LogitAdjuster({ presence: 1, penaltyLastN: 2 }, [7, 8, 9]);
  assert.deepEqual(context.adjustments().map((e) => e.id), [8, 9]);
});

Deno.test("logit bias merges with the penalties into one entry per id, rounded to f32", () => {
  const a = new LogitAdjuster({
    logitBias: new Map([[3, 0.1], [9, BAN]]),
    repeat: 1.1,
    repeatLastN: 2,
    frequency: 0.3,
    penaltyScope: "output",
  }, [3]);
  a.accept(3);
  assert.deepEqual(a.adjustments(), [
    { id: 3, bias: Math.fround(0.1), repeat: Math.fround(1.1), subtract: Math.fround(0.3) },
    { id: 9, bias: BAN, repeat: 1, subtract: 0 },
  ]);
});

Deno.test("biasLogit is bias, then repeat by sign, then subtract", () => {
  const e = { id: 0, bias: 1, repeat: 2, subtract: 0.5 };
  assert.equal(biasLogit(3, e), (3 + 1) / 2 - 0.5);
  assert.equal(biasLogit(-3, e), (-3 + 1) * 2 - 0.5);
  assert.equal(biasLogit(5, { id: 0, bias: 2 }), 7, "repeat 1 and subtract 0 by default");
  assert.ok(biasLogit(50, { id: 0, bias: BAN, repeat: 1.3, subtract: 2 }) < -1e8);
});

Deno.test("the windows and the bias are bounded, so a step never exceeds MAX_BIAS_PAIRS", () => {
  assert.throws(
    () => new LogitAdjuster({ repeat: 1.1, repeatLastN: MAX_PENALTY_WINDOW + 1 }, []),
    /repeat window of 1025 tokens/,
  );
  const bias = new Map(Array.from({ length: MAX_LOGIT_BIAS + 1 }, (_, i) => [i, 1]));
  assert.throws(() => new LogitAdjuster({ logitBias: bias }, []), /Cannot bias 1025 tokens/);
  // The worst case: a full bias and two full windows of distinct ids.
  const full = new LogitAdjuster({
    logitBias: new Map(Array.from({ length: MAX_LOGIT_BIAS }, (_, i) => [100_000 + i, 1])),
    repeat: 1.2,
    repeatLastN: MAX_PENALTY_WINDOW,
    presence: 1,
    penaltyScope: "output",
  }, Array.from({ length: MAX_PENALTY_WINDOW }, (_, i) => i));
  for (let i = 0; i < MAX_PENALTY_WINDOW; i++) full.accept(50_000 + i);
  const n = full.adjustments().length;
  assert.equal(n, MAX_LOGIT_BIAS + MAX_PENALTY_WINDOW);
  assert.ok(n <= MAX_BIAS_PAIRS);
  assert.throws(() => new LogitAdjuster({ repeat: 5000 }, []), /repeat penalty of 5000/);
});

Deno.test("a bias alone is constant: every step gets the same changes; a penalty window is not", () => {
  const bias = new Map([[3, 2], [9, BAN]]);
  const alone = new LogitAdjuster({ logitBias: bias }, [3, 3, 9]);
  assert.ok(alone.constant);
  const first = alone.adjustments();
  for (const id of [3, 9, 4, 3]) alone.accept(id);
  assert.deepEqual(alone.adjustments(), first);
  for (const options of [{ repeat: 1.2 }, { presence: 0.5 }, { frequency: 0.5 }]) {
    const windowed = new LogitAdjuster({ logitBias: bias, ...options }, [3, 4]);
    assert.ok(!windowed.constant, JSON.stringify(options));
    const before = windowed.adjustments();
    windowed.accept(7);
    assert.notDeepEqual(windowed.adjustments(), before, JSON.stringify(options));
  }
});
