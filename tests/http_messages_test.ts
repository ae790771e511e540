// POST /v1/messages end to end on an unsplit head (tiny model, CPU reference): streamed equals
// buffered, stop sequences, prefix cache, forced tool calls and their round trip, cancellation.

import assert from "node:assert/strict";
import { parseSse, post, startTestHead, streamedText, waitFor } from "./_head.ts";

const ask = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "anything",
  max_tokens: 12,
  temperature: 0,
  messages: [{ role: "user", content }],
  ...extra,
});

Deno.test("streamed /v1/messages carries the same text, usage and stop reason as buffered", async () => {
  const head = await startTestHead({ slots: 1 });
  try {
    for (const prompt of ["Hello there", "Write a haiku about the sea"]) {
      const buffered = await (await post(`${head.url}/v1/messages`, ask(prompt))).json();
      const res = await post(`${head.url}/v1/messages`, ask(prompt, { stream: true }));
      assert.equal(res.status, 200);
      assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
      const frames = parseSse(await res.text());
      const names = frames.map((f) => f.event);
      assert.deepEqual(names.slice(0, 3), ["message_start", "ping", "content_block_start"]);
      assert.deepEqual(names.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
      for (const f of frames) assert.equal(JSON.parse(f.data).type, f.event);
      assert.equal(streamedText(frames), buffered.content[0].text);
      const delta = JSON.parse(frames.at(-2)!.data);
      assert.equal(delta.delta.stop_reason, buffered.stop_reason);
      assert.equal(delta.usage.output_tokens, buffered.usage.output_tokens);
      const start = JSON.parse(frames[0].data).message;
      assert.equal(start.model, buffered.model);
      const total = (u: Record<string, number>) =>
        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
      assert.equal(total(start.usage), total(buffered.usage));
      assert.deepEqual(delta.usage, { ...start.usage, output_tokens: 12 }, "start and end agree");
      assert.equal(buffered.stop_reason, "max_tokens");
      assert.equal(buffered.usage.output_tokens, 12);
    }
  } finally {
    await head.close();
  }
});

Deno.test("a stop sequence across token boundaries ends the reply before it", async () => {
  const head = await startTestHead();
  try {
    const full = await (await post(
      `${head.url}/v1/messages`,
      ask("Hello there", {
        max_tokens: 16,
      }),
    )).json();
    const text: string = full.content[0].text;
    // A stop string that starts inside one token and ends inside a later one.
    const stop = text.slice(3, 9);
    assert.equal(stop.length, 6);
    const cut = text.indexOf(stop);
    const req = ask("Hello there", { max_tokens: 16, stop_sequences: ["never-there", stop] });
    const body = await (await post(`${head.url}/v1/messages`, req)).json();
    assert.equal(body.stop_reason, "stop_sequence");
    assert.equal(body.stop_sequence, stop);
    assert.equal(body.content.length ? body.content[0].text : "", text.slice(0, cut).trimEnd());
    const frames = parseSse(
      await (await post(`${head.url}/v1/messages`, { ...req, stream: true })).text(),
    );
    assert.equal(streamedText(frames), text.slice(0, cut).trimEnd());
    assert.ok(!streamedText(frames).includes(stop));
    assert.equal(JSON.parse(frames.at(-2)!.data).delta.stop_sequence, stop);
  } finally {
    await head.close();
  }
});

Deno.test("the next turn restores the cached history and replies as an uncached head does", async () => {
  const cached = await startTestHead({ snapshots: 4 });
  const plain = await startTestHead({ snapshots: 0 });
  try {
    const first = ask("Tell me about rivers", { system: "You are terse." });
    const one = await (await post(`${cached.url}/v1/messages`, first)).json();
    assert.equal(one.usage.cache_read_input_tokens, 0);
    // The history (the prompt before its generation prompt) was computed, then written.
    assert.ok(one.usage.cache_creation_input_tokens > 0, JSON.stringify(one.usage));
    const second = {
      ...first,
      messages: [
        ...first.messages,
        { role: "assistant", content: one.content },
        { role: "user", content: "And about lakes?" },
      ],
    };
    const two = await (await post(`${cached.url}/v1/messages`, second)).json();
    const reference = await (await post(`${plain.url}/v1/messages`, second)).json();
    assert.ok(two.usage.cache_read_input_tokens > 0, JSON.stringify(two.usage));
    assert.equal(reference.usage.cache_read_input_tokens, 0);
    assert.equal(reference.usage.cache_creation_input_tokens, 0);
    assert.equal(
      two.usage.input_tokens + two.usage.cache_read_input_tokens +
        two.usage.cache_creation_input_tokens,
      reference.usage.input_tokens,
    );
    assert.deepEqual(two.content, reference.content);
    assert.equal(two.stop_reason, reference.stop_reason);
    const metrics = await (await fetch(`${cached.url}/metrics`)).text();
    const line = metrics.split("\n").find((l) => l.startsWith("tandem_cached_prompt_tokens_total"));
    assert.equal(line, `tandem_cached_prompt_tokens_total ${two.usage.cache_read_input_tokens}`);
  } finally {
    await cached.close();
    await plain.close();
  }
});

const weatherTool = {
  name: "get_weather",
  description: "Current weather for a city",
  input_schema: {
    type: "object",
    properties: {
      city: { type: "string", enum: ["Paris", "Tokyo", "Lima"] },
      days: { type: "integer", minimum: 1, maximum: 7 },
      unit: { type: "string", maxLength: 12 },
    },
    required: ["city", "days"],
  },
};

Deno.test("tool_choice forces a schema-valid tool call, streamed as input_json_delta", async () => {
  // The tools section alone is ~400 tokens of the tiny vocabulary; the prefix cache spares the
  // later requests most of that prefill.
  const head = await startTestHead({ ctx: 1024, snapshots: 2 });
  try {
    const req = ask("What is the weather in Paris?", {
      max_tokens: 120,
      tools: [weatherTool],
      tool_choice: { type: "tool", name: "get_weather" },
    });
    const body = await (await post(`${head.url}/v1/messages`, req)).json();
    assert.equal(body.stop_reason, "tool_use", JSON.stringify(body));
    const call = body.content.find((b: { type: string }) => b.type === "tool_use");
    assert.equal(call.name, "get_weather");
    assert.match(call.id, /^toolu_/);
    assert.ok(["Paris", "Tokyo", "Lima"].includes(call.input.city));
    assert.ok(Number.isInteger(call.input.days) && call.input.days >= 1 && call.input.days <= 7);
    const frames = parseSse(
      await (await post(`${head.url}/v1/messages`, { ...req, stream: true })).text(),
    );
    const start = frames.find((f) =>
      f.event === "content_block_start" && JSON.parse(f.data).content_block.type === "tool_use"
    );
    assert.ok(start);
    const index = JSON.parse(start.data).index;
    const json = frames
      .filter((f) => f.event === "content_block_delta" && JSON.parse(f.data).index === index)
      .map((f) => JSON.parse(f.data).delta)
      .map((d) => {
        assert.equal(d.type, "input_json_delta");
        return d.partial_json;
      })
      .join("");
    assert.deepEqual(JSON.parse(json), call.input);
    assert.equal(JSON.parse(frames.at(-2)!.data).delta.stop_reason, "tool_use");

    const followUp = {
      ...req,
      tool_choice: { type: "auto" },
      max_tokens: 8,
      messages: [
        ...req.messages,
        { role: "assistant", content: body.content },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: call.id, content: "18°C, clear" }],
        },
      ],
    };
    const answer = await post(`${head.url}/v1/messages`, followUp);
    assert.equal(answer.status, 200);
    const reply = await answer.json();
    assert.ok(["end_turn", "max_tokens", "tool_use"].includes(reply.stop_reason));
    assert.ok(reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 60);
  } finally {
    await head.close();
  }
});

Deno.test("a client that goes away mid-reply frees its slot", async () => {
  const head = await startTestHead({ slots: 1, queue: 0 });
  try {
    const abort = new AbortController();
    const res = await fetch(`${head.url}/v1/messages`, {
      method: "POST",
      body: JSON.stringify(ask("Hello", { max_tokens: 200, stream: true })),
      signal: abort.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    assert.equal(head.scheduler.busy, 1);
    abort.abort();
    await reader.cancel().catch(() => undefined);
    await waitFor(() => head.scheduler.busy === 0);
    assert.equal(head.scheduler.stats.sequences.cancelled, 1);

    // A buffered request's client going away cancels it too (through the request's signal).
    const before = head.scheduler.stats.outputTokens;
    const gone = new AbortController();
    const buffered = fetch(`${head.url}/v1/messages`, {
      method: "POST",
      body: JSON.stringify(ask("Hello", { max_tokens: 200 })),
      signal: gone.signal,
    });
    await waitFor(() => head.scheduler.stats.outputTokens > before + 3);
    gone.abort();
    await assert.rejects(buffered);
    await waitFor(() => head.scheduler.busy === 0);
    assert.equal(head.scheduler.stats.sequences.cancelled, 2);
    assert.ok(head.scheduler.stats.outputTokens < before + 200);

    const next = await post(`${head.url}/v1/messages`, ask("Hello", { max_tokens: 2 }));
    assert.equal(next.status, 200);
    assert.equal((await next.json()).usage.output_tokens, 2);
  } finally {
    await head.close();
  }
});

Deno.test("count_tokens answers while generation runs; a full queue is 529 / 429", async () => {
  const head = await startTestHead({ slots: 1, queue: 0 });
  try {
    const req = ask("Hello there");
    const expected = (await (await post(`${head.url}/v1/messages`, req)).json()).usage;
    const res = await post(
      `${head.url}/v1/messages`,
      ask("Hello", { max_tokens: 200, stream: true }),
    );
    const reader = res.body!.getReader();
    await reader.read();
    const t0 = performance.now();
    const count = await post(`${head.url}/v1/messages/count_tokens`, {
      model: "m",
      messages: req.messages,
    });
    assert.equal(count.status, 200);
    assert.deepEqual(await count.json(), {
      input_tokens: expected.input_tokens + expected.cache_read_input_tokens +
        expected.cache_creation_input_tokens,
    });
    assert.ok(performance.now() - t0 < 2000);
    assert.equal(head.scheduler.busy, 1, "count_tokens waited for the generation to end");
    const busy = await post(`${head.url}/v1/messages`, req);
    assert.equal(busy.status, 529);
    assert.equal(busy.headers.get("retry-after"), "1");
    assert.equal((await busy.json()).error.type, "overloaded_error");
    const openai = await post(`${head.url}/v1/chat/completions`, {
      model: "m",
      messages: req.messages,
    });
    assert.equal(openai.status, 429);
    assert.ok(openai.headers.get("retry-after"));
    assert.equal((await openai.json()).error.type, "rate_limit_exceeded");
    await reader.cancel();
  } finally {
    await head.close();
  }
});

Deno.test("/completion: seeded sampling replays, n_probs, stream equals buffered", async () => {
  const head = await startTestHead();
  try {
    const req = { prompt: "Once upon a time", n_predict: 10, temperature: 0.9, seed: 42 };
    const a = await (await post(`${head.url}/completion`, req)).json();
    const b = await (await post(`${head.url}/completion`, req)).json();
    assert.equal(a.content, b.content);
    assert.equal(a.generation_settings.seed, 42);
    assert.equal(a.tokens_predicted, 10);
    assert.equal(a.stop_type, "limit");
    const others = await Promise.all(
      [1, 2, 3].map(async (seed) =>
        (await (await post(`${head.url}/completion`, { ...req, seed })).json()).content
      ),
    );
    assert.ok(others.some((c) => c !== a.content), "three other seeds all replayed seed 42");
    // The access line of a sampled reply carries its seed.
    assert.ok(
      head.lines.some((l) => / POST \/completion 200 .* temperature=0\.9 seed=42$/.test(l)),
    );

    const probs = await (await post(`${head.url}/completion`, {
      prompt: "Once upon a time",
      n_predict: 3,
      temperature: 0,
      n_probs: 3,
    })).json();
    assert.equal(probs.completion_probabilities.length, 3);
    for (const p of probs.completion_probabilities) {
      assert.equal(p.top_logprobs.length, 3);
      assert.equal(p.top_logprobs[0].id, p.id, "greedy picks the top candidate");
      assert.ok(p.logprob <= 0 && p.top_logprobs[0].logprob >= p.top_logprobs[1].logprob);
    }
    const stream = await post(`${head.url}/completion`, { ...req, stream: true });
    const frames = parseSse(await stream.text()).map((f) => JSON.parse(f.data));
    assert.equal(frames.map((f) => f.content).join(""), a.content);
    assert.equal(frames.at(-1).stop, true);
    assert.ok(frames.slice(0, -1).every((f) => f.stop === false));
  } finally {
    await head.close();
  }
});

Deno.test("/completion: cache_prompt, return_tokens, and min_p 1 as greedy", async () => {
  const head = await startTestHead({ snapshots: 2 });
  try {
    const req = { prompt: "Once upon a time there was", n_predict: 4, temperature: 0 };
    const first = await (await post(`${head.url}/completion`, req)).json();
    assert.equal(first.tokens_cached, 0);
    assert.deepEqual(first.tokens, []);
    const again = await (await post(`${head.url}/completion`, { ...req, return_tokens: true }))
      .json();
    // All but the last prompt token came from the cache the first request wrote.
    assert.equal(again.tokens_cached, first.tokens_evaluated - 1);
    assert.equal(again.content, first.content);
    assert.equal(again.tokens.length, 4);
    const uncached = await (await post(`${head.url}/completion`, { ...req, cache_prompt: false }))
      .json();
    assert.equal(uncached.tokens_cached, 0);
    assert.equal(uncached.content, first.content);
    // min_p 1 keeps only the most likely candidate, whatever the temperature.
    const hot = await (await post(`${head.url}/completion`, {
      ...req,
      temperature: 5,
      min_p: 1,
      seed: 3,
    })).json();
    assert.equal(hot.content, first.content);
    assert.equal(hot.generation_settings.min_p, 1);
  } finally {
    await head.close();
  }
});

Deno.test("logit_bias and ignore_eos act on the full logits: bans, a far token forced, EOS", async () => {
  const head = await startTestHead();
  try {
    const url = `${head.url}/completion`;
    const req = { prompt: "Once upon a time", n_predict: 8, temperature: 0, return_tokens: true };
    const greedy = await (await post(url, req)).json();
    const first = greedy.tokens[0];
    const banned = await (await post(url, { ...req, logit_bias: [[first, false]] })).json();
    assert.notEqual(banned.tokens[0], first);
    assert.ok(!banned.tokens.includes(first), "a banned token never comes");
    // A token nowhere near the top of the logits wins every step once biased by +100.
    const far = (await (await post(`${head.url}/tokenize`, { content: " zebra" })).json())
      .tokens.at(-1);
    assert.ok(!greedy.tokens.includes(far));
    const forced = await (await post(url, { ...req, logit_bias: { [far]: 100 } })).json();
    assert.deepEqual(forced.tokens, new Array(8).fill(far));
    const chat = await (await post(`${head.url}/v1/chat/completions`, {
      model: "m",
      max_tokens: 3,
      temperature: 0.9,
      seed: 4,
      logit_bias: { [far]: 100 },
      messages: [{ role: "user", content: "Hi" }],
    })).json();
    assert.equal(
      chat.choices[0].message.content,
      (await (await post(`${head.url}/detokenize`, {
        tokens: [far, far, far],
      })).json()).content.trim(),
    );

    // <|im_end|> ends generation: boosted it comes first; with ignore_eos it never does.
    const [eos] = (await (await post(`${head.url}/tokenize`, { content: "<|im_end|>" })).json())
      .tokens;
    const ended = await (await post(url, { ...req, logit_bias: [[eos, 100]] })).json();
    assert.equal(ended.stop_type, "eos");
    assert.equal(ended.tokens_predicted, 1);
    const ignored = await (await post(url, { ...req, logit_bias: [[eos, 100]], ignore_eos: true }))
      .json();
    assert.equal(ignored.stop_type, "limit");
    assert.equal(ignored.tokens_predicted, 8);
    assert.equal(ignored.generation_settings.ignore_eos, true);

    const tooMany = await post(url, {
      ...req,
      logit_bias: Array.from({ length: 1025 }, (_, i) => [i, 1]),
    });
    assert.equal(tooMany.status, 400);
    assert.match((await tooMany.json()).error.message, /^logit_bias: 1025 entries were given/);
    const wide = await post(url, { ...req, repeat_penalty: 1.1, repeat_last_n: 5000 });
    assert.match((await wide.json()).error.message, /^repeat_last_n: a window of 5000 tokens/);
  } finally {
    await head.close();
  }
});
