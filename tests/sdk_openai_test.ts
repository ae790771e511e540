// The official OpenAI SDK as an ordinary client of the head's /v1/chat/completions: create,
// stream with usage, a tool call round trip (streamed and not, on both engines) and typed errors.

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { backendTest, startTestHead } from "./_head.ts";

const parameters = {
  type: "object",
  properties: {
    word: { type: "string", maxLength: 8 },
    limit: { type: "integer", minimum: 1, maximum: 3 },
  },
  required: ["word", "limit"],
};
const tools: OpenAI.ChatCompletionTool[] = [{
  type: "function",
  function: { name: "lookup", description: "Look a word up", parameters },
}];

Deno.test("OpenAI SDK: chat.completions.create and stream agree; errors are typed", async () => {
  const head = await startTestHead({ apiKey: "sk-test" });
  try {
    const client = new OpenAI({ apiKey: "sk-test", baseURL: `${head.url}/v1`, maxRetries: 0 });
    const params = {
      model: "gpt-anything",
      max_tokens: 8,
      temperature: 0,
      messages: [
        { role: "system" as const, content: "Be brief." },
        { role: "user" as const, content: "Hello there" },
      ],
    };
    const done = await client.chat.completions.create(params);
    assert.equal(done.object, "chat.completion");
    assert.equal(done.choices[0].finish_reason, "length");
    assert.equal(done.usage?.completion_tokens, 8);
    const text = done.choices[0].message.content;
    assert.equal(typeof text, "string");

    const stream = await client.chat.completions.create({
      ...params,
      stream: true,
      stream_options: { include_usage: true },
    });
    let streamed = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      streamed += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    assert.equal(streamed, text);
    assert.equal(finish, "length");
    assert.equal(usage?.prompt_tokens, done.usage?.prompt_tokens);
    assert.equal(usage?.completion_tokens, done.usage?.completion_tokens);
    // The first request left its history in the prefix cache.
    assert.ok((usage?.prompt_tokens_details?.cached_tokens ?? 0) > 0, JSON.stringify(usage));

    await assert.rejects(
      client.chat.completions.create({ ...params, temperature: 9 }),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError);
        assert.equal(e.status, 400);
        assert.equal(e.param, "temperature");
        return true;
      },
    );
    const denied = new OpenAI({ apiKey: "nope", baseURL: `${head.url}/v1`, maxRetries: 0 });
    await assert.rejects(denied.chat.completions.create(params), OpenAI.AuthenticationError);
  } finally {
    await head.close();
  }
});

backendTest(
  "OpenAI SDK: tool_choice forces a tool call; the tool result goes back",
  async (engine) => {
    const head = await startTestHead({ ctx: 1024, snapshots: 2, ...engine });
    try {
      const client = new OpenAI({ apiKey: "none", baseURL: `${head.url}/v1`, maxRetries: 0 });
      const messages: OpenAI.ChatCompletionMessageParam[] = [
        { role: "user", content: "What does 'tandem' mean?" },
      ];
      const params = {
        model: "gpt-anything",
        max_tokens: 150,
        temperature: 0,
        tools,
        tool_choice: { type: "function" as const, function: { name: "lookup" } },
        messages,
      };
      const done = await client.chat.completions.create(params);
      const choice = done.choices[0];
      assert.equal(choice.finish_reason, "tool_calls");
      const call = choice.message.tool_calls?.[0];
      assert.ok(call && call.type === "function");
      assert.equal(call.function.name, "lookup");
      assert.match(call.id, /^call_/);
      const args = JSON.parse(call.function.arguments);
      const validate = new Ajv({ strict: false }).compile(parameters);
      assert.ok(validate(args), JSON.stringify(validate.errors));

      const stream = client.chat.completions.stream(params);
      const final = await stream.finalChatCompletion();
      const streamedCall = final.choices[0].message.tool_calls?.[0];
      assert.ok(streamedCall && streamedCall.type === "function");
      assert.deepEqual(JSON.parse(streamedCall.function.arguments), args);
      assert.equal(final.choices[0].finish_reason, "tool_calls");

      const result = {
        ...params,
        tool_choice: "auto" as const,
        max_tokens: 5,
        messages: [
          ...messages,
          { role: "assistant" as const, content: null, tool_calls: [call] },
          { role: "tool" as const, tool_call_id: call.id, content: "a bicycle for two" },
        ],
      };
      const answer = await client.chat.completions.create(result);
      assert.ok(answer.choices[0].finish_reason);
      assert.ok((answer.usage?.prompt_tokens_details?.cached_tokens ?? 0) > 0);
      // The answer streamed is the answer buffered.
      const streamedAnswer = await client.chat.completions.stream(result).finalChatCompletion();
      assert.deepEqual(
        streamedAnswer.choices[0].message.content,
        answer.choices[0].message.content,
      );
      assert.deepEqual(
        streamedAnswer.choices[0].message.tool_calls ?? [],
        answer.choices[0].message.tool_calls ?? [],
      );
      assert.equal(streamedAnswer.choices[0].finish_reason, answer.choices[0].finish_reason);
    } finally {
      await head.close();
    }
  },
);
