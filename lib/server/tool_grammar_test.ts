// Tool-call checking and forcing: JSON Schema checks, the grammar's prefix matching, and the
// constraint turning any logit order of the tiny vocabulary into a valid call.

import assert from "node:assert/strict";
import type { TopEntry } from "../../engine/stage.ts";
import { SplitMix64 } from "../sampling/sample.ts";
import type { JsonObject } from "./fields.ts";
import { schemaError } from "./json_schema.ts";
import { parseToolCall, type ToolSpec } from "./output.ts";
import { ToolCallConstraint, ToolCallGrammar } from "./tool_grammar.ts";
import { tinyTokenizer } from "../../tests/_tiny_tokenizer.ts";

const schema: JsonObject = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 2, maxLength: 6 },
    days: { type: "integer", minimum: 1, maximum: 14 },
    unit: { enum: ["c", "f"] },
    tags: { type: "array", items: { type: "string", maxLength: 3 }, maxItems: 2 },
    exact: { type: ["boolean", "null"] },
    extra: { type: "object" },
    ratio: { type: "number" },
  },
  required: ["city", "days"],
  additionalProperties: false,
};

Deno.test("schemaError names the path and the broken keyword", () => {
  assert.equal(schemaError({ city: "Rome", days: 3 }, schema), null);
  const cases: [unknown, string][] = [
    [{ days: 3 }, 'input: missing required property "city"'],
    [{ city: "Rome", days: 3.5 }, "input.days: expected integer, got a number"],
    [{ city: "Rome", days: 30 }, "input.days: expected a number ≤ 14, got 30"],
    [{ city: "R", days: 1 }, "input.city: expected at least 2 characters, got 1"],
    [{ city: "Rome", days: 1, unit: "k" }, 'input.unit: expected one of ["c","f"], got "k"'],
    [
      { city: "Rome", days: 1, tags: ["a", "b", "c"] },
      "input.tags: expected at most 2 items, got 3",
    ],
    [{ city: "Rome", days: 1, other: 1 }, 'input: unexpected property "other"'],
    [
      { city: "Rome", days: 1, exact: "yes" },
      "input.exact: expected boolean or null, got a string",
    ],
  ];
  for (const [value, message] of cases) {
    assert.equal(schemaError(value as JsonObject, schema), message);
  }
  assert.equal(schemaError(1, { anyOf: [{ type: "string" }, { type: "integer" }] }), null);
  assert.match(schemaError(1, { oneOf: [{ type: "number" }, { type: "integer" }] })!, /2 oneOf/);
});

const tools: ToolSpec[] = [
  { name: "get_weather", inputSchema: schema },
  { name: "ping", inputSchema: { type: "object", properties: {} } },
];

Deno.test("the grammar accepts exactly the prefixes of a valid call", () => {
  const g = new ToolCallGrammar(tools);
  const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 12}}\n' +
    "</tool_call>";
  for (let i = 0; i < call.length; i++) {
    assert.equal(g.match(call.slice(0, i)), "partial", call.slice(0, i));
  }
  assert.equal(g.match(call), "complete");
  assert.equal(g.match(call + " "), "invalid");
  const invalid = [
    '<tool_call>\n{"name": "get_time"',
    '<tool_call>\n{"name": "get_weather", "arguments": {"days"', // Keys in schema order.
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "R"}', // minLength 2.
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 15',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 0',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}</', // No "\n".
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Roma di"', // maxLength 6.
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2, "unit": "k',
    "Sure! <tool_call>",
  ];
  for (const text of invalid) assert.equal(g.match(text), "invalid", text);
  const full = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2, ' +
    '"unit": "f", "tags": ["a", "bc"], "exact": null, "extra": {"k": [1, true]}, ' +
    '"ratio": -0.25}}\n</tool_call>';
  assert.equal(g.match(full), "complete");
  assert.equal(g.match('<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'), "complete");
});

/** A random-weight model's view: every token, in a random order of logits. */
function randomRanking(rng: SplitMix64, vocab: number): TopEntry[] {
  const ids = Array.from({ length: vocab }, (_, i) => i);
  for (let i = vocab - 1; i > 0; i--) {
    const j = Math.floor(rng.nextFloat() * (i + 1));
    [ids[i], ids[j]] = [ids[j], ids[i]];
  }
  return ids.map((id, rank) => ({ id, logit: -rank }));
}

Deno.test("the constraint turns any logit order of the real vocabulary into a valid call", () => {
  const { tokenizer } = tinyTokenizer("qwen35");
  const fatal = new TextDecoder("utf-8", { fatal: true });
  let fallbacks = 0;
  for (let seed = 1n; seed <= 6n; seed++) {
    const rng = new SplitMix64(seed);
    const constraint = new ToolCallConstraint(tokenizer, tools);
    const ids: number[] = [];
    while (!constraint.done) {
      assert.ok(ids.length < 400, `seed ${seed}: no end after ${JSON.stringify(constraint.text)}`);
      // Only the top 64 of the order: sometimes none fits and the fallback has to step in.
      const ranked = randomRanking(rng, tokenizer.vocabSize).slice(0, 64);
      const viable = constraint.viable(ranked, 1);
      const id = viable.length ? viable[0].id : constraint.fallback();
      if (!viable.length) fallbacks++;
      if (viable.length) {
        // Every better-ranked token was rightly refused: not whole text, or text that breaks
        // the grammar. (Control tokens are rendered as nothing in replies, so never text.)
        const probe = new ToolCallGrammar(tools);
        for (const c of ranked.slice(0, ranked.indexOf(viable[0]))) {
          const bytes = tokenizer.tokenBytes(c.id, { specials: false });
          let piece: string | null;
          try {
            piece = bytes.length ? fatal.decode(bytes) : null;
          } catch (e) {
            if (!(e instanceof TypeError)) throw e;
            piece = null; // Part of a multi-byte character.
          }
          if (piece !== null) assert.equal(probe.match(constraint.text + piece), "invalid");
        }
      }
      constraint.accept(id);
      ids.push(id);
    }
    const text = tokenizer.decode(ids, { specials: false });
    assert.equal(text, constraint.text);
    assert.ok(text.startsWith("<tool_call>\n") && text.endsWith("\n</tool_call>"), text);
    const call = parseToolCall(text.slice("<tool_call>".length, -"</tool_call>".length), tools);
    assert.ok(!("error" in call), `seed ${seed}: ${JSON.stringify(call)} from ${text}`);
    for (const id of ids) assert.ok(!tokenizer.eosIds.has(id));
  }
  assert.ok(fallbacks > 0, "the fallback path was never taken");
});
