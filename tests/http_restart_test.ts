// A worker restarted under a live head: streams resume byte-identical to an uninterrupted run, a
// quick restart is invisible to the next request, /metrics and /health see an idle death in 2 s.

import assert from "node:assert/strict";
import {
  comparableSse,
  metric,
  post,
  readAround,
  startTestHead,
  type TestHead,
  tinyModel,
  waitFor,
} from "./_head.ts";
import { freePort, startWorker, type WorkerProcess } from "./_workers.ts";

const modelPath = await tinyModel();
const CTX = 512;

function worker(port: number): Promise<WorkerProcess> {
  return startWorker({ model: modelPath, layers: "2:4", port, slots: 2, ctx: CTX, snapshots: 4 });
}

function splitHead(address: string): Promise<TestHead> {
  return startTestHead({
    layers: { first: 0, end: 2 },
    next: address,
    slots: 2,
    ctx: CTX,
    snapshots: 4,
  });
}

const story = {
  model: "m",
  max_tokens: 40,
  temperature: 0,
  stream: true,
  messages: [{ role: "user", content: "Tell a long story" }],
};
/** Sampled: the resumed stream must draw the same random numbers as an uninterrupted one. */
const sampled = {
  model: "m",
  max_tokens: 40,
  temperature: 0.9,
  seed: 7,
  stream: true,
  messages: [{ role: "user", content: "Write a poem" }],
};

Deno.test("a worker killed mid-stream and restarted: both streams resume byte for byte", async () => {
  const port = freePort();
  let w = await worker(port);
  const head = await splitHead(w.address);
  const whole = await startTestHead({ slots: 2, ctx: CTX, snapshots: 4 });
  try {
    const turn = {
      ...story,
      stream: false,
      max_tokens: 4,
      messages: [{ role: "user", content: "Hello there" }],
    };
    // The references are the unsplit head's: an uninterrupted split run gives the same bytes
    // (tests/http_split_test.ts), so the resumed streams must equal both.
    const wantTurn = await (await post(`${whole.url}/v1/messages`, turn)).json();
    const wantStory = await (await post(`${whole.url}/v1/messages`, story)).text();
    const wantPoem = await (await post(`${whole.url}/v1/chat/completions`, sampled)).text();
    // Long enough to be cut: neither ends before max_tokens.
    assert.match(wantStory, /"stop_reason":"max_tokens"/);
    assert.match(wantPoem, /"finish_reason":"length"/);

    // A cached history on both stages, lost with the worker.
    const first = await (await post(`${head.url}/v1/messages`, turn)).json();
    assert.deepEqual(first.content, wantTurn.content);
    assert.equal((await (await fetch(`${head.url}/health`)).json()).cached_prefixes, 1);

    const poem = post(`${head.url}/v1/chat/completions`, sampled).then((res) => res.text());
    const storyRes = await post(`${head.url}/v1/messages`, story);
    assert.equal(storyRes.status, 200);
    const gotStory = await readAround(storyRes, /text_delta/g, 3, async () => {
      w.child.kill("SIGKILL");
      await w.stop();
      w = await worker(port);
    });
    assert.equal(comparableSse(gotStory), comparableSse(wantStory));
    assert.equal(comparableSse(await poem), comparableSse(wantPoem));
    const metrics = await (await fetch(`${head.url}/metrics`)).text();
    assert.ok(metric(metrics, "tandem_sequence_resumes_total") >= 1, "nothing was resumed");
    assert.equal(metric(metrics, 'tandem_sequences_total{outcome="failed"}'), 0);

    // The restarted worker has none of the old snapshots, and the head forgot them: the turn
    // is computed afresh (and equals the reference) instead of restoring a lost snapshot.
    const again = await (await post(`${head.url}/v1/messages`, turn)).json();
    assert.equal(again.usage.cache_read_input_tokens, 0);
    assert.deepEqual(again.content, wantTurn.content);
  } finally {
    await head.close();
    await whole.close();
    await w.stop();
  }
});

Deno.test("a worker restarted right after answering is invisible; an idle death shows within 2 s", async () => {
  const port = freePort();
  let w = await worker(port);
  const head = await splitHead(w.address);
  const turn = { ...story, stream: false, max_tokens: 6 };
  const stageUp = async () =>
    metric(await (await fetch(`${head.url}/metrics`)).text(), "tandem_stage_up");
  try {
    const want = await (await post(`${head.url}/v1/messages`, turn)).text();
    for (let i = 0; i < 3; i++) {
      w.child.kill("SIGKILL");
      await w.stop();
      w = await worker(port);
      const res = await post(`${head.url}/v1/messages`, turn);
      assert.equal(res.status, 200, `try ${i}: ${await res.clone().text()}`);
      assert.equal(comparableSse(await res.text()), comparableSse(want));
    }

    // Killed while idle: /metrics (which sends nothing to the stage) shows it within 2 s, and
    // /health says so too; back within 2 s of the restart, still without a request.
    assert.equal(await stageUp(), 1);
    w.child.kill("SIGKILL");
    await w.stop();
    let t0 = performance.now();
    await waitFor(async () => await stageUp() === 0, 2000);
    assert.ok(performance.now() - t0 < 2000);
    const down = await fetch(`${head.url}/health`);
    assert.equal(down.status, 503);
    assert.equal((await down.json()).stages[1].up, false);
    w = await worker(port);
    await waitFor(async () => await stageUp() === 1, 2500);

    // Hung (stopped, so its socket stays open): the idle PING goes unanswered.
    await new Promise((r) => setTimeout(r, 300));
    w.child.kill("SIGSTOP");
    t0 = performance.now();
    await waitFor(async () => await stageUp() === 0, 3000);
    const noticed = performance.now() - t0;
    w.child.kill("SIGCONT");
    assert.ok(noticed < 2200, `a hung stage was noticed after ${noticed} ms`);
    assert.equal((await fetch(`${head.url}/health`)).status, 200); // Reconnected once it ran.
    assert.equal(
      comparableSse(await (await post(`${head.url}/v1/messages`, turn)).text()),
      comparableSse(want),
    );
  } finally {
    await head.close();
    await w.stop();
  }
});

Deno.test("the last worker of a three-stage chain restarted mid-stream: the stream resumes", async () => {
  const port = freePort();
  const last = () =>
    startWorker({ model: modelPath, layers: "3:4", port, slots: 1, ctx: CTX, snapshots: 4 });
  let tail = await last();
  const middle = await startWorker({
    model: modelPath,
    layers: "1:3",
    slots: 1,
    ctx: CTX,
    snapshots: 4,
    next: tail.address,
  });
  const head = await startTestHead({
    layers: { first: 0, end: 1 },
    next: middle.address,
    slots: 1,
    ctx: CTX,
    snapshots: 4,
  });
  const whole = await startTestHead({ slots: 1, ctx: CTX, snapshots: 4 });
  try {
    const want = await (await post(`${whole.url}/v1/messages`, story)).text();
    const res = await post(`${head.url}/v1/messages`, story);
    const got = await readAround(res, /text_delta/g, 3, async () => {
      tail.child.kill("SIGKILL");
      await tail.stop();
      // The middle stage reports its dead hop; the head keeps the stream open until it is back.
      await new Promise((r) => setTimeout(r, 300));
      tail = await last();
    });
    assert.equal(comparableSse(got), comparableSse(want));
    // The middle stage relayed its hop's failure, naming the hop; the head resumed after it.
    const lost = `seq1 lost the stage at ${middle.address} after \\d+ tokens \\(Cannot use the ` +
      `stage at ${tail.address}: `;
    assert.ok(head.lines.some((l) => new RegExp(lost).test(l)), head.lines.join("\n"));
    assert.ok(head.lines.some((l) => /^seq1 resumes after/.test(l)), head.lines.join("\n"));
  } finally {
    await head.close();
    await whole.close();
    await middle.stop();
    await tail.stop();
  }
});
