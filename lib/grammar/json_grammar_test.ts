// Tests of JSON Schema → grammar (json_grammar.ts, json_leaves.ts, grammar.ts): which texts each
// schema's grammar takes whole, as a prefix, or not at all; the schemas it refuses and why.

import assert from "node:assert/strict";
import type { Json } from "../server/fields.ts";
import { Grammar, GrammarError } from "./grammar.ts";
import { JsonGrammarBuilder, ref, rule } from "./json_grammar.ts";
import { SchemaError } from "./json_schema.ts";

function grammarOf(schema: Json, strict = true): Grammar {
  const builder = new JsonGrammarBuilder(schema, { strict });
  return new Grammar(rule("root", [[ref(builder.value(schema, ""))]]));
}

type Verdict = "complete" | "partial" | "invalid";

function expect(schema: Json, cases: Record<string, Verdict>): void {
  const g = grammarOf(schema);
  for (const [text, verdict] of Object.entries(cases)) {
    assert.equal(g.match(text), verdict, `${JSON.stringify(schema)} on ${text}`);
  }
}

Deno.test("objects: declared keys in order, optional ones skipped, required ones kept", () => {
  expect({
    type: "object",
    properties: { a: { type: "integer" }, b: { type: "boolean" }, c: { type: "null" } },
    required: ["b"],
  }, {
    '{"b": true}': "complete",
    '{"a": -3, "b": false, "c": null}': "complete",
    '{"a": 1, "b": true}': "complete",
    '{"b": true, "c": null}': "complete",
    '{"a": 1': "partial",
    '{"a": 1}': "invalid",
    '{"a": 1, "c": null}': "invalid",
    '{"b": true, "a": 1}': "invalid",
    '{"b":true}': "invalid",
    "{}": "invalid",
  });
  // Extra keys when asked for, never a declared name.
  expect({
    type: "object",
    properties: { a: { type: "integer" } },
    additionalProperties: { type: "string" },
  }, {
    '{"a": 1, "x": "y"}': "complete",
    '{"x": "y", "z": ""}': "complete",
    '{"a": 1, "a": "y"}': "invalid",
    '{"x": 1}': "invalid",
  });
  expect({ type: "object" }, { "{}": "complete", '{"k": [1, {"z": "w"}], "n": null}': "complete" });
});

Deno.test("strings: escapes, length in characters, patterns and formats on the decoded value", () => {
  expect({ type: "string", minLength: 2, maxLength: 3 }, {
    '"ab"': "complete",
    '"a\\"c"': "complete",
    '"é😀"': "complete",
    '"\\u00e9x"': "complete",
    '"a"': "invalid",
    '"abcd"': "invalid",
    '"a\nb"': "invalid",
    '"\\ud83d\\ude00x"': "invalid",
    '"\\q"': "invalid",
  });
  expect({ type: "string", pattern: "^[a-z]+-\\d{2}$" }, {
    '"ab-12"': "complete",
    '"ab-1': "partial",
    '"ab-1"': "invalid",
    '"ab-123"': "invalid",
    '"Ab-12"': "invalid",
    '"\\u0061b-12"': "complete",
  });
  expect({ type: "string", format: "date" }, {
    '"2024-02-28"': "complete",
    '"2024-13-01"': "invalid",
    '"2024-1': "partial",
  });
  expect({ type: "string", format: "uuid" }, {
    '"123e4567-e89b-12d3-a456-426614174000"': "complete",
    '"123e4567-e89b-12d3-a456-42661417400"': "invalid",
  });
});

Deno.test("strings: a pattern or format with length bounds allows only prefixes that can close", () => {
  const cases: [Json, Record<string, Verdict>][] = [
    // "abc" fits maxLength 5, but "-" and two digits still to come would not.
    [
      { type: "string", pattern: "^[a-z]+-\\d{2}$", maxLength: 5 },
      { '"ab-12"': "complete", '"ab': "partial", '"abc': "invalid", '"ab-1': "partial" },
    ],
    // "a" matches whole, but minLength 3 needs more and the pattern takes none.
    [
      { type: "string", pattern: "^(a|bc+)$", minLength: 3 },
      { '"a': "invalid", '"\\u0061': "invalid", '"bc': "partial", '"bcc"': "complete" },
    ],
    // A fraction of seconds takes at least a digit and a zone after the '.': 11 characters.
    [
      { type: "string", format: "time", maxLength: 10 },
      { '"12:00:00Z"': "complete", '"12:00:00.': "invalid", '"12:00:00\\u002e': "invalid" },
    ],
    [
      { type: "string", pattern: "^[a-z]{2,8}$", maxLength: 4 },
      { '"abcd"': "complete", '"abcde': "invalid" },
    ],
  ];
  for (const [schema, verdicts] of cases) expect(schema, verdicts);
});

Deno.test("numbers: integer and decimal bounds hold for every prefix", () => {
  expect({ type: "integer", minimum: 10, maximum: 200 }, {
    "10": "complete",
    "200": "complete",
    "1": "partial",
    "2": "partial",
    "201": "invalid",
    "9": "partial",
    "0": "invalid",
    "3": "partial",
    "30": "complete",
    "300": "invalid",
    "-1": "invalid",
    "15.0": "invalid",
  });
  expect({ type: "number", exclusiveMinimum: -1, maximum: 0.5 }, {
    "-0.5": "complete",
    "-1": "invalid",
    "-0.99": "complete",
    "0.5": "complete",
    "0.51": "invalid",
    "0.": "partial",
    "01": "invalid",
    "1": "invalid",
  });
  expect({ type: "number", minimum: 0, exclusiveMaximum: true, maximum: 1 }, {
    "0.999": "complete",
    "1": "invalid",
  });
});

Deno.test("arrays, tuples, unions, enums, const, $ref recursion and allOf", () => {
  expect({ type: "array", items: { enum: ["a", "b"] }, minItems: 1, maxItems: 2 }, {
    '["a"]': "complete",
    '["a", "b"]': "complete",
    "[]": "invalid",
    '["a", "b", "a"]': "invalid",
    '["c"]': "invalid",
  });
  expect({ prefixItems: [{ type: "integer" }, { type: "string" }], items: false, type: "array" }, {
    '[1, "x"]': "complete",
    "[1]": "complete",
    '[1, "x", 2]': "invalid",
    '["x"]': "invalid",
  });
  expect({ anyOf: [{ type: "integer" }, { type: "string", maxLength: 1 }], nullable: true }, {
    "7": "complete",
    '"x"': "complete",
    '"xy"': "invalid",
  });
  expect({ type: ["string", "null"] }, { "null": "complete", '"s"': "complete", "1": "invalid" });
  expect({ enum: [1, "two", { a: [null] }], type: ["integer", "object"] }, {
    "1": "complete",
    '{"a":[null]}': "complete",
    '"two"': "invalid",
  });
  expect({ const: "x" }, { '"x"': "complete", '"y"': "invalid" });
  const tree = {
    $defs: {
      node: {
        type: "object",
        properties: {
          v: { type: "integer" },
          kids: { type: "array", items: { $ref: "#/$defs/node" } },
        },
        required: ["v"],
      },
    },
    $ref: "#/$defs/node",
  };
  expect(tree, {
    '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}': "complete",
    '{"v": 1, "kids": [{"kids": []}]}': "invalid",
  });
  expect({
    allOf: [
      { type: "object", properties: { a: { type: "integer" } }, required: ["a"] },
      { properties: { b: { type: "string" } }, required: ["b"] },
    ],
  }, { '{"a": 1, "b": "x"}': "complete", '{"a": 1': "partial", '{"a": 1}': "invalid" });
});

/** The SchemaError a schema is refused with, as "path: problem". */
function refusal(schema: Json, strict = true): string {
  try {
    grammarOf(schema, strict);
  } catch (e) {
    if (e instanceof SchemaError) return e.message;
    if (e instanceof GrammarError) return `grammar: ${e.message}`;
    throw e;
  }
  return "accepted";
}

Deno.test("unsupported keywords and unusable schemas are refused, naming the path", () => {
  const cases: [Json, RegExp][] = [
    [
      { type: "object", properties: { a: { not: { type: "null" } } } },
      /^properties\.a\.not: the keyword "not" is not supported/,
    ],
    [{ type: "array", uniqueItems: true }, /^uniqueItems: the keyword "uniqueItems"/],
    [{ type: "integer", multipleOf: 3 }, /^multipleOf: the keyword "multipleOf"/],
    [{ type: "object", patternProperties: { "^x": {} } }, /^patternProperties: /],
    [{ type: "string", pattern: "(" }, /^pattern: cannot use the pattern "\(": a missing '\)'/],
    [{ type: "string", pattern: "(?=a)" }, /^pattern: .*lookahead/],
    [
      { type: "integer", minimum: 10, maximum: 1 },
      /no integer fits between its bounds \(≥ 10 and ≤ 1\)/,
    ],
    [{ type: "integer", exclusiveMinimum: 1, exclusiveMaximum: 2 }, /no integer fits/],
    [{ type: "string", minLength: 5, maxLength: 2 }, /^minLength 5 is above maxLength 2/],
    [
      {
        type: "object",
        properties: { s: { type: "string", pattern: "^[a-z]{5}$", maxLength: 3 } },
      },
      /^properties\.s: no string fits pattern "\^\[a-z\]\{5\}\$" \(5 characters\) and maxLength 3 at once/,
    ],
    [
      { type: "string", pattern: "^[a-z]{2,3}$", format: "date" },
      /^no string fits pattern .* \(2 to 3 characters\) and format "date" \(10 characters\) at once/,
    ],
    [
      { type: "string", pattern: "abc", minLength: 1, maxLength: 2 },
      /\(3 or more characters\) and minLength 1 and maxLength 2 at once; loosen one of them/,
    ],
    [
      { type: "string", pattern: "^(ab|abcdef)$", minLength: 3, maxLength: 5 },
      /\(2 or 6 characters\) and minLength 3 and maxLength 5 at once; loosen one of them/,
    ],
    [
      { type: "string", pattern: "^(ab)+$", minLength: 3, maxLength: 3 },
      /\(2, 4, 6, 8, … characters\) and minLength 3 and maxLength 3 at once/,
    ],
    [
      { type: "string", pattern: "^20[a-z]{8}$", format: "date" },
      /^no string fits pattern .* \(10 characters\) and format "date" \(10 characters\) at once \(their characters or lengths clash\); loosen one of them/,
    ],
    [{ type: "array", minItems: 3, maxItems: 1 }, /^minItems 3 is above the 1 items allowed/],
    [{ enum: [] }, /^enum: an empty enum allows no value/],
    [{ type: "string", enum: [1, 2] }, /^enum: no value of the enum fits/],
    [{ $ref: "#/$defs/missing" }, /^\$ref: "#\/\$defs\/missing" points to nothing/],
    [{ $ref: "https://example.com/s.json" }, /only local references/],
    [
      { type: "object", required: ["x"], additionalProperties: false },
      /^required: "x" is required, but it is not in properties/,
    ],
    [{ type: "wat" }, /^type: unknown type "wat"/],
    [{ type: "string", minLength: -1 }, /^minLength: expected a non-negative integer/],
    [{ type: "array", maxItems: 100000 }, /more than 4096 positions/],
    [{ type: "string", pattern: "a{5000}" }, /at most 4096 are supported/],
  ];
  for (const [schema, message] of cases) {
    assert.match(refusal(schema), message, JSON.stringify(schema));
  }
  // Checked only (not generated): what cannot be generated is unconstrained, but errors stay.
  assert.equal(refusal({ type: "object", properties: { a: { not: {} } } }, false), "accepted");
  assert.equal(refusal({ type: "string", pattern: "(?=a)b" }, false), "accepted");
  assert.match(
    refusal({ type: "string", pattern: "(" }, false),
    /^pattern: cannot use the pattern/,
  );
  assert.match(refusal({ type: "integer", minimum: 3, maximum: 2 }, false), /no integer fits/);
});

Deno.test("a grammar's distance is the fewest bytes to a whole value", () => {
  const g = grammarOf({
    type: "object",
    properties: { s: { type: "string", minLength: 3 }, n: { type: "integer", minimum: 100 } },
    required: ["s", "n"],
  });
  let state = g.start();
  // {"s": "xxx", "n": 100}
  assert.equal(g.distance(state), 22);
  for (const b of new TextEncoder().encode('{"s": "x')) state = g.feed(state, b)!;
  assert.equal(g.distance(state), 14);
  // Inside an escape: the escape's rest, then what the value still needs.
  const nul = grammarOf({ type: "string", pattern: "\\u0000$" });
  let inEscape = nul.start();
  for (const b of new TextEncoder().encode('"ab\\')) inEscape = nul.feed(inEscape, b)!;
  assert.equal(nul.distance(inEscape), 6);
  let closed = nul.start();
  for (const b of new TextEncoder().encode('"\\u0000"')) closed = nul.feed(closed, b)!;
  assert.ok(closed.final, "a closed string leaves nothing open");
  // Past minLength the string only needs its closing quote.
  for (const b of new TextEncoder().encode("xxxxx")) state = g.feed(state, b)!;
  assert.equal(g.distance(state), 12);
});
