// The split gates over HTTP with a worker process: byte-identical to unsplit, concurrent, and a
// worker that stays dead past the restart grace (partial tokens + clean error, head survives,
// serves again after a restart). tests/http_restart_test.ts has the worker coming back in time.

import assert from "node:assert/strict";
import {
  parseSse,
  post,
  startTestHead,
  streamedText,
  tinyModel,
  waitFor,
  withoutIds,
} from "./_head.ts";
import { freePort, startWorker, type WorkerProcess } from "./_workers.ts";

const ask = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "m",
  max_tokens: 14,
  temperature: 0,
  messages: [{ role: "user", content }],
  ...extra,
});

function worker(port: number, ctx: number, slots = 2): Promise<WorkerProcess> {
  return startWorker({
    model: modelPath,
    layers: "2:4",
    port,
    slots,
    ctx,
    snapshots: 4,
    extra: ["--backend", "reference"],
  });
}

const modelPath = await tinyModel();
/** The head's restart grace where a killed worker stays dead. */
const GRACE_MS = 400;

Deno.test("split /v1/messages bodies equal unsplit ones byte for byte; streams and concurrency agree", async () => {
  const w = await worker(freePort(), 1024);
  const split = await startTestHead({
    layers: { first: 0, end: 2 },
    next: w.address,
    slots: 2,
    ctx: 1024,
    snapshots: 4,
  });
  const whole = await startTestHead({ slots: 2, ctx: 1024, snapshots: 4 });
  try {
    const requests = [
      ask("Hello there"),
      ask("Name three colors", { system: "Be brief.", stop_sequences: ["e"] }),
      ask("What is the weather in Lima?", {
        max_tokens: 80,
        tools: [{
          name: "get_weather",
          input_schema: {
            type: "object",
            properties: { city: { type: "string", maxLength: 10 } },
            required: ["city"],
          },
        }],
        tool_choice: { type: "any" },
      }),
    ];
    for (const req of requests) {
      const a = await post(`${split.url}/v1/messages`, req);
      const b = await post(`${whole.url}/v1/messages`, req);
      assert.equal(a.status, 200);
      assert.equal(b.status, 200);
      const [textA, textB] = [await a.text(), await b.text()];
      assert.equal(withoutIds(textA), withoutIds(textB));
    }
    // The tool request was forced: its body must hold a tool_use in both.
    const tool = await (await post(`${split.url}/v1/messages`, requests[2])).json();
    assert.equal(tool.stop_reason, "tool_use");

    // Streamed through the split equals buffered.
    const buffered = await (await post(`${split.url}/v1/messages`, requests[0])).json();
    const frames = parseSse(
      await (await post(`${split.url}/v1/messages`, { ...requests[0], stream: true })).text(),
    );
    assert.equal(streamedText(frames), buffered.content[0].text);

    // Log-probabilities (the normaliser crosses the wire) and a grammar's mask (sent with each
    // step) give the same values split as unsplit.
    const probed = {
      prompt: "The answer is",
      n_predict: 8,
      n_probs: 4,
      temperature: 0,
      grammar: 'root ::= ("yes" | "no" | "maybe") " " [a-z]{1,4}\n',
    };
    const [a, b] = await Promise.all([split, whole].map(async (h) => {
      const body = await (await post(`${h.url}/completion`, probed)).json();
      return { content: body.content, probs: body.completion_probabilities };
    }));
    assert.deepEqual(a, b);
    assert.match(a.content, /^(yes|no|maybe) [a-z]{1,4}$/);
    const chat = {
      ...ask("Give JSON"),
      logprobs: true,
      top_logprobs: 3,
      response_format: { type: "json_object" },
    };
    const [x, y] = await Promise.all(
      [split, whole].map(async (h) =>
        (await (await post(`${h.url}/v1/chat/completions`, chat)).json()).choices
      ),
    );
    assert.deepEqual(x, y);
    assert.ok(x[0].logprobs.content.length > 0);

    // Penalties and logit_bias act on the last stage (the worker here): split equals unsplit.
    // A token far from the top, biased by +100, comes first; its frequency penalty then keeps it
    // out, which only a last stage that adjusts the full logits can do.
    const far = (await (await post(`${whole.url}/tokenize`, { content: " zebra" })).json())
      .tokens.at(-1);
    const plain = {
      prompt: "Once upon a time",
      n_predict: 12,
      temperature: 0,
      return_tokens: true,
    };
    const penalised = [
      { ...plain, logit_bias: [[far, 100]], frequency_penalty: 150 },
      { ...plain, temperature: 0.8, seed: 5, repeat_penalty: 1.3, logit_bias: [["the", -2]] },
    ];
    for (const req of penalised) {
      const a = await (await post(`${split.url}/completion`, req)).json();
      const b = await (await post(`${whole.url}/completion`, req)).json();
      assert.deepEqual(a.tokens, b.tokens, JSON.stringify(req));
    }
    const once = (await (await post(`${split.url}/completion`, penalised[0])).json()).tokens;
    assert.equal(once[0], far);
    assert.ok(!once.slice(1).includes(far), `${once}`);
    const penalisedChat = {
      model: "m",
      max_tokens: 12,
      temperature: 0,
      frequency_penalty: 1.5,
      messages: [{ role: "user", content: "Count to ten" }],
    };
    const chatA = await (await post(`${split.url}/v1/chat/completions`, penalisedChat)).json();
    const chatB = await (await post(`${whole.url}/v1/chat/completions`, penalisedChat)).json();
    assert.equal(chatA.choices[0].message.content, chatB.choices[0].message.content);

    // Two concurrent sequences with different prompts each equal their solo reference.
    const prompts = [
      ask("Count to ten", { max_tokens: 24 }),
      ask("Spell ocean", { max_tokens: 24 }),
    ];
    const solo = [];
    for (const p of prompts) {
      solo.push((await (await post(`${whole.url}/v1/messages`, p)).json()).content);
    }
    const both = await Promise.all(prompts.map(async (p) => {
      const res = await post(`${split.url}/v1/messages`, { ...p, stream: true });
      return streamedText(parseSse(await res.text()));
    }));
    assert.deepEqual(both, solo.map((c) => c[0].text));
    const health = await (await fetch(`${split.url}/health`)).json();
    assert.equal(health.status, "ok");
    assert.deepEqual(health.stages.map((s: { layers: string }) => s.layers), ["0:2", "2:4"]);
    assert.equal(health.stages[1].where, w.address);
    assert.ok(health.stages[1].last_rtt_ms > 0);
    assert.ok(health.stages[1].decode_ms_per_token > 0);
  } finally {
    await split.close();
    await whole.close();
    await w.stop();
  }
});

Deno.test("a worker dead past the grace: partial tokens, then an error event; the head recovers", async () => {
  const port = freePort();
  let w = await worker(port, 2048, 1);
  const head = await startTestHead({
    layers: { first: 0, end: 2 },
    next: w.address,
    slots: 1,
    ctx: 2048,
    snapshots: 4,
    restartGraceMs: GRACE_MS,
  });
  try {
    // A turn whose history gets cached on both stages before the kill.
    const turn = ask("Hello there", { max_tokens: 4 });
    assert.equal((await post(`${head.url}/v1/messages`, turn)).status, 200);

    const res = await post(
      `${head.url}/v1/messages`,
      ask("Tell a story", {
        max_tokens: 1500,
        stream: true,
      }),
    );
    assert.equal(res.status, 200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while ((text.match(/text_delta/g) ?? []).length < 3) text += (await reader.read()).value;
    w.child.kill("SIGKILL");
    const killedAt = performance.now();
    let errorAt = 0;
    while (true) {
      const { done, value } = await reader.read();
      if (done) break;
      text += value;
      if (!errorAt && text.includes("event: error")) errorAt = performance.now();
    }
    await w.stop();
    assert.ok(errorAt > 0, "no error event");
    // The stream waits out the grace for the worker, then ends.
    const waited = errorAt - killedAt;
    assert.ok(waited >= GRACE_MS && waited < GRACE_MS + 1000, `error after ${waited} ms`);
    const frames = parseSse(text);
    assert.ok(streamedText(frames).length > 0, "the tokens before the kill were sent");
    const error = frames.at(-1)!;
    assert.equal(error.event, "error");
    const body = JSON.parse(error.data);
    assert.equal(body.type, "error");
    assert.equal(body.error.type, "overloaded_error");
    assert.match(body.error.message, /did not answer again within 0.4 s \(--restart-grace-s\): /);
    assert.ok(!frames.some((f) => f.event === "message_stop"));

    // Down: health says so and requests fail fast with 503 instead of hanging.
    const health = await fetch(`${head.url}/health`);
    assert.equal(health.status, 503);
    assert.equal((await health.json()).stages[1].up, false);
    // The head alone is alive (a liveness probe must not restart it for its worker's outage).
    const alone = await fetch(`${head.url}/health?scope=head`);
    assert.equal(alone.status, 200);
    assert.equal((await alone.json()).scope, "head");
    const unknown = await fetch(`${head.url}/health?scope=chain`);
    assert.equal(unknown.status, 400);
    assert.match((await unknown.json()).error.message, /Cannot use scope "chain" on \/health/);
    const t0 = performance.now();
    const refused = await post(`${head.url}/v1/messages`, turn);
    assert.equal(refused.status, 503);
    assert.equal((await refused.json()).error.type, "overloaded_error");
    assert.ok(performance.now() - t0 < 1000);

    // Back: the next request succeeds; the cached history was on the dead worker, so nothing
    // is restored from it.
    w = await worker(port, 2048, 1);
    const again = await post(`${head.url}/v1/messages`, turn);
    assert.equal(again.status, 200);
    assert.equal((await again.json()).usage.cache_read_input_tokens, 0);

    // A buffered request cut by a dying worker is a 5xx JSON error.
    const pending = post(`${head.url}/v1/messages`, ask("Another story", { max_tokens: 1500 }));
    await waitFor(() => head.scheduler.stats.stages[1].decodeTokens > 0 && head.scheduler.busy > 0);
    w.child.kill("SIGKILL");
    const cut = await pending;
    assert.equal(cut.status, 503);
    assert.equal((await cut.json()).error.type, "overloaded_error");
    await w.stop();
    w = await worker(port, 2048, 1);

    // OpenAI streams cut the same way (chat and legacy completions) end with an error chunk,
    // then the closing [DONE] of every OpenAI stream. Their end-of-generation tokens are banned,
    // so only the kill can end them: a sampled end that came before the kill took effect (the
    // head generating on while the test read its first frames) once ended a stream cleanly.
    const eog = (await (await post(`${head.url}/tokenize`, {
      content: "<|im_end|><|endoftext|>",
    })).json()).tokens as number[];
    const endless = Object.fromEntries(eog.map((id) => [id, -100]));
    const openaiStreams: [string, Record<string, unknown>][] = [
      ["/v1/chat/completions", { messages: [{ role: "user", content: "Go on" }] }],
      ["/v1/completions", { prompt: "Go on" }],
    ];
    for (const [path, body] of openaiStreams) {
      const cut = await post(`${head.url}${path}`, {
        model: "m",
        max_tokens: 1500,
        stream: true,
        logit_bias: endless,
        ...body,
      });
      assert.equal(cut.status, 200);
      const chunks = cut.body!.pipeThrough(new TextDecoderStream()).getReader();
      let sse = "";
      while (parseSse(sse).length < 4) sse += (await chunks.read()).value;
      w.child.kill("SIGKILL");
      for (let r = await chunks.read(); !r.done; r = await chunks.read()) sse += r.value;
      const frames = parseSse(sse);
      assert.equal(frames.at(-1)!.data, "[DONE]", `${path}: ${sse.slice(-400)}`);
      const error = JSON.parse(frames.at(-2)!.data);
      assert.equal(error.error.type, "server_error", path);
      assert.match(error.error.message, /--restart-grace-s/);
      assert.equal(frames.filter((f) => f.data === "[DONE]").length, 1, path);
      await w.stop();
      w = await worker(port, 2048, 1);
    }
    assert.equal((await post(`${head.url}/v1/messages`, turn)).status, 200);
    assert.equal((await fetch(`${head.url}/health`)).status, 200);
    // A stage going down is expected: the head logs it in lines, never with a stack trace.
    assert.deepEqual(head.lines.filter((l) => /\n\s+at /.test(l)), [], "stack traces logged");
    assert.ok(head.lines.some((l) => /is down: /.test(l)));
  } finally {
    await head.close();
    await w.stop();
  }
});

Deno.test("a worker with fewer snapshot places is refused at connect, naming both counts", async () => {
  const w = await startWorker({
    model: modelPath,
    layers: "2:4",
    slots: 1,
    ctx: 256,
    snapshots: 0,
    extra: ["--backend", "reference"],
  });
  const head = await startTestHead({
    layers: { first: 0, end: 2 },
    next: w.address,
    slots: 1,
    ctx: 256,
    snapshots: 4,
  });
  const misfit = /it has 0 snapshot places, this stage uses 4; start it with --snapshots 4 or more/;
  try {
    for (let i = 0; i < 2; i++) {
      const res = await post(`${head.url}/v1/messages`, ask("Hello there"));
      assert.equal(res.status, 503);
      assert.match((await res.json()).error.message, misfit);
    }
    const health = await fetch(`${head.url}/health`);
    assert.equal(health.status, 503);
    const body = await health.json();
    assert.equal(body.stages[1].up, false);
    assert.match(body.stages[1].error, misfit);
    // Refused at the hello: the worker never ran a frame for this head.
    assert.equal(head.scheduler.stats.stages[1].decodeTokens, 0);
  } finally {
    await head.close();
    await w.stop();
  }
});
