// The routes beside the chat APIs, end to end on an unsplit head (tiny model, CPU reference):
// OpenAI /v1/completions (buffered, streamed, echo), llama.cpp /tokenize, /detokenize, /props, /slots.

import assert from "node:assert/strict";
import { DEFAULT_SLOTS } from "../engine/stage.ts";
import { defaultSnapshots } from "../lib/scheduler/prefix_cache.ts";
import { parseSse, post, startTestHead, type TestHead, waitFor } from "./_head.ts";

Deno.test("/v1/completions: text_completion, streamed equal to buffered, echo, default 16 tokens", async () => {
  const head = await startTestHead();
  try {
    const url = `${head.url}/v1/completions`;
    const req = { model: "m", prompt: "Once upon a time", temperature: 0 };
    const res = await post(url, req);
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.object, "text_completion");
    assert.match(body.id, /^cmpl-/);
    assert.equal(body.choices.length, 1);
    assert.equal(body.choices[0].finish_reason, "length");
    assert.equal(body.usage.completion_tokens, 16);
    assert.equal(
      body.usage.total_tokens,
      body.usage.prompt_tokens + body.usage.completion_tokens,
    );
    // The same completion as llama.cpp's /completion of the same prompt.
    const llama = await (await post(`${head.url}/completion`, {
      prompt: req.prompt,
      n_predict: 16,
      temperature: 0,
    })).json();
    assert.equal(body.choices[0].text, llama.content);

    const streamed = await post(url, {
      ...req,
      stream: true,
      stream_options: { include_usage: true },
    });
    assert.match(streamed.headers.get("content-type")!, /^text\/event-stream/);
    const frames = parseSse(await streamed.text()).map((f) => f.data);
    assert.equal(frames.at(-1), "[DONE]");
    const chunks = frames.slice(0, -1).map((d) => JSON.parse(d));
    const usage = chunks.at(-1);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 16);
    const texts = chunks.slice(0, -1);
    assert.equal(texts.map((c) => c.choices[0].text).join(""), body.choices[0].text);
    assert.equal(texts.at(-1).choices[0].finish_reason, "length");
    assert.ok(texts.every((c) => c.id === texts[0].id && c.object === "text_completion"));

    const echoed = await (await post(url, { ...req, echo: true, max_tokens: 3 })).json();
    assert.ok(echoed.choices[0].text.startsWith(req.prompt + body.choices[0].text.slice(0, 1)));
    const ids = await (await post(`${head.url}/tokenize`, { content: req.prompt })).json();
    const byIds = await (await post(url, { ...req, prompt: ids.tokens, max_tokens: 16 })).json();
    assert.equal(byIds.choices[0].text, body.choices[0].text);

    const two = await post(url, { ...req, prompt: ["a", "b"] });
    assert.equal(two.status, 400);
    const error = (await two.json()).error;
    assert.equal(error.param, "prompt");
    assert.match(error.message, /^prompt: 2 prompts were given/);
  } finally {
    await head.close();
  }
});

Deno.test("/tokenize and /detokenize round trip; pieces, special-token parsing", async () => {
  const head = await startTestHead();
  try {
    const text = "Hello there <|im_start|> world";
    const tokenize = async (body: Record<string, unknown>) =>
      (await (await post(`${head.url}/tokenize`, body)).json()).tokens;
    const ids: number[] = await tokenize({ content: text });
    assert.ok(ids.length > 3 && ids.every(Number.isInteger));
    const back = await (await post(`${head.url}/detokenize`, { tokens: ids })).json();
    assert.equal(back.content, text);
    const plain: number[] = await tokenize({ content: text, parse_special: false });
    assert.ok(plain.length > ids.length, "the control token's text becomes ordinary tokens");
    const pieces = await tokenize({ content: "Hello there", with_pieces: true });
    assert.equal(pieces.map((p: { piece: string }) => p.piece).join(""), "Hello there");
    assert.deepEqual(
      pieces.map((p: { id: number }) => p.id),
      await tokenize({ content: "Hello there" }),
    );
    // Qwen's tokenizer adds no BOS.
    assert.deepEqual(await tokenize({ content: text, add_special: true }), ids);

    const bad = await post(`${head.url}/detokenize`, { tokens: [1, -4] });
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).error.message, /^tokens\.1: expected an integer ≥ 0/);
  } finally {
    await head.close();
  }
});

Deno.test("/props shows the defaults and template; /slots shows a running sequence", async () => {
  const head = await startTestHead({ slots: 2, sampling: { temperature: 0.7, topK: 12 } });
  try {
    const props = await (await fetch(`${head.url}/props`)).json();
    assert.equal(props.total_slots, 2);
    assert.equal(props.default_generation_settings.n_ctx, 256);
    assert.equal(props.default_generation_settings.params.temperature, 0.7);
    assert.equal(props.default_generation_settings.params.top_k, 12);
    assert.match(props.chat_template, /im_start/);

    const idle = await (await fetch(`${head.url}/slots`)).json();
    assert.deepEqual(idle.map((s: { id: number }) => s.id), [0, 1]);
    assert.ok(idle.every((s: { is_processing: boolean }) => !s.is_processing));

    // A long streamed completion holds a slot while /slots looks at it.
    const res = await post(`${head.url}/completion`, {
      prompt: "Once upon a time",
      n_predict: 200,
      temperature: 0.5,
      seed: 9,
      stream: true,
    });
    const reader = res.body!.getReader();
    await reader.read();
    let busy: { is_processing: boolean; params: { seed: number; n_predict: number } }[] = [];
    await waitFor(async () => {
      busy = (await (await fetch(`${head.url}/slots`)).json()).filter(
        (s: { is_processing: boolean }) => s.is_processing,
      );
      return busy.length === 1;
    });
    assert.equal(busy[0].params.seed, 9);
    assert.equal(busy[0].params.n_predict, 200);
    const free = await fetch(`${head.url}/slots?fail_on_no_slot=1`);
    assert.equal(free.status, 200, "one slot is still free");
    await free.body?.cancel();
    await reader.cancel();
  } finally {
    await head.close();
  }
});

Deno.test("CORS with corsOrigins: preflight without a key, headers on JSON, SSE and errors", async () => {
  const head = await startTestHead({ corsOrigins: ["https://app.example"], apiKey: "k" });
  const plain = await startTestHead();
  try {
    const origin = { origin: "https://app.example" };
    const pre = await fetch(`${head.url}/v1/messages`, {
      method: "OPTIONS",
      headers: {
        ...origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, x-api-key, anthropic-version",
      },
    });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get("access-control-allow-origin"), "https://app.example");
    assert.equal(pre.headers.get("access-control-allow-methods"), "POST, OPTIONS");
    assert.equal(
      pre.headers.get("access-control-allow-headers"),
      "content-type, x-api-key, anthropic-version",
    );
    const req = { prompt: "Hi", n_predict: 2, temperature: 0 };
    const ok = await post(`${head.url}/completion`, req, { ...origin, "x-api-key": "k" });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("access-control-allow-origin"), "https://app.example");
    assert.match(ok.headers.get("access-control-expose-headers")!, /request-id/);
    await ok.body?.cancel();
    const sse = await post(`${head.url}/completion`, { ...req, stream: true }, {
      ...origin,
      "x-api-key": "k",
    });
    assert.equal(sse.headers.get("access-control-allow-origin"), "https://app.example");
    await sse.text();
    const denied = await post(`${head.url}/completion`, req, origin);
    assert.equal(denied.status, 401);
    assert.equal(denied.headers.get("access-control-allow-origin"), "https://app.example");
    await denied.body?.cancel();
    // Another origin gets no CORS header; a head without the option sends none and has no OPTIONS.
    const other = await fetch(`${head.url}/props`, {
      headers: { origin: "https://evil.example", "x-api-key": "k" },
    });
    assert.equal(other.headers.get("access-control-allow-origin"), null);
    await other.body?.cancel();
    const none = await fetch(`${plain.url}/v1/messages`, { method: "OPTIONS", headers: origin });
    assert.equal(none.status, 405);
    assert.equal(none.headers.get("access-control-allow-origin"), null);
    await none.body?.cancel();
  } finally {
    await head.close();
    await plain.close();
  }
});

Deno.test("defaults: an omitted temperature samples at 1; the prefix cache is on, sized from ctx", async () => {
  const head = await startTestHead();
  const capped = await startTestHead({ sampling: { temperature: 0.3, temperatureCap: 0.5 } });
  try {
    // The default slots, each with its share of places for the test head's 256 positions.
    const places = `slots ${DEFAULT_SLOTS}, ctx 256, prefix cache ${
      defaultSnapshots(256, DEFAULT_SLOTS)
    } places`;
    assert.ok(head.lines.some((l) => l.includes(places)), head.lines.join("\n"));
    const props = await (await fetch(`${head.url}/props`)).json();
    assert.equal(props.default_generation_settings.params.temperature, 1);
    const ask = (extra: Record<string, unknown>) => ({
      model: "m",
      max_tokens: 4,
      messages: [{ role: "user", content: "Hello" }],
      ...extra,
    });
    await (await post(`${head.url}/v1/messages`, ask({}))).json();
    // Each access line says how its reply was sampled.
    const replies = (h: TestHead) => h.lines.filter((l) => / 200 in=/.test(l));
    await waitFor(() => replies(head).length === 1);
    assert.match(replies(head)[0], / temperature=1 seed=\d+$/, "sampled at 1");
    // The operator's --temperature and --temperature-cap rule the omitted and the asked-for.
    await (await post(`${capped.url}/v1/chat/completions`, ask({}))).json();
    await (await post(`${capped.url}/v1/chat/completions`, ask({ temperature: 2 }))).json();
    await waitFor(() => replies(capped).length === 2);
    assert.match(replies(capped)[0], / temperature=0\.3 seed=\d+$/);
    assert.match(replies(capped)[1], / temperature=0\.5 seed=\d+$/);
    // Temperature 0 stays greedy: no seed.
    await (await post(`${head.url}/v1/messages`, ask({ temperature: 0 }))).json();
    await waitFor(() => replies(head).length === 2);
    assert.doesNotMatch(replies(head)[1], /seed=/);

    // Without --snapshots the second turn reads the first one's history from the cache.
    const first = ask({ temperature: 0, system: "Be brief." });
    const one = await (await post(`${head.url}/v1/messages`, first)).json();
    assert.ok(one.usage.cache_creation_input_tokens > 0);
    const two = await (await post(`${head.url}/v1/messages`, {
      ...first,
      messages: [
        ...first.messages,
        { role: "assistant", content: one.content },
        { role: "user", content: "More" },
      ],
    })).json();
    assert.ok(two.usage.cache_read_input_tokens > 0, JSON.stringify(two.usage));
  } finally {
    await head.close();
    await capped.close();
  }
});
