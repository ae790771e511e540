// Seeded fuzzing of request bodies on every POST route of a head: mutated fields, types and bytes
// get a 4xx naming the problem or a well-formed reply, never a 500, an unhandled error or a hang.
// CI sends a few hundred; `deno task fuzz` 10,000.

import assert from "node:assert/strict";
import { parseSse, post, startTestHead } from "./_head.ts";
import { fuzzRuns, fuzzSeed, Random } from "./_fuzz.ts";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

const TOOL = {
  name: "get_weather",
  description: "Weather for a city",
  input_schema: {
    type: "object",
    properties: { city: { type: "string" }, days: { type: "integer", minimum: 1, maximum: 3 } },
    required: ["city"],
  },
};

/** A valid body of each route, the seeds of every mutation. */
const SEEDS: readonly { path: string; body: Json }[] = [
  {
    path: "/v1/messages",
    body: {
      model: "m",
      max_tokens: 3,
      system: [{ type: "text", text: "Be brief." }],
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: [{ type: "text", text: "Hello" }] },
        { role: "user", content: [{ type: "text", text: "Weather?" }] },
      ],
      stop_sequences: ["\n\n"],
      temperature: 0.5,
      top_k: 5,
      stream: false,
    },
  },
  {
    path: "/v1/messages",
    body: {
      model: "m",
      max_tokens: 4,
      tools: [TOOL],
      messages: [
        { role: "user", content: "Weather in Oslo?" },
        {
          role: "assistant",
          content: [{
            type: "tool_use",
            id: "toolu_1",
            name: "get_weather",
            input: { city: "Oslo" },
          }],
        },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "Sunny" }],
        },
      ],
      stream: true,
    },
  },
  {
    path: "/v1/messages/count_tokens",
    body: { model: "m", messages: [{ role: "user", content: "Count me" }], tools: [TOOL] },
  },
  {
    path: "/v1/chat/completions",
    body: {
      model: "m",
      max_tokens: 3,
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
      temperature: 0,
      stop: ["x"],
      stream: false,
    },
  },
  { path: "/completion", body: { prompt: "Once upon", n_predict: 3, n_probs: 2, seed: 7 } },
];

const ODD_VALUES: readonly Json[] = [
  null,
  true,
  false,
  0,
  -1,
  1.5,
  1e308,
  -1e308,
  2 ** 53 + 2,
  "",
  "x",
  "<|im_start|>system\n<|im_end|>",
  "\ud800",
  "é漢😀",
  "x".repeat(5000),
  [],
  [null],
  {},
  { type: "text" },
  { type: "image", source: {} },
  [[[[[[[[[[]]]]]]]]]],
];

/** Every path to a value in `v`, the root included. */
function paths(v: Json, at: (string | number)[] = [], out: (string | number)[][] = []) {
  out.push(at);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...at, i], out));
  else if (v && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) paths(x, [...at, k], out);
  }
  return out;
}

/** `v` with the value at `path` replaced (or, for `undefined`, removed). */
function replaced(v: Json, path: readonly (string | number)[], value: Json | undefined): Json {
  if (path.length === 0) return value ?? null;
  const [head, ...rest] = path;
  if (Array.isArray(v)) {
    const copy = [...v];
    if (value === undefined && rest.length === 0) copy.splice(head as number, 1);
    else copy[head as number] = replaced(v[head as number], rest, value);
    return copy;
  }
  const copy = { ...(v as Record<string, Json>) };
  if (value === undefined && rest.length === 0) delete copy[head];
  else copy[head] = replaced(copy[head], rest, value);
  return copy;
}

/** One fuzzed request: a seed with 1..3 structural mutations, sometimes then byte-mutated. */
function fuzzedRequest(r: Random): { path: string; body: string } {
  const seed = r.pick(SEEDS);
  let body = seed.body;
  for (let m = 1 + r.int(3); m > 0; m--) {
    const at = r.pick(paths(body));
    const mode = r.int(4);
    if (mode === 0 && at.length > 0) body = replaced(body, at, undefined);
    else if (mode === 1 && body && typeof body === "object" && !Array.isArray(body)) {
      body = {
        ...body,
        [r.pick(["metadata", "top_p", "n", "unknown_field", "thinking"])]: r.pick(ODD_VALUES),
      };
    } else body = replaced(body, at, r.pick(ODD_VALUES));
  }
  let text = JSON.stringify(body);
  if (r.chance(0.15)) text = new TextDecoder().decode(r.mutate(new TextEncoder().encode(text)));
  return { path: seed.path, body: text };
}

/** The statuses a fuzzed request may get: success or the client's fault or the head's load. */
const ALLOWED = new Set([200, 400, 404, 413, 422, 429, 529]);

Deno.test("fuzzed bodies on every route get a 4xx or a well-formed reply, never a 500", async () => {
  const runs = fuzzRuns(300);
  const seed = fuzzSeed(0xb0d7);
  const r = new Random(seed);
  const head = await startTestHead({ ctx: 64, queue: 64 });
  const statuses = new Map<number, number>();
  try {
    const requests = Array.from({ length: runs }, () => fuzzedRequest(r));
    let next = 0;
    await Promise.all(Array.from({ length: 4 }, async () => {
      while (next < requests.length) {
        const i = next++;
        const { path, body } = requests[i];
        const what = `seed ${seed} request ${i}: POST ${path} ${body.slice(0, 400)}`;
        const res = await post(`${head.url}${path}`, body);
        const text = await res.text();
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        assert.ok(ALLOWED.has(res.status), `${what}\n→ ${res.status} ${text.slice(0, 400)}`);
        if (res.headers.get("content-type")?.startsWith("text/event-stream")) {
          const frames = parseSse(text);
          const last = frames.at(-1);
          const closed = last?.event === "message_stop" || last?.data === "[DONE]" ||
            last?.event === "error" || (last && JSON.parse(last.data).stop === true);
          assert.ok(closed, `${what}\n→ the stream ended without its closing frame`);
        } else {
          const json = JSON.parse(text);
          if (res.status !== 200) assert.ok(json.error, `${what}\n→ ${text.slice(0, 400)}`);
        }
      }
    }));
    const health = await fetch(`${head.url}/health`);
    assert.equal(health.status, 200);
    await health.body?.cancel();
    const unhandled = head.lines.filter((l) => /unhandled|failed:/.test(l));
    assert.deepEqual(unhandled, [], `seed ${seed}`);
    // The mix reached both refusals and replies.
    assert.ok((statuses.get(200) ?? 0) > 0 && (statuses.get(400) ?? 0) > 0, `${[...statuses]}`);
  } finally {
    await head.close();
  }
});
