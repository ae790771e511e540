// The head's access log end to end: one line per request with route, status and, for
// generations, tokens in/cached/out, time to first token, duration and how the sequence ended.

import assert from "node:assert/strict";
import { post, startTestHead, waitFor } from "./_head.ts";

const ask = (extra: Record<string, unknown> = {}) => ({
  model: "anything",
  max_tokens: 6,
  temperature: 0,
  messages: [{ role: "user", content: "Hello there" }],
  ...extra,
});

const TIME = String.raw`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`;

Deno.test("access log: one line per request, with tokens, cache, ttft, duration and outcome", async () => {
  const head = await startTestHead({ snapshots: 4 });
  const access = () => head.lines.filter((l) => new RegExp(`^${TIME} `).test(l));
  try {
    const buffered = await (await post(`${head.url}/v1/messages`, ask())).json();
    const inTokens = buffered.usage.input_tokens + buffered.usage.cache_read_input_tokens +
      buffered.usage.cache_creation_input_tokens;
    await (await post(`${head.url}/v1/messages`, ask({ stream: true }))).text();
    await (await fetch(`${head.url}/health`)).text();
    await (await fetch(`${head.url}/nowhere`)).text();
    // A client that leaves mid-stream: its line says so once the cancel reached the sequence.
    const gone = await post(`${head.url}/v1/messages`, ask({ stream: true, max_tokens: 200 }));
    const reader = gone.body!.getReader();
    await reader.read();
    await reader.cancel();
    await waitFor(() => access().length === 5);
    const [first, second, health, missing, cancelled] = access();
    assert.match(
      first,
      new RegExp(
        `^${TIME} POST /v1/messages 200 in=${inTokens} cached=\\d+ out=6 ttft=\\d+ms \\d+ms max_tokens$`,
      ),
    );
    // The second run of the same prompt reads the first one's prefix from the cache.
    assert.match(second, /^\S+ POST \/v1\/messages 200 in=\d+ cached=[1-9]\d* out=6 ttft=\d+ms/);
    assert.match(health, new RegExp(`^${TIME} GET /health 200 \\d+ms$`));
    assert.match(missing, new RegExp(`^${TIME} GET /nowhere 404 \\d+ms$`));
    assert.match(cancelled, /^\S+ POST \/v1\/messages 200 in=\d+ cached=\d+ out=\d+ .* cancelled$/);
  } finally {
    await head.close();
  }
});
