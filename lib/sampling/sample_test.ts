// Tests for the head's sampler: SplitMix64 against its published reference outputs, greedy
// pass-through, top-k/top-p truncation, the empirical distribution at a temperature, and the
// speculative accept/reject rule.

import assert from "node:assert/strict";
import { sampleToken, samplingDistribution, speculativeToken, SplitMix64 } from "./sample.ts";

Deno.test("SplitMix64 matches the reference sequence for seed 1234567", () => {
  // Reference values of Vigna's splitmix64.c for x = 1234567.
  const rng = new SplitMix64(1234567n);
  assert.equal(rng.nextU64(), 6457827717110365317n);
  assert.equal(rng.nextU64(), 3203168211198807973n);
  assert.equal(rng.nextU64(), 9817491932198370423n);
});

Deno.test("the same seed replays the same samples; another seed differs", () => {
  const cands = [0, 1, 2, 3, 4].map((id) => ({ id, logit: -id * 0.1 }));
  const params = { temperature: 1, topK: 0, topP: 1 };
  const run = (seed: bigint) => {
    const rng = new SplitMix64(seed);
    return Array.from({ length: 40 }, () => sampleToken(0, cands, params, rng));
  };
  assert.deepEqual(run(7n), run(7n));
  assert.notDeepEqual(run(7n), run(8n));
});

Deno.test("temperature 0 returns the greedy id whatever the candidates say", () => {
  const rng = new SplitMix64(1n);
  assert.equal(
    sampleToken(42, [{ id: 3, logit: 9 }], { temperature: 0, topK: 0, topP: 1 }, rng),
    42,
  );
});

Deno.test("top_k 1 and a tiny top_p both keep only the best candidate", () => {
  const cands = [{ id: 9, logit: 2 }, { id: 4, logit: 1.9 }, { id: 1, logit: 1.8 }];
  const rng = new SplitMix64(3n);
  for (let i = 0; i < 50; i++) {
    assert.equal(sampleToken(9, cands, { temperature: 5, topK: 1, topP: 1 }, rng), 9);
    assert.equal(sampleToken(9, cands, { temperature: 5, topK: 0, topP: 0.01 }, rng), 9);
  }
});

Deno.test("sampled frequencies follow softmax(logit / T) over the candidates", () => {
  const cands = [{ id: 0, logit: Math.log(6) }, { id: 1, logit: Math.log(3) }, {
    id: 2,
    logit: Math.log(1),
  }];
  const rng = new SplitMix64(99n);
  const counts = [0, 0, 0];
  const n = 20000;
  for (let i = 0; i < n; i++) {
    counts[sampleToken(0, cands, { temperature: 1, topK: 0, topP: 1 }, rng)]++;
  }
  // Expected 0.6 / 0.3 / 0.1; 5 standard deviations of a binomial at n = 20000 is < 0.018.
  assert.ok(Math.abs(counts[0] / n - 0.6) < 0.018, `p0 ${counts[0] / n}`);
  assert.ok(Math.abs(counts[1] / n - 0.3) < 0.018, `p1 ${counts[1] / n}`);
  assert.ok(Math.abs(counts[2] / n - 0.1) < 0.018, `p2 ${counts[2] / n}`);
});

Deno.test("top_p keeps the smallest prefix whose mass reaches p", () => {
  // Probabilities 0.6 / 0.3 / 0.1: p = 0.8 keeps ids 0 and 1 only.
  const cands = [{ id: 0, logit: Math.log(6) }, { id: 1, logit: Math.log(3) }, {
    id: 2,
    logit: Math.log(1),
  }];
  const rng = new SplitMix64(5n);
  const seen = new Set<number>();
  for (let i = 0; i < 3000; i++) {
    seen.add(sampleToken(0, cands, { temperature: 1, topK: 0, topP: 0.8 }, rng));
  }
  assert.deepEqual([...seen].sort(), [0, 1]);
});

Deno.test("min_p drops candidates below min_p times the best one's probability", () => {
  // Probabilities 0.6 / 0.3 / 0.1: min_p 0.4 keeps p ≥ 0.24 (ids 0 and 1), 0.6 keeps id 0.
  const cands = [0, 1, 2].map((id) => ({ id, logit: Math.log([6, 3, 1][id]) }));
  const seen = (minP: number, minKeep?: number) => {
    const rng = new SplitMix64(11n);
    const ids = new Set<number>();
    for (let i = 0; i < 3000; i++) {
      ids.add(sampleToken(0, cands, { temperature: 1, topK: 0, topP: 1, minP, minKeep }, rng));
    }
    return [...ids].sort();
  };
  assert.deepEqual(seen(0), [0, 1, 2]);
  assert.deepEqual(seen(0.4), [0, 1]);
  assert.deepEqual(seen(0.6), [0]);
  // min_keep outranks both cuts.
  assert.deepEqual(seen(0.6, 3), [0, 1, 2]);
});

Deno.test("min_keep keeps candidates a tiny top_p would cut", () => {
  const cands = [0, 1, 2].map((id) => ({ id, logit: -id }));
  const rng = new SplitMix64(4n);
  const ids = new Set<number>();
  for (let i = 0; i < 3000; i++) {
    ids.add(sampleToken(0, cands, { temperature: 1, topK: 0, topP: 0.01, minKeep: 2 }, rng));
  }
  assert.deepEqual([...ids].sort(), [0, 1]);
});

Deno.test("banned candidates (logit -inf) are never sampled", () => {
  const cands = [{ id: 5, logit: 1 }, { id: 6, logit: -Infinity }];
  const rng = new SplitMix64(2n);
  for (let i = 0; i < 200; i++) {
    assert.equal(sampleToken(5, cands, { temperature: 2, topK: 0, topP: 1 }, rng), 5);
  }
  assert.equal(
    sampleToken(7, [{ id: 6, logit: -Infinity }], { temperature: 1, topK: 0, topP: 1 }, rng),
    7,
  );
});

Deno.test("speculativeToken keeps the sampler's distribution whatever the draft, and keeps a draft with its probability", () => {
  const candidates = [
    { id: 7, logit: 2 },
    { id: 3, logit: 1.5 },
    { id: 9, logit: 0.5 },
    { id: 4, logit: -1 },
  ];
  const params = { temperature: 0.8, topK: 3, topP: 0.95 };
  const dist = samplingDistribution(candidates, params)!;
  const total = dist.weights.reduce((a, b) => a + b, 0);
  const p = new Map(dist.ids.map((id, i) => [id, dist.weights[i] / total]));
  const trials = 40_000;
  // Drafts in and out of the nucleus (4 is cut by top-k), and one the model never offered.
  for (const draft of [7, 3, 4, 1234]) {
    const rng = new SplitMix64(BigInt(draft));
    const seen = new Map<number, number>();
    let kept = 0;
    for (let i = 0; i < trials; i++) {
      const t = speculativeToken(draft, 7, candidates, params, rng);
      seen.set(t.id, (seen.get(t.id) ?? 0) + 1);
      if (t.kept) {
        kept++;
        assert.equal(t.id, draft);
      }
    }
    for (const [id, q] of p) {
      const got = (seen.get(id) ?? 0) / trials;
      // Four standard deviations of a binomial share.
      assert.ok(
        Math.abs(got - q) < 4 * Math.sqrt(q * (1 - q) / trials),
        `draft ${draft}: id ${id}`,
      );
    }
    assert.equal([...seen.keys()].filter((id) => !p.has(id)).length, 0, "only nucleus ids");
    const keep = p.get(draft) ?? 0;
    assert.ok(Math.abs(kept / trials - keep) < 4 * Math.sqrt(keep * (1 - keep) / trials) + 1e-9);
  }
  // Greedy: the greedy id, kept exactly when it is the draft.
  const greedy = { temperature: 0, topK: 0, topP: 1 };
  assert.deepEqual(speculativeToken(7, 7, candidates, greedy, new SplitMix64(1n)), {
    id: 7,
    kept: true,
  });
  assert.deepEqual(speculativeToken(3, 7, candidates, greedy, new SplitMix64(1n)), {
    id: 7,
    kept: false,
  });
});
