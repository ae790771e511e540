// The engine comparison's own checks, on the tiny test vocabulary: xgrammar, given the vocabulary
// and requests as bench/xgrammar.ts translates them, agrees with lib/grammar where their semantics
// do, and the differences docs/PERFORMANCE.md lists still hold.

import assert from "node:assert/strict";
import { rng } from "../tests/_fuzz.ts";
import { tinyTokenizer } from "../tests/_tiny_tokenizer.ts";
import {
  allowedIds,
  drawAllowed,
  isSet,
  runDocument,
  timeBatch,
  UNBUDGETED,
} from "./grammar_engines.ts";
import { BENCH_SPECS, type GrammarSpec, TEST_SPECS } from "./grammar_specs.ts";
import { buildEngines } from "./xgrammar.ts";

const { tokenizer } = tinyTokenizer("qwen35");
const engines = await buildEngines(tokenizer);

Deno.test("where the semantics agree (GBNF, enums, forced tool calls), every mask is the same", async () => {
  const specs = ["structured-gbnf", "sdk-weather-tool"].map((n) => TEST_SPECS[n])
    .concat([BENCH_SPECS.enum, BENCH_SPECS.gbnf]);
  for (const spec of specs) {
    const compiled = await Promise.all(engines.list.map((e) => e.compile(spec)));
    const random = rng(3);
    let steps = 0;
    for (let d = 0; d < 6; d++) {
      const constraints = await Promise.all(engines.list.map((e, i) => e.constraint(compiled[i])));
      const run = await runDocument(engines, constraints, {
        maxTokens: 200,
        budget: false,
        random,
      });
      for (const c of constraints) c.dispose?.();
      assert.deepEqual(run.diffs, [], `${JSON.stringify(spec).slice(0, 80)}: ${run.text}`);
      assert.notEqual(run.end, "disjoint");
      steps += run.ms[0].length;
    }
    assert.ok(steps > 30, `${steps} steps`);
  }
});

/** The texts of the tokens that only lib/grammar, and only xgrammar, allow after `text`. */
async function differenceAfter(spec: GrammarSpec, text: string): Promise<[string[], string[]]> {
  const masks: Uint32Array[] = [];
  for (const engine of engines.list) {
    const c = await engine.constraint(await engine.compile(spec));
    for (const id of tokenizer.encode(text, { specials: false })) c.accept(id);
    masks.push((await c.mask(UNBUDGETED)).slice());
    c.dispose?.();
  }
  const spell = (id: number) =>
    [...tokenizer.tokenBytes(id, { specials: false })].map((b) => b.toString(16)).join(" ");
  const only = (a: Uint32Array, b: Uint32Array) =>
    allowedIds(a, tokenizer.vocabSize).filter((id) => !isSet(b, id)).map(spell).sort();
  return [only(masks[0], masks[1]), only(masks[1], masks[0])];
}

Deno.test("the listed differences: bytes that are never UTF-8, raw control characters, escapes, number ranges", async () => {
  // A free string: xgrammar allows the bytes no UTF-8 text holds.
  const free = await differenceAfter(BENCH_SPECS["free-strings"], '{"name": "');
  assert.deepEqual(free, [[], ["c0", "c1", "f5", "f6", "f7"]]);
  // A string with a length bound: xgrammar allows raw control characters (invalid JSON) and no
  // escape at all.
  const [ours, xg] = await differenceAfter(BENCH_SPECS["bounded-strings"], '{"name": "');
  assert.deepEqual(ours, ["5c"]);
  assert.ok(xg.includes("0") && xg.includes("1f"), xg.join(","));
  // A pattern: xgrammar writes no escapes (lib/grammar allows \uXXXX of what the pattern reads).
  assert.deepEqual(await differenceAfter(BENCH_SPECS.pattern, '{"sku": "'), [["5c"], []]);
  // A number within [-1, 1]: xgrammar refuses -0.x and allows -1.5.
  const numbers = TEST_SPECS["structured-numbers"];
  assert.deepEqual(await differenceAfter(numbers, "[-"), [["30"], []]);
  assert.deepEqual((await differenceAfter(numbers, "[-1."))[1].length, 9);
  // A pattern beside minLength or a format: xgrammar drops the length and the format.
  const gaps = await differenceAfter(TEST_SPECS["mask-pattern-gaps"], '"');
  assert.deepEqual(gaps[1], ["61", "61 62"]);
});

Deno.test("timeBatch times every step of N sequences, renewing those that finish", async () => {
  const specs = [TEST_SPECS["sdk-weather-tool"], BENCH_SPECS.enum];
  for (const engine of engines.list) {
    // Documents of at most 12 tokens: every sequence finishes and starts again within 40 steps.
    const timing = await timeBatch(engine, tokenizer, specs, {
      sequences: 5,
      steps: 40,
      maxTokens: 12,
      budget: true,
      seed: 2,
    });
    assert.equal(timing.maskMs.length, 40);
    assert.equal(timing.acceptMs.length, 40);
    assert.equal(timing.maskCpuMs.length, 40);
    for (const list of [timing.maskMs, timing.maskCpuMs]) {
      assert.ok(list.every((ms) => ms >= 0 && Number.isFinite(ms)), engine.name);
    }
    // Each of the 5 sequences, at most 12 tokens a document, has begun more than one.
    assert.ok(timing.documents >= 5 + 5 * Math.floor(40 / 12), `${timing.documents} documents`);
  }
});

Deno.test("drawAllowed draws the id that indexing allowedIds' list would, skipped ids left out", () => {
  const random = rng(5);
  for (const [vocabSize, density] of [[100, 0.5], [1000, 0.01], [1024, 0.9], [97, 0.03]]) {
    const mask = new Uint32Array(Math.ceil(vocabSize / 32) + 1);
    // Bits past vocabSize are set too: neither may ever return them.
    for (let id = 0; id < mask.length * 32; id++) {
      if (random() < density || id >= vocabSize) mask[id >>> 5] |= 1 << (id & 31);
    }
    const skip = new Set([0, 31, 32, vocabSize - 1]);
    const listed = allowedIds(mask, vocabSize).filter((id) => !skip.has(id));
    for (let draw = 0; draw < 50; draw++) {
      const r = random();
      const id = drawAllowed(mask, vocabSize, skip, () => r);
      assert.equal(id, listed[Math.floor(r * listed.length)], `${vocabSize} tokens, r ${r}`);
    }
  }
  const only = new Uint32Array(4);
  only[1] = 1 << 3; // id 35, skipped: nothing is left.
  assert.equal(drawAllowed(only, 128, [35], random), undefined);
  assert.equal(drawAllowed(only, 128, [], () => 0.99), 35);
});
