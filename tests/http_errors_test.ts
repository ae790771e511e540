// Every way a request can be wrong gets the right 4xx in its API's error shape, naming the field;
// API keys, model listing, probes, /health and /metrics on an unsplit head, 503 while it loads.

import assert from "node:assert/strict";
import { DEFAULT_SLOTS } from "../engine/stage.ts";
import { freeLoopbackPort } from "../lib/launch/launch.ts";
import { startHead } from "../lib/server/head.ts";
import { post, startTestHead, type TestHead } from "./_head.ts";

const good = {
  model: "claude-sonnet-4-5",
  max_tokens: 3,
  temperature: 0,
  messages: [{ role: "user", content: "Hi" }],
};

async function expectError(
  res: Response,
  status: number,
  type: string,
  message: RegExp,
): Promise<void> {
  const body = await res.json();
  assert.equal(res.status, status, JSON.stringify(body));
  assert.equal(body.type, "error");
  assert.equal(body.error.type, type);
  assert.match(body.error.message, message);
  assert.match(body.request_id, /^req_/);
  assert.equal(res.headers.get("request-id"), body.request_id);
}

async function withHead(
  config: Parameters<typeof startTestHead>[0],
  f: (head: TestHead) => Promise<void>,
): Promise<void> {
  const head = await startTestHead(config);
  try {
    await f(head);
  } finally {
    await head.close();
  }
}

Deno.test("malformed JSON, wrong types and missing fields are 400 invalid_request_error naming the field", async () => {
  await withHead({ ctx: 64 }, async (head) => {
    const url = `${head.url}/v1/messages`;
    await expectError(
      await post(url, '{"model": "m", '),
      400,
      "invalid_request_error",
      /not valid JSON/,
    );
    await expectError(
      await post(url, "[1, 2]"),
      400,
      "invalid_request_error",
      /JSON object, got an array/,
    );
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ ...good, max_tokens: "12" }, /^max_tokens: expected an integer, got a string$/],
      [{ ...good, max_tokens: 0 }, /^max_tokens: expected an integer ≥ 1, got 0$/],
      [{ ...good, temperature: 3 }, /^temperature: expected a number ≤ 1, got 3$/],
      [{ ...good, stream: "yes" }, /^stream: expected a boolean, got a string$/],
      [
        { ...good, messages: [{ role: "user", content: 7 }] },
        /^messages\.0\.content: expected a string or an array/,
      ],
      [
        { ...good, messages: [{ role: "robot", content: "x" }] },
        /^messages\.0\.role: expected one of "user", "assistant", "system", got "robot"$/,
      ],
      [{ ...good, messages: [] }, /^messages: at least one message is required$/],
      [{ ...good, stop_sequences: [1] }, /^stop_sequences\.0: expected a string, got a number$/],
      [{ ...good, tools: [{ name: "t" }] }, /^tools\.0\.input_schema: Field required/],
      [
        { ...good, tool_choice: { type: "tool", name: "nope" } },
        /^tool_choice\.name: no tool named "nope"/,
      ],
      [{
        ...good,
        messages: [{
          role: "user",
          content: [{
            type: "image",
            source: { type: "base64", media_type: "image/png", data: "" },
          }],
        }],
      }, /^messages\.0\.content\.0\.type: content blocks of type "image" are not supported/],
    ];
    for (const [body, message] of cases) {
      await expectError(await post(url, body), 400, "invalid_request_error", message);
    }
    const { model: _, ...noModel } = good;
    await expectError(
      await post(url, noModel),
      400,
      "invalid_request_error",
      /^model: Field required/,
    );
    const { max_tokens: __, ...noMax } = good;
    await expectError(
      await post(url, noMax),
      400,
      "invalid_request_error",
      /^max_tokens: Field required/,
    );
    const long = { ...good, messages: [{ role: "user", content: "word ".repeat(80) }] };
    await expectError(
      await post(url, long),
      400,
      "invalid_request_error",
      /^prompt is too long: \d+ tokens > 64 maximum$/,
    );
    const noBody = await fetch(url, { method: "POST" });
    await expectError(noBody, 400, "invalid_request_error", /no body/);
  });
});

Deno.test("unknown and unsupported fields are 400s naming the field, in each API's shape", async () => {
  await withHead({}, async (head) => {
    await expectError(
      await post(`${head.url}/v1/messages`, { ...good, frobnicate: true }),
      400,
      "invalid_request_error",
      /^frobnicate: unknown field; this server does not know it/,
    );
    await expectError(
      await post(`${head.url}/v1/messages`, { ...good, container: "c1" }),
      400,
      "invalid_request_error",
      /^container: not supported by this server/,
    );
    // Metadata the API lets a server drop is accepted.
    const ok = await post(`${head.url}/v1/messages`, {
      ...good,
      metadata: { user_id: "u1" },
      service_tier: "auto",
      context_management: { edits: [] },
    });
    assert.equal(ok.status, 200, await ok.text());

    const chat = await post(`${head.url}/v1/chat/completions`, {
      ...good,
      audio: { voice: "alloy", format: "mp3" },
    });
    assert.equal(chat.status, 400);
    const error = (await chat.json()).error;
    assert.equal(error.param, "audio");
    assert.match(error.message, /^audio: not supported by this server: no audio output$/);

    const llama = await post(`${head.url}/completion`, { prompt: "Hi", mirostat: 2 });
    assert.equal(llama.status, 400);
    assert.match((await llama.json()).error.message, /^mirostat: not supported/);
    const neutral = await post(`${head.url}/completion`, {
      prompt: "Hi",
      n_predict: 2,
      mirostat: 0,
      typical_p: 1,
    });
    assert.equal(neutral.status, 200, await neutral.text());
  });
});

Deno.test("oversized bodies are 413 request_too_large, declared or streamed", async () => {
  await withHead({ maxBodyBytes: 2000 }, async (head) => {
    const big = JSON.stringify({
      ...good,
      messages: [{ role: "user", content: "x".repeat(3000) }],
    });
    await expectError(
      await post(`${head.url}/v1/messages`, big),
      413,
      "request_too_large",
      /limit is 2000 bytes/,
    );
    const chunks = ReadableStream.from(
      [big.slice(0, 1500), big.slice(1500)].map((s) => new TextEncoder().encode(s)),
    );
    const streamed = await fetch(`${head.url}/v1/messages`, { method: "POST", body: chunks });
    await expectError(streamed, 413, "request_too_large", /more than 2000/);
    assert.equal((await post(`${head.url}/v1/messages`, good)).status, 200);
  });
});

Deno.test("OpenAI and llama.cpp routes answer errors in their own shapes", async () => {
  await withHead({}, async (head) => {
    const chat = await post(`${head.url}/v1/chat/completions`, { model: "m", messages: "hi" });
    assert.equal(chat.status, 400);
    assert.deepEqual(await chat.json(), {
      error: {
        message: "messages: expected an array, got a string",
        type: "invalid_request_error",
        param: "messages",
        code: null,
      },
    });
    const n = await post(`${head.url}/v1/chat/completions`, {
      model: "m",
      n: 2,
      messages: [{ role: "user", content: "hi" }],
    });
    assert.equal(n.status, 400);
    assert.equal((await n.json()).error.param, "n");
    const completion = await post(`${head.url}/completion`, { n_predict: 2 });
    assert.equal(completion.status, 400);
    const body = await completion.json();
    assert.equal(body.error.code, 400);
    assert.match(body.error.message, /^prompt: Field required/);
    const notFound = await fetch(`${head.url}/v2/nothing`);
    await expectError(notFound, 404, "not_found_error", /Not found: GET \/v2\/nothing/);
    const wrongMethod = await fetch(`${head.url}/v1/messages`);
    await expectError(wrongMethod, 405, "invalid_request_error", /use POST/);
  });
});

Deno.test("with an API key every route but /health needs x-api-key or a Bearer token", async () => {
  await withHead({ apiKey: "s3cret-key" }, async (head) => {
    const url = `${head.url}/v1/messages`;
    await expectError(await post(url, good), 401, "authentication_error", /Missing API key/);
    await expectError(
      await post(url, good, { "x-api-key": "wrong" }),
      401,
      "authentication_error",
      /Invalid API key/,
    );
    assert.equal((await post(url, good, { "x-api-key": "s3cret-key" })).status, 200);
    assert.equal((await post(url, good, { authorization: "Bearer s3cret-key" })).status, 200);
    const models = await fetch(`${head.url}/v1/models`);
    assert.equal(models.status, 401);
    await models.body?.cancel();
    const openai = await post(`${head.url}/v1/chat/completions`, good);
    assert.equal(openai.status, 401);
    assert.equal((await openai.json()).error.type, "invalid_request_error");
    const health = await fetch(`${head.url}/health`);
    assert.equal(health.status, 200);
    assert.equal((await health.json()).status, "ok");
  });
});

Deno.test("any model name is served by the loaded model; /v1/models, probes, /metrics", async () => {
  await withHead({ modelId: "tiny-test" }, async (head) => {
    const reply = await (await post(`${head.url}/v1/messages`, good)).json();
    assert.equal(reply.model, "tiny-test");
    const models = await (await fetch(`${head.url}/v1/models`)).json();
    assert.deepEqual(models.data.map((m: { id: string }) => m.id), ["tiny-test"]);
    assert.equal(models.has_more, false);
    assert.equal(models.data[0].context_window, 256);
    const one = await (await fetch(`${head.url}/v1/models/claude-opus-4`)).json();
    assert.equal(one.id, "tiny-test");
    for (const path of ["/", "/api/hello"]) {
      const res = await fetch(`${head.url}${path}`, { method: "HEAD" });
      assert.equal(res.status, 200);
    }
    // Claude Code folds system turns into the conversation; they are accepted.
    const mid = await post(`${head.url}/v1/messages`, {
      ...good,
      system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=1" }, {
        type: "text",
        text: "Be kind.",
      }],
      messages: [
        { role: "user", content: "Hi" },
        { role: "system", content: "Reminder" },
        { role: "user", content: [{ type: "text", text: "Again" }] },
      ],
    });
    assert.equal(mid.status, 200);
    await mid.body?.cancel();
    await post(`${head.url}/v1/messages`, "{");
    const text = await (await fetch(`${head.url}/metrics`)).text();
    const value = (prefix: string) => {
      const line = text.split("\n").find((l) => l.startsWith(prefix));
      assert.ok(line, `no ${prefix} in\n${text}`);
      return Number(line.slice(prefix.length));
    };
    assert.equal(value('tandem_requests_total{route="/v1/messages",status="200"} '), 2);
    assert.equal(value('tandem_requests_total{route="/v1/messages",status="400"} '), 1);
    assert.equal(value("tandem_generated_tokens_total "), 6);
    assert.equal(value("tandem_time_to_first_token_seconds_count "), 2);
    assert.equal(value('tandem_stage_tokens_total{stage="0:4",phase="decode"} '), 4);
    assert.ok(value('tandem_stage_decode_ms_per_token{stage="0:4",where="local"} ') > 0);
    assert.equal(value("tandem_slots "), DEFAULT_SLOTS);
    assert.equal(value("tandem_queue_depth "), 0);
    assert.equal(value('tandem_stage_errors_total{stage="0:4"} '), 0);
  });
});

Deno.test("until the model has loaded every route is 503 with retry-after; a failed load frees the port", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tandem_loading_" });
  // A FIFO as the model: opening it waits for a writer, so the head stays bound and loading.
  const model = `${dir}/model.gguf`;
  assert.equal((await new Deno.Command("mkfifo", { args: [model] }).output()).code, 0);
  const port = freeLoopbackPort();
  const starting = startHead({ model, port, engine: { backend: "reference" }, log: () => {} });
  const failed = assert.rejects(starting, /Cannot read ".*" as GGUF/);
  try {
    const url = `http://127.0.0.1:${port}`;
    for (
      const res of await Promise.all([
        fetch(`${url}/health`),
        fetch(`${url}/v1/models`),
        post(`${url}/v1/messages`, good),
      ])
    ) {
      assert.equal(res.status, 503);
      assert.equal(res.headers.get("retry-after"), "5");
      const body = await res.json();
      assert.equal(body.error.type, "overloaded_error");
      assert.match(body.error.message, /still loading/);
    }
  } finally {
    // An empty write end: the head reads no GGUF header and stops.
    (await Deno.open(model, { write: true })).close();
    await failed;
    await Deno.remove(dir, { recursive: true });
  }
  Deno.listen({ hostname: "127.0.0.1", port }).close();
});
