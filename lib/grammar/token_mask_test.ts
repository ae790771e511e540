// Tests of lib/grammar/token_mask.ts over the tiny test vocabulary: masks allow exactly the tokens
// that keep the text a prefix of the grammar, any logit order then yields a valid value, in budget.

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { SplitMix64 } from "../sampling/sample.ts";
import type { Json } from "../server/fields.ts";
import { PYDANTIC_LIKE } from "../../tests/_structured_schemas.ts";
import { handMetadata, tinyTokenizer } from "../../tests/_tiny_tokenizer.ts";
import { byteLevelEncode } from "../tokenizer/pre_tokenize.ts";
import { TextTokenizer, TokenType } from "../tokenizer/tokenizer.ts";
import { CharSet } from "./charset.ts";
import { Grammar } from "./grammar.ts";
import { JsonGrammarBuilder, ref, rule } from "./json_grammar.ts";
import { GrammarConstraint, VocabIndex } from "./token_mask.ts";

const { tokenizer } = tinyTokenizer("qwen35");
const vocab = VocabIndex.of(tokenizer);

function grammarOf(schema: Json): Grammar {
  return new Grammar(
    rule("root", [[ref(new JsonGrammarBuilder(schema, { strict: true }).value(schema, ""))]]),
  );
}

const allowed = (mask: Uint32Array, id: number) => ((mask[id >>> 5] >>> (id & 31)) & 1) === 1;

/** A random order of the vocabulary: the logits of a model that knows nothing. */
function ranking(rng: SplitMix64): number[] {
  const ids = Array.from({ length: tokenizer.vocabSize }, (_, i) => i);
  for (let i = ids.length - 1; i > 0; i--) {
    const j = Math.floor(rng.nextFloat() * (i + 1));
    [ids[i], ids[j]] = [ids[j], ids[i]];
  }
  return ids;
}

/** Greedy decoding of a random model under `grammar`: the best-ranked allowed token each step. */
async function generate(
  grammar: Grammar,
  seed: bigint,
  maxTokens: number,
): Promise<{ text: string; ended: boolean }> {
  const rng = new SplitMix64(seed);
  const c = new GrammarConstraint(grammar, vocab);
  const ids: number[] = [];
  while (ids.length < maxTokens && !c.done) {
    const mask = await c.mask(maxTokens - ids.length);
    const id = ranking(rng).find((i) => allowed(mask, i));
    assert.ok(id !== undefined, "some token is always allowed");
    c.accept(id);
    ids.push(id);
    if (tokenizer.eosIds.has(id)) break;
  }
  return {
    text: tokenizer.decode(ids, { specials: false }),
    ended: c.done || ids.length < maxTokens,
  };
}

Deno.test("any logit order yields a value the schema validates, within the token budget", async () => {
  const ajv = new Ajv({ strict: false });
  ajv.addFormat("date", /^\d{4}-\d{2}-\d{2}$/);
  const validate = ajv.compile(PYDANTIC_LIKE as object);
  const g = grammarOf(PYDANTIC_LIKE);
  for (let seed = 1n; seed <= 4n; seed++) {
    for (const budget of [400, 60]) {
      const { text, ended } = await generate(g, seed, budget);
      assert.ok(ended, `seed ${seed}: no end within ${budget} tokens: ${text}`);
      const value = JSON.parse(text);
      assert.ok(validate(value), `seed ${seed}: ${text}: ${JSON.stringify(validate.errors)}`);
    }
  }
});

Deno.test("a pattern with gaps in its lengths, or beside a format, never strands a string", async () => {
  // Lengths {2, 3, 6} within 3..5: only "xyz" fits; "a" once led to "ab", a dead end.
  const gaps = grammarOf({
    type: "string",
    pattern: "^(ab|abcdef|xyz)$",
    minLength: 3,
    maxLength: 5,
  });
  // Alone, each allows "2025-": together only "2024-01-01" (the pattern's other branch ends in a
  // letter, the date in a digit).
  const clash = grammarOf({ type: "string", pattern: "^(.{9}[a-z]|2024-01-01)$", format: "date" });
  for (let seed = 1n; seed <= 6n; seed++) {
    for (const [g, want] of [[gaps, "xyz"], [clash, "2024-01-01"]] as const) {
      const { text, ended } = await generate(g, seed, 80);
      assert.ok(ended, `seed ${seed}: no end: ${text}`);
      assert.equal(JSON.parse(text), want, `seed ${seed}: ${text}`);
    }
  }
});

Deno.test("the mask allows exactly the tokens whose text keeps a valid prefix", async () => {
  const g = grammarOf({
    type: "object",
    properties: { a: { type: "string", maxLength: 6 }, b: { enum: [true, 12] } },
  });
  const c = new GrammarConstraint(g, vocab);
  const fatal = new TextDecoder("utf-8", { fatal: true });
  const rng = new SplitMix64(9n);
  for (let step = 0; step < 8 && !c.done; step++) {
    const mask = await c.mask(1000);
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      const bytes = tokenizer.tokenBytes(id, { specials: false });
      if (tokenizer.eosIds.has(id)) {
        assert.equal(
          allowed(mask, id),
          g.match(c.text) === "complete",
          `eos at ${JSON.stringify(c.text)}`,
        );
        continue;
      }
      let piece: string;
      try {
        piece = fatal.decode(bytes);
      } catch {
        continue; // Part of a character: covered by the generation test.
      }
      const fits = bytes.length > 0 && g.match(c.text + piece) !== "invalid";
      assert.equal(
        allowed(mask, id),
        fits,
        `token ${JSON.stringify(piece)} after ${JSON.stringify(c.text)}`,
      );
    }
    c.accept(ranking(rng).find((i) => allowed(mask, i))!);
  }
});

Deno.test("a token the grammar does not allow is refused by accept", () => {
  const c = new GrammarConstraint(grammarOf({ type: "boolean" }), vocab);
  const x = tokenizer.encode("x")[0];
  assert.throws(() => c.accept(x), /token \d+ \("x"\) does not fit the grammar/);
  const eos = [...tokenizer.eosIds][0];
  assert.throws(() => c.accept(eos), /does not allow the text to end/);
});

Deno.test("a walk over the vocabulary lets the event loop turn; its masks are the same", async () => {
  // A pattern-constrained string, walked token by token. With 0 ms slices a walk turns the loop
  // at every clock check: timers run while it works, and the masks equal unsliced ones.
  // Two grammars of one schema: constraints of one grammar share their masks.
  const schema: Json = { type: "string", pattern: "^[a-z ]+x$", minLength: 12 };
  const sliced = new GrammarConstraint(grammarOf(schema), vocab, { sliceMs: 0 });
  const whole = new GrammarConstraint(grammarOf(schema), vocab, { sliceMs: Infinity });
  const rng = new SplitMix64(3n);
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  try {
    for (let step = 0; step < 6 && !sliced.done; step++) {
      const before = ticks;
      const mask = await sliced.mask(1000);
      assert.ok(ticks > before, `step ${step}: no timer ran during the walk`);
      const held = ticks;
      assert.deepEqual(mask, await whole.mask(1000));
      assert.equal(ticks, held, "an unsliced walk never lets a timer run");
      const id = ranking(rng).find((i) => allowed(mask, i) && !tokenizer.eosIds.has(i))!;
      sliced.accept(id);
      whole.accept(id);
    }
  } finally {
    clearInterval(timer);
  }
});

Deno.test("constraints of one grammar share its masks; another grammar's masks are its own", async () => {
  const yes = grammarOf({ const: true });
  const first = await new GrammarConstraint(yes, vocab).mask(100);
  assert.equal(await new GrammarConstraint(yes, vocab).mask(100), first, "computed once");
  // Both grammars' start states have the same key; the masks differ all the same.
  const no = grammarOf({ const: null });
  assert.equal(no.start().maskKey(vocab.maxChars), yes.start().maskKey(vocab.maxChars));
  const nul = await new GrammarConstraint(no, vocab).mask(100);
  const t = tokenizer.encode("t")[0];
  const n = tokenizer.encode("n")[0];
  assert.ok(allowed(first, t) && !allowed(first, n));
  assert.ok(allowed(nul, n) && !allowed(nul, t));
});

Deno.test("constraints at one state asked at once share one walk, unless its budget does not serve theirs", async () => {
  // Fresh grammars: none of their masks is cached. With 0 ms slices a walk turns the event loop
  // at every clock check, so the other constraints are asked while it is under way.
  const schema: Json = { anyOf: [{ const: "a" }, { type: "string", minLength: 20 }] };
  const at = (grammar: Grammar) => new GrammarConstraint(grammar, vocab, { sliceMs: 0 });
  const shared = grammarOf(schema);
  const masks = await Promise.all(Array.from({ length: 4 }, () => at(shared).mask(1000)));
  assert.ok(masks.every((m) => m === masks[0]), "one walk's mask for all four");
  assert.equal(vocab.walks.size, 0, "no walk is left under way");
  const alone = async (remaining: number) => await at(grammarOf(schema)).mask(remaining);
  assert.deepEqual(masks[0], await alone(1000));
  // A budget of 2 bytes refuses the tokens that enter the long string ('"b'); 999 allows them.
  // Whichever walks first, the other's budget is outside what its mask holds for.
  const tight = await alone(3);
  assert.notDeepEqual(tight, masks[0]);
  for (const order of [[3, 1000], [1000, 3]]) {
    const both = grammarOf(schema);
    const got = await Promise.all(order.map((remaining) => at(both).mask(remaining)));
    assert.deepEqual(got, order.map((r) => r === 3 ? tight : masks[0]), `order ${order}`);
  }
});

Deno.test("mask keys look as far as a token's characters reach, not its bytes", async () => {
  // The longest token is "éééé": 8 bytes, 4 characters.
  const e = byteLevelEncode("é");
  const wide = TextTokenizer.fromGguf(
    handMetadata([[...e].join(" "), `${e} ${e}`, `${e}${e} ${e}${e}`], {
      extra: [["<|end|>", TokenType.Control]],
    }),
  );
  const index = VocabIndex.of(wide);
  assert.equal(index.maxBytes, 8);
  assert.equal(index.maxChars, 4);
  const schema: Json = { type: "string", maxLength: 20 };
  const shared = grammarOf(schema);
  /** A constraint of `grammar` after `count` characters of the string. */
  const at = (count: number, grammar = shared) => {
    const c = new GrammarConstraint(grammar, index);
    for (const id of wide.encode(`"${"a".repeat(count)}`)) c.accept(id);
    return c;
  };
  // 8 and 7 characters from maxLength: apart for a token of 8 characters, alike for one of 4, so
  // the second reuses the first's mask, which is the one its own walk gives.
  const twelve = await at(12).mask(100);
  assert.equal(await at(13).mask(100), twelve, "one key");
  assert.deepEqual(await at(13, grammarOf(schema)).mask(100), twelve);
  const four = wide.encode("éééé")[0];
  assert.ok(allowed(await at(16).mask(100), four), "4 characters fit before maxLength");
  assert.ok(!allowed(await at(17).mask(100), four), "3 do not");
});

Deno.test("a class's tokens that are not plain text: its own by their leading characters, the others where they leave it", () => {
  const quote = '"';
  const newline = byteLevelEncode("\n");
  const hand = TextTokenizer.fromGguf(
    handMetadata(
      [
        "a b",
        `ab ${quote}`,
        "Z b",
        `Zb ${quote}`,
        "a 1",
        `a1 ${newline}`,
        `1 ${quote}`,
        `${quote} x`,
      ],
      { extra: [["<|end|>", TokenType.Control]] },
    ),
  );
  const index = VocabIndex.of(hand);
  const lower = CharSet.range(0x61, 0x7a);
  const tokens = index.runSpecials(lower, lower);
  const { special } = index;
  // By text: encoding splits a quote from the letters before it.
  const id = (text: string) =>
    special.ids.find((t) => new TextDecoder().decode(index.bytesOf(t)) === text)!;
  const isOnRun = (t: number) => allowed(tokens.onRun, t);
  /** The exits (as r, the run's characters before them) whose subtrees hold token t. */
  const exitsOver = (t: number) => {
    const at = special.ids.indexOf(t);
    const { nodes, from } = tokens.exits;
    const rs: number[] = [];
    for (let r = 0; r + 1 < from.length; r++) {
      for (let e = from[r]; e < from[r + 1]; e++) {
        const n = nodes[e];
        if (special.first[n] <= at && at < special.first[special.end[n]]) rs.push(r);
      }
    }
    return rs;
  };
  assert.ok(isOnRun(id('ab"')) && isOnRun(id('"x')), "leading characters of the class, or none");
  assert.deepEqual(exitsOver(id('Zb"')), [0]);
  assert.deepEqual(exitsOver(id('1"')), [0]);
  assert.deepEqual(exitsOver(id("a1\n")), [1]);
  // Every token that is not plain text is one or the other, once.
  for (const t of special.ids) {
    assert.equal(exitsOver(t).length + (isOnRun(t) ? 1 : 0), 1, JSON.stringify(index.bytesOf(t)));
  }
});

Deno.test("a token of '\"' and more plain characters than any plain token is read whole", async () => {
  // The only plain tokens are single bytes: the run of a body is one character long, unless it
  // counts the characters after a '"' too.
  const quoted = '"abcdefgh';
  const merges = [...quoted].slice(1).map((c, i) => `${quoted.slice(0, i + 1)} ${c}`);
  const hand = TextTokenizer.fromGguf(
    handMetadata(merges, {
      omit: merges.slice(0, -1).map((m) => m.replace(" ", "")),
      extra: [["<|end|>", TokenType.Control]],
    }),
  );
  const index = VocabIndex.of(hand);
  const [id] = hand.encode(quoted);
  assert.equal(new TextDecoder().decode(index.bytesOf(id)), quoted);
  const opening = async (schema: Json) =>
    allowed(await new GrammarConstraint(grammarOf(schema), index).mask(100), id);
  assert.ok(await opening({ type: "string", maxLength: 8 }), "8 characters fit");
  assert.ok(!(await opening({ type: "string", maxLength: 7 })), "7 do not");
  // After a backslash: an escaped quote, then the letters.
  const escaped = new GrammarConstraint(grammarOf({ type: "string", maxLength: 10 }), index);
  for (const t of hand.encode('"a\\')) escaped.accept(t);
  assert.ok(allowed(await escaped.mask(100), id), "a quote and 8 characters fit after 1");
});

Deno.test("a grammar's escape classes are built with its constraint, not after a backslash", async () => {
  // An index of its own, so that no other test has built these classes already.
  const own = tinyTokenizer("qwen2").tokenizer;
  const index = VocabIndex.of(own);
  const c = new GrammarConstraint(grammarOf({ type: "string", pattern: "^.{0,80}$" }), index);
  for (const t of own.encode('"ab')) c.accept(t);
  await c.mask(100);
  const built = index.builds;
  for (const t of own.encode("\\")) c.accept(t);
  const mask = await c.mask(100);
  assert.ok(allowed(mask, own.encode("t")[0]), "an escape's letter is allowed");
  assert.equal(index.builds, built, "the mask after a backslash builds no class");
});
