// JSON Schema grammars (json_grammar.ts) judged by ajv, not by this project's code: seeded random
// walks through each schema's grammar, within a byte budget, must end in JSON that ajv validates.

import assert from "node:assert/strict";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { Json } from "../server/fields.ts";
import { Grammar, type ParseState } from "./grammar.ts";
import { JsonGrammarBuilder, ref, rule } from "./json_grammar.ts";

/** Schemas as MCP servers and Pydantic write them, each leaning on different keywords. */
const SCHEMAS: Record<string, Json> = {
  "$defs, $ref, anyOf with null, enum, pattern, integer bounds, additionalProperties false": {
    $defs: {
      Line: {
        type: "object",
        properties: {
          sku: { type: "string", pattern: "^[A-Z]{2}\\d{2}$" },
          qty: { type: "integer", minimum: 1, maximum: 9 },
        },
        required: ["sku", "qty"],
        additionalProperties: false,
      },
    },
    type: "object",
    properties: {
      kind: { enum: ["buy", "sell"] },
      note: { anyOf: [{ type: "string", maxLength: 6 }, { type: "null" }], default: null },
      lines: { type: "array", items: { $ref: "#/$defs/Line" }, minItems: 1, maxItems: 2 },
    },
    required: ["kind", "lines"],
    additionalProperties: false,
  },
  "oneOf of disjoint objects told apart by const, exclusive decimal bounds": {
    oneOf: [
      {
        type: "object",
        properties: {
          shape: { const: "circle" },
          r: { type: "number", exclusiveMinimum: 0, exclusiveMaximum: 2.5 },
        },
        required: ["shape", "r"],
        additionalProperties: false,
      },
      {
        type: "object",
        properties: {
          shape: { const: "rect" },
          w: { type: "integer", minimum: -3, maximum: 300 },
          h: { type: "number", minimum: -0.5, maximum: 0.5 },
        },
        required: ["shape", "w"],
        additionalProperties: false,
      },
    ],
  },
  "nested objects and arrays, string lengths, additionalProperties as a schema": {
    type: "object",
    properties: {
      user: {
        type: "object",
        properties: {
          name: { type: "string", minLength: 2, maxLength: 5 },
          tags: {
            type: "array",
            items: { type: "string", enum: ["a", 'b"', "é"] },
            maxItems: 3,
          },
        },
        required: ["name"],
      },
      scores: { type: "object", additionalProperties: { type: "integer", maximum: 5 } },
      flags: { type: "array", prefixItems: [{ type: "boolean" }, { type: "null" }], items: false },
    },
    required: ["user", "scores"],
  },
  "recursion through $ref, type lists, allOf, const values": {
    $defs: {
      node: {
        type: "object",
        properties: {
          v: { type: ["integer", "string"], maxLength: 3 },
          kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 },
        },
        required: ["v"],
        additionalProperties: false,
      },
    },
    allOf: [
      { $ref: "#/$defs/node" },
      { properties: { v: { const: 7 } } },
    ],
  },
  "a free object (json_object)": { type: "object" },
};

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

for (const [name, schema] of Object.entries(SCHEMAS)) {
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
