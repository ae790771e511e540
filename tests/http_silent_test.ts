// A worker that stops answering without closing its socket (SIGSTOP: a laptop asleep, a hung
// process; a proxy that stops forwarding: a cut network): the head sees it within 3 s at any point
// of a step, resumes every stream byte for byte when it answers again within --restart-grace-s,
// and past it ends each request with its API's typed error. Two- and three-stage chains.

import assert from "node:assert/strict";
import {
  comparableSse,
  metric,
  parseSse,
  post,
  readAround,
  startTestHead,
  streamedText,
  type TestHead,
  tinyModel,
  waitFor,
} from "./_head.ts";
import { StageProxy } from "./_proxy.ts";
import { freePort, startWorker, type WorkerProcess } from "./_workers.ts";

const modelPath = await tinyModel();
const CTX = 1024;
/** The bound; the default silence limit (2 s) and the watch's tick (0.25 s) fit in it. */
const NOTICE_MS = 3000;

function worker(
  port: number,
  options: { layers?: string; slots?: number; next?: string } = {},
): Promise<WorkerProcess> {
  return startWorker({
    model: modelPath,
    layers: options.layers ?? "2:4",
    port,
    slots: options.slots ?? SLOTS,
    ctx: CTX,
    snapshots: 4,
    next: options.next,
  });
}

function splitHead(
  address: string,
  options: { end?: number; restartGraceMs?: number } = {},
): Promise<TestHead> {
  return startTestHead({
    layers: { first: 0, end: options.end ?? 2 },
    next: address,
    slots: SLOTS,
    ctx: CTX,
    snapshots: 4,
    restartGraceMs: options.restartGraceMs,
  });
}

/** The kinds of request the issue saw hang: streams of three APIs and a buffered one. */
const REQUESTS: readonly { readonly path: string; readonly body: Record<string, unknown> }[] = [
  {
    path: "/v1/messages",
    body: {
      model: "m",
      max_tokens: 40,
      temperature: 0,
      stream: true,
      messages: [{ role: "user", content: "Tell a long story" }],
    },
  },
  {
    path: "/v1/chat/completions",
    body: {
      model: "m",
      max_tokens: 40,
      temperature: 0.9,
      seed: 7,
      stream: true,
      messages: [{ role: "user", content: "Write a poem" }],
    },
  },
  {
    path: "/completion",
    body: {
      prompt: "Once upon a time",
      n_predict: 40,
      ignore_eos: true,
      temperature: 0,
      seed: 3,
      stream: true,
    },
  },
  {
    path: "/v1/chat/completions",
    body: {
      model: "m",
      max_tokens: 40,
      temperature: 0,
      messages: [{ role: "user", content: "Count to twenty" }],
    },
  },
];
const SLOTS = REQUESTS.length;

let wanted: Promise<string[]> | undefined;

/** Each request's body from the unsplit model, which a split chain's must equal. */
function references(): Promise<string[]> {
  wanted ??= (async () => {
    const whole = await startTestHead({ slots: SLOTS, ctx: CTX, snapshots: 4 });
    try {
      const out = [];
      for (const r of REQUESTS) {
        out.push(await (await post(`${whole.url}${r.path}`, r.body)).text());
      }
      return out;
    } finally {
      await whole.close();
    }
  })();
  return wanted;
}

/** A body, streamed or not, without what may differ between two equal replies. */
function comparable(body: string): string {
  const sse = body.startsWith("{")
    ? `data: ${JSON.stringify({ ...JSON.parse(body), id: 0, created: 0 })}\n\n`
    : body;
  return comparableSse(sse);
}

/** What the head logged but the /metrics polls: for the messages of failed assertions. */
function logOf(head: TestHead): string {
  return head.lines.filter((l) => !l.includes(" GET /metrics ")).join("\n");
}

async function stageUp(head: TestHead): Promise<number> {
  return metric(await (await fetch(`${head.url}/metrics`)).text(), "tandem_stage_up");
}

interface Reply {
  readonly status: number;
  readonly body: string;
}

/**
 * Sends every request to `head`, waits for 3 tokens of the first stream, then `cut`s the stage
 * and returns once the head has noticed, with when the cut was (performance.now()), how long
 * noticing took (ms) and the replies to come.
 */
async function cutMidStream(
  head: TestHead,
  cut: () => void,
): Promise<{ cutAt: number; noticedMs: number; replies: Promise<Reply[]> }> {
  const [first, ...rest] = REQUESTS.map((r) => post(`${head.url}${r.path}`, r.body));
  const noticed = Promise.withResolvers<{ cutAt: number; noticedMs: number }>();
  const firstReply = first.then(async (res) => ({
    status: res.status,
    body: await readAround(res, /text_delta/g, 3, async () => {
      cut();
      const cutAt = performance.now();
      await waitFor(async () => await stageUp(head) === 0, NOTICE_MS + 2000);
      noticed.resolve({ cutAt, noticedMs: performance.now() - cutAt });
    }),
  }));
  firstReply.catch(noticed.reject);
  const replies = Promise.all([
    firstReply,
    ...rest.map(async (r) => ({ status: (await r).status, body: await (await r).text() })),
  ]);
  return { ...await noticed.promise, replies };
}

/**
 * Cuts the stage behind `head` mid-stream, checks that the head noticed within 3 s and that
 * /health says why (`reason`), then undoes the cut: every reply must equal the unsplit model's,
 * and the next request is served.
 */
async function assertRidesOut(
  head: TestHead,
  cut: () => void,
  undo: () => void,
  reason: RegExp,
): Promise<void> {
  const want = await references();
  const done = await cutMidStream(head, cut);
  assert.ok(done.noticedMs < NOTICE_MS, `noticed after ${done.noticedMs} ms:\n${logOf(head)}`);
  const health = await fetch(`${head.url}/health`);
  assert.equal(health.status, 503);
  const stage = (await health.json()).stages[1];
  assert.equal(stage.up, false);
  assert.match(stage.error, reason);
  undo();
  const replies = await done.replies;
  assert.deepEqual(replies.map((r) => r.status), REQUESTS.map(() => 200));
  assert.deepEqual(replies.map((r) => comparable(r.body)), want.map(comparable));
  const metrics = await (await fetch(`${head.url}/metrics`)).text();
  assert.ok(metric(metrics, "tandem_sequence_resumes_total") >= SLOTS, "not every one resumed");
  assert.equal(metric(metrics, 'tandem_sequences_total{outcome="failed"}'), 0);
  // The next request is served (its prompt now comes from the prefix cache).
  const again = await post(`${head.url}${REQUESTS[0].path}`, REQUESTS[0].body);
  assert.equal(streamedText(parseSse(await again.text())), streamedText(parseSse(want[0])));
}

/** How the head words a silent next stage, with the default limit. */
const SILENT = /it sent nothing for \d+\.\d s \(--silence-s 2\)/;

Deno.test("a worker stopped mid-stream is seen within 3 s; back within the grace, all resume", async () => {
  const w = await worker(freePort());
  const head = await splitHead(w.address);
  try {
    await assertRidesOut(
      head,
      () => w.child.kill("SIGSTOP"),
      () => w.child.kill("SIGCONT"),
      SILENT,
    );
  } finally {
    w.child.kill("SIGCONT");
    await head.close();
    await w.stop();
  }
});

Deno.test("a network cut mid-stream (nothing forwarded, nothing closed) is ridden out the same way", async () => {
  const w = await worker(freePort());
  const proxy = StageProxy.start(w.address);
  const head = await splitHead(proxy.address);
  try {
    await assertRidesOut(head, () => proxy.partition(), () => proxy.heal(), SILENT);
  } finally {
    proxy.heal();
    await head.close();
    await proxy.close();
    await w.stop();
  }
});

Deno.test("three stages: the last one stopped, then cut off, mid-stream; the middle one tells the head", async () => {
  const tail = await worker(freePort(), { layers: "3:4" });
  const proxy = StageProxy.start(tail.address);
  const middle = await worker(freePort(), { layers: "1:3", next: proxy.address });
  // The middle stage's refusal names the silent hop behind it.
  const behind = new RegExp(`Cannot use the stage at ${proxy.address}: (it sent nothing|no hello)`);
  // A head for each cut, so that both start with an empty prefix cache as the references do.
  let head = await splitHead(middle.address, { end: 1 });
  try {
    await assertRidesOut(
      head,
      () => tail.child.kill("SIGSTOP"),
      () => tail.child.kill("SIGCONT"),
      behind,
    );
    await head.close();
    head = await splitHead(middle.address, { end: 1 });
    await assertRidesOut(head, () => proxy.partition(), () => proxy.heal(), behind);
  } finally {
    tail.child.kill("SIGCONT");
    proxy.heal();
    await head.close();
    await middle.stop();
    await proxy.close();
    await tail.stop();
  }
});

Deno.test("a worker stopped past the grace: each request ends with its API's error, the next is served", async () => {
  const port = freePort();
  const w = await worker(port);
  const graceMs = 1000;
  const head = await splitHead(w.address, { restartGraceMs: graceMs });
  try {
    const story = REQUESTS[0];
    const want = await (await post(`${head.url}${story.path}`, story.body)).text();
    const cut = await cutMidStream(head, () => w.child.kill("SIGSTOP"));
    const [anthropic, openai, llama, buffered] = await cut.replies;
    // Noticed (within 3 s), then the grace: not the minutes they used to hang. The slack is for
    // a loaded box, where this side's own stalls restart the silence clock.
    const endedMs = performance.now() - cut.cutAt;
    assert.ok(
      endedMs < NOTICE_MS + graceMs + 3000,
      `the requests ended after ${endedMs} ms:\n${logOf(head)}`,
    );

    const frames = parseSse(anthropic.body);
    assert.ok(streamedText(frames).length > 0, "the tokens before the stop were sent");
    assert.equal(frames.at(-1)!.event, "error");
    const error = JSON.parse(frames.at(-1)!.data).error;
    assert.equal(error.type, "overloaded_error");
    assert.match(error.message, /it sent nothing for .* did not answer again within 1 s/);
    const chunks = parseSse(openai.body);
    assert.equal(chunks.at(-1)!.data, "[DONE]");
    assert.equal(JSON.parse(chunks.at(-2)!.data).error.type, "server_error");
    assert.equal(JSON.parse(parseSse(llama.body).at(-1)!.data).error.type, "unavailable_error");
    assert.equal(buffered.status, 503);
    assert.match(JSON.parse(buffered.body).error.message, /--restart-grace-s/);

    // Back: the very next request is served, and /health says so.
    w.child.kill("SIGCONT");
    const again = await post(`${head.url}${story.path}`, story.body);
    assert.equal(again.status, 200, `${await again.clone().text()}\n${logOf(head)}`);
    assert.equal(streamedText(parseSse(await again.text())), streamedText(parseSse(want)));
    assert.equal((await fetch(`${head.url}/health`)).status, 200);
  } finally {
    w.child.kill("SIGCONT");
    await head.close();
    await w.stop();
  }
});

Deno.test("a worker stopped mid-prefill is seen and the prompt replayed; a step past the limit is not cut", async () => {
  // The worker holds 3 of the 4 layers, so its prefill of the long prompt outlasts the head's
  // 1.5 s silence limit by far: only its ALIVE frames keep the head waiting for it.
  const silenceMs = 1500;
  const w = await worker(freePort(), { layers: "1:4", slots: 1 });
  const config = { slots: 1, ctx: CTX, snapshots: 0 };
  const head = await startTestHead({
    ...config,
    layers: { first: 0, end: 1 },
    next: w.address,
    silenceMs,
  });
  const whole = await startTestHead(config);
  const prompt = Array.from({ length: 1000 }, (_, i) => 10 + (i * 37) % 240);
  const request = { prompt, n_predict: 6, ignore_eos: true, temperature: 0, seed: 1 };
  const content = async (res: Response) => {
    assert.equal(res.status, 200);
    const body = await res.json();
    return { content: body.content, tokens: body.tokens_predicted };
  };
  try {
    const want = await content(await post(`${whole.url}/completion`, request));
    const reply = post(`${head.url}/completion`, request);
    const [local, remote] = head.scheduler.stats.stages;
    // The head's own layers are done and the prompt's rows are on the worker: stop it there.
    await waitFor(() => local.prefillTokens >= prompt.length, 20_000);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(remote.prefillTokens, 0, "the worker finished its prefill before the stop");
    w.child.kill("SIGSTOP");
    const t0 = performance.now();
    await waitFor(async () => await stageUp(head) === 0, NOTICE_MS + 2000);
    const noticed = performance.now() - t0;
    assert.ok(noticed < NOTICE_MS, `noticed after ${noticed} ms`);
    w.child.kill("SIGCONT");
    assert.deepEqual(await content(await reply), want);
    assert.equal(head.scheduler.stats.resumes, 1);
    // The replayed prefill ran whole, however long it took.
    assert.ok(
      remote.prefillMs > silenceMs,
      `the worker's prefill took ${remote.prefillMs} ms, no longer than the ${silenceMs} ms limit`,
    );
  } finally {
    w.child.kill("SIGCONT");
    await head.close();
    await whole.close();
    await w.stop();
  }
});
