// Tests of the reply grammars (tool_grammar.ts): a forced call in the template's format, reasoning
// before it when the prompt opened <think>, a format or a call, and 400s that name the field.

import assert from "node:assert/strict";
import { ApiError } from "./api_error.ts";
import type { ToolSpec } from "./output.ts";
import { checkToolSchemas, replyGrammar } from "./tool_grammar.ts";

const tools: ToolSpec[] = [
  {
    name: "get_weather",
    inputSchema: {
      type: "object",
      properties: { city: { enum: ["Paris", "Lima"] } },
      required: ["city"],
    },
    schemaPath: "tools.0.input_schema",
  },
  {
    name: "ping",
    inputSchema: { type: "object", properties: {} },
    schemaPath: "tools.1.input_schema",
  },
];

const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>';

Deno.test("a forced call: one of the tools, its arguments per schema, reasoning first if opened", () => {
  const g = replyGrammar({ forced: tools, reasoning: false })!;
  assert.equal(g.match(call), "complete");
  assert.equal(g.match('<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'), "complete");
  assert.equal(g.match(call.replace("Lima", "Rome")), "invalid");
  assert.equal(g.match(`Sure. ${call}`), "invalid");
  const thinking = replyGrammar({ forced: tools, reasoning: true })!;
  assert.equal(thinking.match(`Lima, then.\n</think>\n\n${call}`), "complete");
  assert.equal(thinking.match(call), "partial", "still reasoning: </think> has not come");
  assert.equal(replyGrammar({ reasoning: false }), undefined, "nothing to constrain");
});

Deno.test("a response format, or instead a call to one of the tools", () => {
  const g = replyGrammar({
    format: { type: "json_schema", schema: { type: "boolean" }, path: "response_format" },
    optional: tools,
    reasoning: false,
  })!;
  assert.equal(g.match("true"), "complete");
  assert.equal(g.match(call), "complete");
  assert.equal(g.match('"true"'), "invalid");
});

Deno.test("unusable schemas and grammars are 400s naming the field", () => {
  const refused = (run: () => unknown, param: string, message: RegExp) =>
    assert.throws(run, (e) => {
      assert.ok(e instanceof ApiError);
      assert.equal(e.param, param);
      assert.match(e.message, message);
      return true;
    });
  const bad: ToolSpec = {
    name: "t",
    inputSchema: { type: "object", properties: { n: { type: "integer", minimum: 3, maximum: 2 } } },
    schemaPath: "tools.2.input_schema",
  };
  refused(
    () => checkToolSchemas([...tools, bad]),
    "tools.2.input_schema.properties.n",
    /no integer fits/,
  );
  refused(
    () =>
      replyGrammar({
        forced: [{ ...bad, inputSchema: { type: "object", not: {} } }],
        reasoning: false,
      }),
    "tools.2.input_schema.not",
    /the keyword "not" is not supported/,
  );
  refused(
    () =>
      replyGrammar({
        format: { type: "gbnf", grammar: "root ::= x\n", path: "grammar" },
        reasoning: false,
      }),
    "grammar",
    /rule "x" is used but not defined/,
  );
  refused(
    () =>
      replyGrammar({
        format: {
          type: "json_schema",
          schema: { type: "object", properties: { a: false }, required: ["a"] },
          path: "response_format.json_schema.schema",
        },
        reasoning: false,
      }),
    "response_format.json_schema.schema",
    /no JSON value fits this schema/,
  );
});
