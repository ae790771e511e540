// Stages on two boxes: a proxy process delays every byte between the head and its worker by a fixed
// time each way. Replies are the direct chain's byte for byte, and two streams hide the round trip
// that one stream waits out (the split driver's pipelining, lib/scheduler/scheduler.ts).

import assert from "node:assert/strict";
import {
  comparableSse,
  concurrentStreams,
  post,
  startTestHead,
  streamRates,
  type TestHead,
  tinyModel,
} from "./_head.ts";
import { startProxyProcess } from "./_proxy.ts";
import { startWorker } from "./_workers.ts";

const modelPath = await tinyModel();
const CTX = 256;

function splitHead(address: string): Promise<TestHead> {
  return startTestHead({
    layers: { first: 0, end: 2 },
    next: address,
    slots: 2,
    ctx: CTX,
    snapshots: 0,
  });
}

/** Two streams at once and a buffered sampled request: each body, comparable. */
async function replies(head: TestHead): Promise<string[]> {
  const { bodies } = await concurrentStreams(head.url, 2, 24);
  const buffered = await post(`${head.url}/v1/chat/completions`, {
    model: "m",
    max_tokens: 24,
    temperature: 0.8,
    seed: 5,
    messages: [{ role: "user", content: "Describe the sea" }],
  });
  assert.equal(buffered.status, 200);
  const message = { ...await buffered.json(), id: "chatcmpl-ID", created: 0 };
  return [...bodies.map(comparableSse), JSON.stringify(message)];
}

Deno.test("over a 5 ms link: replies equal the direct chain's; two streams reach 1.7x one", async () => {
  const worker = await startWorker({ model: modelPath, layers: "2:4", slots: 2, ctx: CTX });
  let head = await splitHead(worker.address);
  const proxy = await startProxyProcess(worker.address, 5);
  try {
    const want = await replies(head);
    await head.close();
    head = await splitHead(proxy.address);
    assert.deepEqual(await replies(head), want);

    // Alternating rounds, and the best of each: a burst of other work (CI runs test files side by
    // side) costs one round, not the figure.
    const { one, two } = await streamRates(head.url, 3, 96);
    const ratio = Math.max(...two) / Math.max(...one);
    assert.ok(
      ratio >= 1.7,
      `two streams made ${Math.max(...two).toFixed(1)} tok/s, one ${Math.max(...one).toFixed(1)}: ${
        ratio.toFixed(2)
      }x (rounds: one ${one.map((x) => x.toFixed(1))}, two ${two.map((x) => x.toFixed(1))})`,
    );
  } finally {
    await head.close();
    await proxy.stop();
    await worker.stop();
  }
});
