// Log-probabilities end to end: /completion n_probs and OpenAI logprobs/top_logprobs are the model's
// log-softmax over the whole vocabulary (checked against the reference stage's logits), streamed too.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { backendTest, parseSse, post, startTestHead, tinyModel } from "./_head.ts";

const PROMPT = [3, 14, 15, 92, 65, 35];

/** log-softmax of the whole model's last-position logits for `ids`, from the reference stage. */
async function referenceLogprobs(ids: readonly number[]): Promise<Float64Array> {
  const model = await openGguf(await tinyModel());
  const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: 64 });
  try {
    const all = await stage.logits(0, { kind: "ids", ids: Uint32Array.from(ids) }, ids.length, 0);
    const row = all.subarray(all.length - all.length / ids.length);
    const max = Math.max(...row);
    const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0));
    return Float64Array.from(row, (x) => x - lse);
  } finally {
    stage.close();
    model.close();
  }
}

backendTest(
  "/completion n_probs are the model's log-softmax over the whole vocabulary",
  async (engine) => {
    const head = await startTestHead(engine);
    const want = await referenceLogprobs(PROMPT);
    // The GPU computes in f32; the reference in f64 rounded to f32.
    const tol = engine.engine?.backend === "gpu" ? 2e-3 : 1e-5;
    try {
      const body = await (await post(`${head.url}/completion`, {
        prompt: PROMPT,
        n_predict: 3,
        n_probs: 5,
        temperature: 0,
      })).json();
      const first = body.completion_probabilities[0];
      assert.equal(first.top_logprobs.length, 5);
      const ranked = [...want.keys()].sort((a, b) => want[b] - want[a]);
      assert.equal(first.id, ranked[0], "greedy takes the most likely token");
      first.top_logprobs.forEach((c: { id: number; logprob: number }, i: number) => {
        assert.ok(
          Math.abs(c.logprob - want[c.id]) <= tol,
          `#${i} id ${c.id}: ${c.logprob} vs ${want[c.id]}`,
        );
        if (i > 0) assert.ok(c.logprob <= first.top_logprobs[i - 1].logprob);
      });
      assert.deepEqual(first.top_logprobs.map((c: { id: number }) => c.id), ranked.slice(0, 5));
      assert.ok(Math.abs(first.logprob - want[first.id]) <= tol);
    } finally {
      await head.close();
    }
  },
);

Deno.test("OpenAI logprobs and top_logprobs: buffered equals streamed; refusals name the field", async () => {
  const head = await startTestHead();
  try {
    const body = {
      model: "m",
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
      messages: [{ role: "user", content: "Hello there" }],
    };
    const done = await (await post(`${head.url}/v1/chat/completions`, body)).json();
    const content = done.choices[0].logprobs.content;
    assert.equal(content.length, done.usage.completion_tokens);
    for (const entry of content) {
      assert.equal(entry.top_logprobs.length, 2);
      assert.deepEqual(entry.top_logprobs[0], {
        token: entry.token,
        logprob: entry.logprob,
        bytes: entry.bytes,
      });
      assert.ok(entry.logprob <= 0 && entry.top_logprobs[1].logprob <= entry.logprob);
      assert.ok(
        Math.exp(entry.top_logprobs[0].logprob) + Math.exp(entry.top_logprobs[1].logprob) <=
          1 + 1e-9,
      );
    }
    assert.equal(
      new TextDecoder().decode(
        Uint8Array.from(content.flatMap((e: { bytes: number[] }) => e.bytes)),
      ),
      done.choices[0].message.content,
    );
    const frames = parseSse(
      await (await post(`${head.url}/v1/chat/completions`, { ...body, stream: true })).text(),
    );
    const streamed = frames.slice(0, -1).flatMap((f) =>
      JSON.parse(f.data).choices[0]?.logprobs?.content ?? []
    );
    assert.deepEqual(streamed, content);

    const plain = await (await post(`${head.url}/v1/chat/completions`, {
      ...body,
      logprobs: false,
      top_logprobs: undefined,
    })).json();
    assert.equal(plain.choices[0].logprobs, null);
    const refused = await post(`${head.url}/v1/chat/completions`, { ...body, logprobs: false });
    assert.equal(refused.status, 400);
    assert.match((await refused.json()).error.message, /^top_logprobs: needs "logprobs": true/);
    const tooMany = await post(`${head.url}/v1/chat/completions`, { ...body, top_logprobs: 21 });
    assert.equal(tooMany.status, 400);
  } finally {
    await head.close();
  }
});

Deno.test("/v1/completions logprobs: tokens, log-probabilities, alternatives and offsets", async () => {
  const head = await startTestHead();
  try {
    const body = { model: "m", prompt: "Hello", max_tokens: 5, temperature: 0, logprobs: 2 };
    const done = await (await post(`${head.url}/v1/completions`, body)).json();
    const lp = done.choices[0].logprobs;
    assert.equal(lp.tokens.join(""), done.choices[0].text);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    lp.tokens.forEach((t: string, i: number) => {
      assert.equal(lp.text_offset[i], lp.tokens.slice(0, i).join("").length);
      const top = Object.entries(lp.top_logprobs[i]) as [string, number][];
      assert.ok(top.length >= 1 && top.length <= 2);
      // Greedy: the token is the best candidate.
      assert.deepEqual(top[0], [t, lp.token_logprobs[i]]);
    });
    const frames = parseSse(
      await (await post(`${head.url}/v1/completions`, { ...body, stream: true })).text(),
    );
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f.data).choices[0]?.logprobs).filter(
      Boolean,
    );
    assert.deepEqual(chunks.flatMap((c) => c.tokens), lp.tokens);
    assert.deepEqual(chunks.flatMap((c) => c.text_offset), lp.text_offset);
    const echo = await post(`${head.url}/v1/completions`, { ...body, echo: true });
    assert.equal(echo.status, 400);
    assert.match((await echo.json()).error.message, /^echo: cannot be combined with "logprobs"/);
  } finally {
    await head.close();
  }
});
