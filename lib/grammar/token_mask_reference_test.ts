// GrammarConstraint's masks (lib/grammar/token_mask.ts) against a brute-force reference, bit for bit:
// every token fed byte by byte through the grammar, over random schemas, GBNF and decoding paths.

import assert from "node:assert/strict";
import type { Json } from "../server/fields.ts";
import { bigTokenizer } from "../../tests/_big_vocab.ts";
import { Random } from "../../tests/_fuzz.ts";
import { tinyTokenizer } from "../../tests/_tiny_tokenizer.ts";
import { parseGbnf } from "./gbnf.ts";
import { Grammar, type ParseState } from "./grammar.ts";
import { JsonGrammarBuilder, ref, rule } from "./json_grammar.ts";
import { GrammarConstraint, UNCHECKED_BUDGET, VocabIndex } from "./token_mask.ts";

const allowed = (mask: Uint32Array, id: number) => ((mask[id >>> 5] >>> (id & 31)) & 1) === 1;

/**
 * The mask GrammarConstraint.mask(remaining) must give at `state`, from first principles: a token
 * is allowed when all its bytes feed and the grammar can end within the budget after it; with no
 * token in budget, every token that feeds; the end of text when the text is complete.
 */
function referenceMask(
  g: Grammar,
  vocab: VocabIndex,
  state: ParseState,
  remaining: number,
): Uint32Array {
  const walk = (budget: number) => {
    const mask = new Uint32Array(Math.ceil(vocab.vocabSize / 32));
    let any = false;
    // Most tokens fail on their first byte: feed each first byte once.
    const firsts = new Map<number, ParseState | null>();
    for (let id = 0; id < vocab.vocabSize; id++) {
      const bytes = vocab.bytesOf(id);
      if (!bytes.length) continue;
      let s = firsts.get(bytes[0]);
      if (s === undefined) firsts.set(bytes[0], s = g.feed(state, bytes[0]));
      for (let i = 1; s && i < bytes.length; i++) s = g.feed(s, bytes[i]);
      if (!s || (budget !== Infinity && g.distance(s) > budget)) continue;
      mask[id >>> 5] |= 1 << (id & 31);
      any = true;
    }
    if (state.accepting && state.partial === null) {
      for (const id of vocab.eos) mask[id >>> 5] |= 1 << (id & 31);
      any ||= vocab.eos.length > 0;
    }
    return any ? mask : null;
  };
  return walk(remaining - 1 > UNCHECKED_BUDGET ? Infinity : remaining - 1) ?? walk(Infinity)!;
}

const PATTERNS = [
  "^[A-Z]{2}-\\d{3}$",
  "^[a-z0-9]+(-[a-z0-9]+)*$",
  "^[A-Za-z ,.]{1,12}$",
  "^(foo|bar)baz?$",
  "^.{2,6}$",
  "^[\\u4e00-\\u9fff]+x?$",
  "^[а-яё ]{0,8}$",
  "^\\w+@\\w+\\.com$",
  "^[a-z]{5}$",
  "^[a-z ]{0,6}$",
  "^(ab|[a-c]{2,5})$",
];

/**
 * Counted patterns, whose masks are taken by length (token_mask.ts #byClass): bounds at the edges
 * ({0,n}, {n}, {n,}), nested, in alternations and beside loops, classes with non-ASCII members
 * (tokens that end in half a character); each with length bounds that cut into its lengths.
 */
const COUNTED: readonly [string, readonly Record<string, number>[]][] = [
  ["^[a-z]{0,3}$", [{}, { minLength: 3 }, { maxLength: 2 }]],
  ["^[a-z]{4}$", [{}, { minLength: 4, maxLength: 9 }]],
  ["^[a-e ]{2,}$", [{}, { minLength: 5 }, { maxLength: 3 }, { minLength: 2, maxLength: 2 }]],
  ["^([a-z]{2}){1,3}$", [{}, { minLength: 3 }, { maxLength: 5 }]],
  ["^(x[0-9]{0,3}|[a-z]{4})y?$", [{}, { minLength: 4 }, { maxLength: 2 }]],
  ["^[a-z]{2,4}-[0-9]{1,2}$", [{}, { maxLength: 5 }, { minLength: 6 }]],
  ["^.{0,2}$", [{}, { minLength: 1, maxLength: 1 }]],
  ["^[^a]{1,5}$", [{}, { minLength: 3 }, { maxLength: 2 }]],
  ["^[а-яё]{2,3}$", [{}, { maxLength: 2 }]],
  ["^[ab]{3}|c$", [{}, { maxLength: 3 }, { minLength: 4 }]],
];

/**
 * Loops beside their exits, whose masks take the loop's tokens by length and walk only the tokens
 * that leave it (token_mask.ts #exitWalk): exits outside the class and inside it, exits of several
 * characters, optional ones, a class that changes after the first character, classes that overlap
 * in part; each with length bounds that cut into the loop or the exit.
 */
const LOOP_EXITS: readonly [string, readonly Record<string, number>[]][] = [
  ["^[a-z ]{1,10}[.?!]$", [{}, { maxLength: 4 }, { minLength: 6 }]],
  ["^[a-z.]{1,8}\\.$", [{}, { maxLength: 3 }, { minLength: 5 }]],
  ["^[a-z]{1,6}\\.[a-z]{1,4}$", [{}, { maxLength: 5 }, { minLength: 7, maxLength: 8 }]],
  ["^[a-h]{1,6}(nd|ng|n)?$", [{}, { maxLength: 2 }, { minLength: 4 }]],
  ["^[a-z]{2,9}(ing|ed)$", [{}, { maxLength: 5 }, { minLength: 6 }]],
  ["^[a-z ]{0,12}(\\.|\\(\\))?$", [{}, { maxLength: 3 }, { minLength: 2, maxLength: 4 }]],
  ["^[A-Z ][a-z]{1,5}$", [{}, { maxLength: 3 }, { minLength: 4 }]],
  ["^[a-m]{1,4}[h-z]{1,4}$", [{}, { maxLength: 3 }, { minLength: 5 }]],
  ["^(\\w{1,5}-){0,2}\\w{1,3}$", [{}, { maxLength: 6 }]],
  ["^[^e]{0,6}e[а-я]?$", [{}, { minLength: 4 }, { maxLength: 3 }]],
];

/** A random schema of at most `depth` levels: strings with bounds or patterns, numbers, objects. */
function randomSchema(r: Random, depth: number): Json {
  const kind = r.int(depth > 0 ? 7 : 4);
  switch (kind) {
    case 0: {
      const s: Record<string, Json> = { type: "string" };
      // A pattern or a format with length bounds that cut into its lengths ("ab-" at maxLength of
      // a slug, "12:00:00." at 10 of a time): the mask must allow only characters after which
      // the string can still close. One of the two at a time: a pattern and a format that
      // contradict each other's characters (not lengths) are not caught (json_leaves.ts).
      if (r.chance(0.4)) s.pattern = r.pick(PATTERNS);
      else if (r.chance(0.25)) s.format = r.pick(["date", "time"]);
      if (r.chance(0.4)) s.minLength = r.int(6);
      if (r.chance(0.5)) s.maxLength = (s.format ? 10 : s.pattern ? 7 : 5) + r.int(30);
      return s;
    }
    case 1:
      return r.chance(0.5)
        ? { type: "integer", minimum: -r.int(50), maximum: r.int(500) }
        : { type: "number", exclusiveMinimum: 0, maximum: 1 + r.int(100) };
    case 2:
      return { enum: ["red", "dark red", "Ünïcödé", 12, null].slice(0, 2 + r.int(4)) };
    case 3:
      return { type: r.pick(["boolean", "null", "string"]) };
    case 4:
    case 5: {
      const properties: Record<string, Json> = {};
      const n = 1 + r.int(3);
      for (let i = 0; i < n; i++) {
        properties[r.pick(["a", "ab", "name", "x y"]) + i] = randomSchema(r, depth - 1);
      }
      return {
        type: "object",
        properties,
        required: Object.keys(properties).filter(() => r.chance(0.6)),
        additionalProperties: r.chance(0.7) ? false : { type: "string", minLength: 1 },
      };
    }
    default:
      return { type: "array", items: randomSchema(r, depth - 1), maxItems: 1 + r.int(3) };
  }
}

const GBNF = [
  String.raw`root ::= "[" num ("," " "? num){0,3} "]"
num ::= "-"? [1-9] [0-9]{0,2} | "0"`,
  String.raw`root ::= ("yes" | "no" | "maybe") ("!" | [.]{1,3})? "\n" [a-zé ]{0,10}`,
  String.raw`root ::= "<" [a-z]+ ">" [^<"\\]{0,20} "</" [a-z]+ ">"`,
];

/** Fails unless `mask` and the reference's `want` agree on every token; the allowed ids. */
function sameMask(
  mask: Uint32Array,
  want: Uint32Array,
  vocab: VocabIndex,
  label: string,
): number[] {
  const ids: number[] = [];
  for (let id = 0; id < vocab.vocabSize; id++) {
    if (allowed(mask, id) !== allowed(want, id)) {
      assert.fail(
        `${label}: token ${id} ${JSON.stringify(new TextDecoder().decode(vocab.bytesOf(id)))} ` +
          `is ${allowed(want, id) ? "refused" : "allowed"}; the reference says otherwise`,
      );
    }
    if (allowed(mask, id)) ids.push(id);
  }
  return ids;
}

/**
 * Decodes under `g` with random choices (one in four not plain string text, so strings close),
 * checking every step's mask against the reference. Returns the steps checked.
 */
async function checkWalk(
  g: Grammar,
  vocab: VocabIndex,
  r: Random,
  maxTokens: number,
  label: string,
): Promise<number> {
  const c = new GrammarConstraint(g, vocab, { sliceMs: Infinity });
  let state = g.start();
  let n = 0;
  for (; n < maxTokens && !c.done; n++) {
    const mask = await c.mask(maxTokens - n);
    const ids = sameMask(
      mask,
      referenceMask(g, vocab, state, maxTokens - n),
      vocab,
      `${label}, step ${n} after ${JSON.stringify(c.text)}`,
    );
    const special = ids.filter((id) => !allowed(vocab.plain, id));
    const id = r.pick(special.length && r.chance(0.25) ? special : ids);
    if (vocab.eos.includes(id)) break;
    c.accept(id);
    for (const b of vocab.bytesOf(id)) state = g.feed(state, b)!;
  }
  return n;
}

const schemaGrammar = (schema: Json) =>
  new Grammar(
    rule("root", [[ref(new JsonGrammarBuilder(schema, { strict: true }).value(schema, ""))]]),
  );

Deno.test("masks equal the brute-force reference: random schemas and GBNF, tiny vocabulary", async () => {
  const vocab = VocabIndex.of(tinyTokenizer("qwen35").tokenizer);
  const r = new Random(20261201);
  let steps = 0;
  for (let i = 0; i < 150; i++) {
    const schema = randomSchema(r, 2);
    // Two walks of one grammar, the second with more room: it meets masks the first cached.
    const g = schemaGrammar(schema);
    steps += await checkWalk(g, vocab, r, 6 + r.int(20), JSON.stringify(schema));
    steps += await checkWalk(g, vocab, r, 20 + r.int(40), JSON.stringify(schema));
  }
  for (const text of GBNF) {
    const g = parseGbnf(text + "\n");
    for (let i = 0; i < 4; i++) steps += await checkWalk(g, vocab, r, 10 + r.int(30), text);
  }
  assert.ok(steps > 1200, `only ${steps} steps checked`);
});

Deno.test("masks of counted patterns, loops beside exits, length gaps and two patterns equal the brute-force reference", async () => {
  const vocab = VocabIndex.of(tinyTokenizer("qwen35").tokenizer);
  const r = new Random(20261202);
  let steps = 0;
  for (const [pattern, bounds] of [...COUNTED, ...LOOP_EXITS]) {
    for (const bound of bounds) {
      const g = schemaGrammar({ type: "string", pattern, ...bound });
      for (let i = 0; i < 3; i++) steps += await checkWalk(g, vocab, r, 4 + r.int(12), pattern);
    }
  }
  // Lengths with gaps that the bounds cut between; two patterns at once, each in a counted run of
  // its own class (their classes meet), or with branches that only one of them can finish.
  const joint: Json[] = [
    { type: "string", pattern: "^(ab|abcdef|xyz)$", minLength: 3, maxLength: 5 },
    { type: "string", pattern: "^[0-9a-f-]{36}$", format: "uuid" },
    { type: "string", pattern: "^(.{9}[a-z]|2024-01-01)$", format: "date" },
  ];
  for (const schema of joint) {
    const g = schemaGrammar(schema);
    const label = JSON.stringify(schema);
    for (let i = 0; i < 3; i++) steps += await checkWalk(g, vocab, r, 12 + r.int(30), label);
  }
  assert.ok(steps > 1000, `only ${steps} steps checked`);
});

Deno.test("masks equal the brute-force reference on a 248,320-token vocabulary", async () => {
  const vocab = VocabIndex.of(bigTokenizer());
  const r = new Random(7);
  const schema: Json = {
    type: "object",
    properties: {
      title: { type: "string", pattern: "^[A-Za-z ,.]{1,40}\\.$" },
      line: { type: "string", pattern: "^.{0,30}$", minLength: 2 },
      han: { type: "string", pattern: "^[\\u4e00-\\u9fff]+$", maxLength: 6 },
      note: { type: "string", minLength: 3, maxLength: 20 },
      // A '-' at the 6th character would leave the slug no room to close.
      tag: { type: "string", pattern: "^[a-z0-9]+(-[a-z0-9]+)*$", maxLength: 6 },
    },
    required: ["title", "line", "han", "note", "tag"],
    additionalProperties: false,
  };
  await checkWalk(schemaGrammar(schema), vocab, r, 30, "big vocabulary");
  /** A constraint of `g` and its state after `text`, fed a byte token at a time. */
  const after = (g: Grammar, text: string) => {
    const c = new GrammarConstraint(g, vocab, { sliceMs: Infinity });
    let state = g.start();
    for (const b of new TextEncoder().encode(text)) {
      c.accept(vocab.all.ids.find((id) => vocab.bytesOf(id).join() === String(b))!);
      state = g.feed(state, b)!;
    }
    return { c, state };
  };
  // At a string's first character with minLength 2: ' "' closes it too soon, '  "' and '!("' do
  // not (tokens that start with plain characters share the body's state per length, not across).
  const short = schemaGrammar({ type: "string", minLength: 2 });
  const first = after(short, '"');
  sameMask(
    await first.c.mask(100),
    referenceMask(short, vocab, first.state, 100),
    vocab,
    "minLength 2",
  );
  // Right after a backslash, tokens that start with an escape's letter ("nothing") read its
  // character, then go on as a body does: escapes that the pattern or bounds refuse ('.' reads no
  // newline), that leave no room, or that step the pattern apart from the others; tight budgets.
  // Before an opening quote or after a backslash, tokens of '"' and then plain text read that text
  // as a body does.
  const escapes: [Json, string][] = [
    [{ type: "string", pattern: "^.{0,30}$", minLength: 2 }, '"ab\\'],
    [{ type: "string", maxLength: 6 }, '"abcd\\'],
    [{ type: "string", pattern: "^[a-z\\n]{0,8}$" }, '"ab\\'],
    [{ type: "string", pattern: "^(\\t[a-z]+|\\n[0-9]+|/x)$" }, '"\\'],
    [{ type: "string", minLength: 12 }, '"\\'],
    [{ type: "string", pattern: '^[a-z"]{0,4}$' }, '"ab\\'],
    [{ type: "string", pattern: "^[a-z]{2,3}$" }, ""],
    [{ type: "string", maxLength: 2 }, ""],
  ];
  for (const [schema, text] of escapes) {
    const g = schemaGrammar(schema);
    for (const remaining of [100, 4]) {
      const { c, state } = after(g, text);
      const label = `${JSON.stringify(schema)} after ${JSON.stringify(text)}, ${remaining} left`;
      sameMask(await c.mask(remaining), referenceMask(g, vocab, state, remaining), vocab, label);
    }
  }
});
