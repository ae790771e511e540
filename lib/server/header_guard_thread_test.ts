// Tests for lib/server/header_guard_thread.ts: the guard relays from its own thread, reports a busy
// port as the listen error, and keeps streaming while the main thread's event loop turns slowly.

import assert from "node:assert/strict";
import { startHeaderGuardThread } from "./header_guard_thread.ts";

/** A Deno.serve whose /stream reply is fed by `push`; the guard thread in front of it. */
async function guardedStream() {
  let controller: ReadableStreamDefaultController<Uint8Array> | undefined;
  const opened = Promise.withResolvers<void>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    if (new URL(request.url).pathname !== "/stream") return new Response("plain");
    return new Response(
      new ReadableStream<Uint8Array>({
        start(c) {
          controller = c;
          opened.resolve();
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  });
  const lines: string[] = [];
  const guard = await startHeaderGuardThread({
    hostname: "127.0.0.1",
    port: 0,
    upstream: server.addr,
    headerTimeoutMs: 5000,
    log: (line) => lines.push(line),
  });
  return {
    guard,
    url: `http://127.0.0.1:${guard.addr.port}`,
    opened: opened.promise,
    push: (text: string) => controller!.enqueue(new TextEncoder().encode(text)),
    end: () => controller!.close(),
    async stop() {
      guard.close();
      await server.shutdown();
      await guard.finished;
    },
  };
}

// Reads `url` on a thread of its own and posts [event number, performance.timeOrigin-based ms]
// for each "data: N" line as it arrives, so the reader is never slowed by the main thread.
const READER = `
self.onmessage = async (e) => {
  const res = await fetch(e.data);
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    const at = performance.timeOrigin + performance.now();
    for (const m of dec.decode(chunk).matchAll(/data: (\\d+)/g)) self.postMessage([Number(m[1]), at]);
  }
  self.postMessage(null);
};`;

Deno.test("the guard thread relays a request and refuses a port in use as AddrInUse", async () => {
  const s = await guardedStream();
  try {
    assert.equal(await (await fetch(s.url)).text(), "plain");
    await assert.rejects(
      startHeaderGuardThread({
        hostname: "127.0.0.1",
        port: s.guard.addr.port,
        upstream: s.guard.addr,
        headerTimeoutMs: 5000,
        log: () => {},
      }),
      Deno.errors.AddrInUse,
    );
  } finally {
    await s.stop();
  }
});

Deno.test("a streamed event reaches the client while the main thread turns its loop slowly", async () => {
  // The engine's GPU waits keep the main thread busy between short loop turns (Dawn's polls
  // with blocking pauses); here each turn is 2 ms of busy work. A relay on the main thread
  // delivered such events tens of ms late; from its own thread it takes about a millisecond.
  const s = await guardedStream();
  const reader = new Worker(`data:application/javascript,${encodeURIComponent(READER)}`, {
    type: "module",
  });
  const arrived: number[] = [];
  const done = Promise.withResolvers<void>();
  reader.onmessage = (e: MessageEvent<[number, number] | null>) => {
    if (e.data === null) done.resolve();
    else arrived[e.data[0]] = e.data[1];
  };
  try {
    reader.postMessage(`${s.url}/stream`);
    await s.opened;
    const sent: number[] = [];
    for (let i = 0; i < 15; i++) {
      sent[i] = performance.timeOrigin + performance.now();
      s.push(`data: ${i}\n\n`);
      const until = performance.now() + 60;
      while (performance.now() < until) {
        const turn = performance.now() + 2;
        while (performance.now() < turn);
        await new Promise((resolve) => setImmediate(resolve));
      }
    }
    s.end();
    await done.promise;
    const lags = sent.map((t, i) => arrived[i] - t).sort((a, b) => a - b);
    assert.equal(lags.length, 15);
    const median = lags[7];
    assert.ok(median < 20, `the median event arrived ${median.toFixed(1)} ms after it was sent`);
  } finally {
    reader.terminate();
    await s.stop();
  }
});
