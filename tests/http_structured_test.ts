// Structured output end to end: OpenAI response_format, Anthropic output_config.format and the
// llama.cpp /completion json_schema and grammar; replies parse and ajv validates them.

import assert from "node:assert/strict";
import { Ajv, type ValidateFunction } from "ajv";
import { backendTest, parseSse, post, startTestHead } from "./_head.ts";
import { ORDER } from "./_structured_schemas.ts";

function validator(schema: object): ValidateFunction {
  return new Ajv({ strict: false }).compile(schema);
}

/** Parses `text` and checks it against `schema` with ajv. */
function assertValid(text: string, validate: ValidateFunction, where: string): void {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`${where}: not JSON: ${text} (${e})`);
  }
  assert.ok(validate(value), `${where}: ${text}: ${JSON.stringify(validate.errors)}`);
}

const user = [{ role: "user", content: "Place an order." }];

backendTest(
  "response_format json_schema: the reply validates, buffered (and streamed)",
  async (engine) => {
    const head = await startTestHead({ ctx: 512, ...engine });
    const validate = validator(ORDER);
    try {
      const body = {
        model: "m",
        max_tokens: 120,
        temperature: 0,
        messages: user,
        response_format: {
          type: "json_schema",
          json_schema: { name: "order", schema: ORDER, strict: true },
        },
      };
      const done = await (await post(`${head.url}/v1/chat/completions`, body)).json();
      assert.equal(done.choices[0].finish_reason, "stop");
      assertValid(done.choices[0].message.content, validate, "buffered");
      // Streaming is the same path on both engines (the SDK tool tests stream on the GPU): the
      // GPU run, slow on a CPU adapter, stops here.
      if (engine.engine?.backend === "gpu") return;
      const frames = parseSse(
        await (await post(`${head.url}/v1/chat/completions`, { ...body, stream: true })).text(),
      );
      assert.equal(frames.at(-1)!.data, "[DONE]");
      const text = frames.slice(0, -1).map((f) =>
        JSON.parse(f.data).choices[0]?.delta.content ?? ""
      ).join("");
      assert.equal(text, done.choices[0].message.content);
    } finally {
      await head.close();
    }
  },
);

Deno.test("Anthropic output_config.format, json_object and /completion json_schema and grammar", async () => {
  const head = await startTestHead({ ctx: 512 });
  try {
    const anthropic = await (await post(`${head.url}/v1/messages`, {
      model: "m",
      max_tokens: 120,
      temperature: 0,
      messages: user,
      output_config: { format: { type: "json_schema", schema: ORDER } },
    })).json();
    assert.equal(anthropic.stop_reason, "end_turn");
    assertValid(anthropic.content[0].text, validator(ORDER), "output_config.format");

    // Any object, and a budget that forces it to close early: still whole JSON.
    for (const max_tokens of [60, 12]) {
      const object = await (await post(`${head.url}/v1/chat/completions`, {
        model: "m",
        max_tokens,
        temperature: 0,
        messages: user,
        response_format: { type: "json_object" },
      })).json();
      assertValid(
        object.choices[0].message.content,
        validator({ type: "object" }),
        `json_object ${max_tokens}`,
      );
    }

    const schema = {
      type: "array",
      items: { type: "number", minimum: -1, maximum: 1 },
      minItems: 2,
      maxItems: 4,
    };
    const completion = await (await post(`${head.url}/completion`, {
      prompt: "Numbers:",
      n_predict: 80,
      json_schema: schema,
    })).json();
    assert.equal(completion.stop_type, "eos");
    assertValid(completion.content, validator(schema), "/completion json_schema");

    const gbnf = 'root ::= ("yes" | "no") ", " word\nword ::= [a-z]{2,5} "."\n';
    const graded = await (await post(`${head.url}/completion`, {
      prompt: "Answer:",
      n_predict: 30,
      grammar: gbnf,
    })).json();
    assert.match(graded.content, /^(yes|no), [a-z]{2,5}\.$/);
    assert.equal(graded.stop_type, "eos");
  } finally {
    await head.close();
  }
});

Deno.test("schemas are checked before anything runs: 400s name the path and the keyword", async () => {
  const head = await startTestHead();
  try {
    const chat = (response_format: unknown) =>
      post(`${head.url}/v1/chat/completions`, {
        model: "m",
        max_tokens: 8,
        messages: user,
        response_format,
      });
    const format = (schema: unknown) => ({
      type: "json_schema",
      json_schema: { name: "x", schema },
    });
    /** A /v1/messages request with one tool of these properties. */
    const tool = (properties: unknown, extra: Record<string, unknown>) =>
      post(`${head.url}/v1/messages`, {
        model: "m",
        max_tokens: 8,
        messages: user,
        tools: [{ name: "t", input_schema: { type: "object", properties } }],
        ...extra,
      });
    const cases: [Promise<Response>, string, RegExp][] = [
      [
        chat(format({ type: "object", properties: { a: { not: { type: "null" } } } })),
        "response_format.json_schema.schema.properties.a.not",
        /the keyword "not" is not supported/,
      ],
      [
        chat(format({ type: "string", pattern: "(" })),
        "response_format.json_schema.schema.pattern",
        /cannot use the pattern/,
      ],
      [
        chat(format({ type: "integer", minimum: 10, maximum: 1 })),
        "response_format.json_schema.schema",
        /no integer fits between its bounds/,
      ],
      [
        tool({ n: { type: "integer", minimum: 10, maximum: 1 } }, {
          tool_choice: { type: "auto" },
        }),
        "tools.0.input_schema.properties.n",
        /no integer fits/,
      ],
      [
        tool({ s: { type: "string", pattern: "(" } }, {
          tool_choice: { type: "any" },
          stream: true,
        }),
        "tools.0.input_schema.properties.s.pattern",
        /cannot use the pattern "\("/,
      ],
      [
        tool({ code: { type: "string", pattern: "^[a-z]{5}$", maxLength: 3 } }, {
          tool_choice: { type: "tool", name: "t" },
        }),
        "tools.0.input_schema.properties.code",
        /no string fits pattern "\^\[a-z\]\{5\}\$" \(5 characters\) and maxLength 3 at once/,
      ],
      [
        post(`${head.url}/completion`, { prompt: "x", grammar: "root ::= missing\n" }),
        "grammar",
        /rule "missing" is used but not defined/,
      ],
      [
        post(`${head.url}/completion`, { prompt: "x", grammar: 'root ::= "a"', json_schema: {} }),
        "grammar",
        /cannot be combined with "json_schema"/,
      ],
    ];
    for (const [pending, path, message] of cases) {
      const res = await pending;
      const body = await res.json();
      assert.equal(res.status, 400, JSON.stringify(body));
      const text: string = body.error.message;
      assert.ok(text.startsWith(`${path}: `), `${path} in ${text}`);
      assert.match(text, message);
    }
    assert.deepEqual(head.lines.filter((l) => /failed|unhandled/i.test(l)), []);
  } finally {
    await head.close();
  }
});
