// JSON Schema grammars (json_grammar.ts) judged by ajv, not by this project's code: seeded random
// walks through each schema's grammar, within a byte budget, must end in JSON that ajv validates.

import assert from "node:assert/strict";
import { Ajv2020 } from "ajv/dist/2020.js";
import { Grammar, type ParseState } from "./grammar.ts";
import { JsonGrammarBuilder, ref, rule } from "./json_grammar.ts";
import { WALK_SCHEMAS } from "../../tests/_structured_schemas.ts";

/** Code points a walk draws from: printable ASCII, a 2-byte and a 4-byte character. */
const ALPHABET = [...Array.from({ length: 95 }, (_, i) => 0x20 + i), 0xe9, 0x1f600];

function utf8Length(cp: number): number {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/**
 * One seeded walk: at each step a random code point the grammar allows and that leaves room to
 * finish within `budget` bytes; stops at a complete text with some chance, or when it must.
 */
function walk(grammar: Grammar, budget: number, next: () => number): string {
  let state: ParseState = grammar.start();
  let used = 0;
  const text: number[] = [];
  while (true) {
    const options: [number, ParseState][] = [];
    for (const cp of ALPHABET) {
      const after = grammar.advance(state, cp);
      if (after && used + utf8Length(cp) + grammar.distance(after) <= budget) {
        options.push([cp, after]);
      }
    }
    if (state.accepting && (options.length === 0 || next() < 0.3)) {
      return String.fromCodePoint(...text);
    }
    assert.ok(options.length > 0, `stuck after ${String.fromCodePoint(...text)}`);
    const [cp, after] = options[Math.floor(next() * options.length)];
    text.push(cp);
    used += utf8Length(cp);
    state = after;
  }
}

function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

for (const [name, schema] of Object.entries(WALK_SCHEMAS)) {
  Deno.test(`random walks validate with ajv: ${name}`, () => {
    const builder = new JsonGrammarBuilder(schema, { strict: true });
    const grammar = new Grammar(rule("root", [[ref(builder.value(schema, ""))]]));
    const validate = new Ajv2020({ strict: false }).compile(schema as object);
    const next = seeded(7);
    for (let i = 0; i < 24; i++) {
      // From the shortest whole value (the tightest budget) up.
      const budget = grammar.distance(grammar.start()) + Math.floor(next() * 160);
      const text = walk(grammar, budget, next);
      assert.ok(new TextEncoder().encode(text).length <= budget, text);
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (e) {
        throw new Error(`not JSON: ${text} (${e})`);
      }
      assert.ok(validate(value), `${text}: ${JSON.stringify(validate.errors)}`);
    }
  });
}
