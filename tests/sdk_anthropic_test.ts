// The official Anthropic TypeScript SDK as an ordinary client of the head: create, stream,
// count_tokens, a tool call round trip (streamed and not, on both engines) and typed errors.

import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { Ajv } from "ajv";
import { backendTest, startTestHead } from "./_head.ts";

const tools: Anthropic.Tool[] = [{
  name: "get_weather",
  description: "Current weather for a city",
  input_schema: {
    type: "object",
    properties: {
      city: { type: "string", enum: ["Paris", "Tokyo", "Lima"] },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    },
    required: ["city"],
  },
}];

Deno.test("Anthropic SDK: messages.create, messages.stream, countTokens, models.list", async () => {
  // This SDK no longer sends temperature: the operator's default (--temperature 0) makes the
  // replies greedy, so create and stream can be compared.
  const head = await startTestHead({
    apiKey: "test-key",
    snapshots: 2,
    sampling: { temperature: 0 },
  });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: head.url, maxRetries: 0 });
    const params: Anthropic.MessageCreateParamsNonStreaming = {
      model: "tandem-local",
      max_tokens: 8,
      system: "You are brief.",
      messages: [{ role: "user", content: "Hello there" }],
    };
    const msg = await client.messages.create(params);
    assert.equal(msg.type, "message");
    assert.equal(msg.role, "assistant");
    assert.equal(msg.stop_reason, "max_tokens");
    assert.equal(msg.usage.output_tokens, 8);
    assert.equal(msg.content[0].type, "text");

    const stream = client.messages.stream(params);
    let text = "";
    stream.on("text", (delta) => text += delta);
    const final = await stream.finalMessage();
    assert.equal(msg.content[0].type === "text" && msg.content[0].text, text);
    assert.deepEqual(final.content, msg.content);
    assert.equal(final.stop_reason, msg.stop_reason);
    assert.equal(final.usage.output_tokens, 8);

    const count = await client.messages.countTokens({
      model: params.model,
      system: params.system,
      messages: params.messages,
    });
    assert.equal(
      count.input_tokens,
      msg.usage.input_tokens + (msg.usage.cache_read_input_tokens ?? 0) +
        (msg.usage.cache_creation_input_tokens ?? 0),
    );
    const models = await client.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0].id, msg.model);

    const denied = new Anthropic({ apiKey: "wrong", baseURL: head.url, maxRetries: 0 });
    await assert.rejects(denied.messages.create(params), (e) => {
      assert.ok(e instanceof Anthropic.AuthenticationError);
      assert.equal(e.status, 401);
      return true;
    });
    await assert.rejects(
      client.messages.create({ ...params, max_tokens: 0 }),
      (e) => {
        assert.ok(e instanceof Anthropic.BadRequestError);
        assert.equal(e.status, 400);
        assert.equal(e.type, "invalid_request_error");
        assert.match(e.message, /max_tokens/);
        return true;
      },
    );
  } finally {
    await head.close();
  }
});

backendTest(
  "Anthropic SDK: a forced tool call, streamed and buffered, then its tool_result",
  async (engine) => {
    // Greedy (the operator's default, as above): streamed and buffered calls must agree.
    const head = await startTestHead({
      ctx: 1024,
      snapshots: 2,
      sampling: { temperature: 0 },
      ...engine,
    });
    try {
      const client = new Anthropic({ apiKey: "none", baseURL: head.url, maxRetries: 0 });
      const params: Anthropic.MessageCreateParamsNonStreaming = {
        model: "tandem-local",
        max_tokens: 150,
        tools,
        tool_choice: { type: "any" },
        messages: [{ role: "user", content: "Is it raining in Tokyo?" }],
      };
      const call = await client.messages.create(params);
      assert.equal(call.stop_reason, "tool_use");
      const use = call.content.find((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
      assert.ok(use);
      assert.equal(use.name, "get_weather");
      const validate = new Ajv({ strict: false }).compile(tools[0].input_schema);
      assert.ok(validate(use.input), JSON.stringify(validate.errors));

      const streamed = await client.messages.stream(params).finalMessage();
      const streamedUse = streamed.content.find((b) => b.type === "tool_use");
      assert.deepEqual(
        streamedUse && streamedUse.type === "tool_use" && streamedUse.input,
        use.input,
      );
      assert.equal(streamed.stop_reason, "tool_use");

      const result: Anthropic.MessageCreateParamsNonStreaming = {
        ...params,
        tool_choice: { type: "auto" },
        max_tokens: 6,
        messages: [
          ...params.messages,
          { role: "assistant", content: call.content },
          {
            role: "user",
            content: [{ type: "tool_result", tool_use_id: use.id, content: "Light rain, 14°C" }],
          },
        ],
      };
      const answer = await client.messages.create(result);
      assert.equal(answer.type, "message");
      assert.ok(answer.usage.output_tokens > 0);
      assert.ok((answer.usage.cache_read_input_tokens ?? 0) > 0, "the first turn was cached");
      // The answer streamed is the answer buffered.
      const streamedAnswer = await client.messages.stream(result).finalMessage();
      assert.deepEqual(streamedAnswer.content, answer.content);
      assert.equal(streamedAnswer.stop_reason, answer.stop_reason);
    } finally {
      await head.close();
    }
  },
);
