// Tests for lib/server/header_guard.ts in front of a small Deno.serve: idle, trickled and oversize
// heads are answered 408/431 at the deadline; whole requests, bodies and streams pass unchanged.

import assert from "node:assert/strict";
import { guardHeaders, MAX_HEAD_BYTES } from "./header_guard.ts";
import { writeAll } from "../wire/frame_stream.ts";

const TIMEOUT_MS = 300;

/** An echo server behind the guard; `cancelled` settles when a streamed reply is cancelled. */
async function guarded() {
  const cancelled = Promise.withResolvers<void>();
  const listening = Promise.withResolvers<Deno.NetAddr>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: (a) => listening.resolve(a as Deno.NetAddr),
  }, async (request) => {
    if (new URL(request.url).pathname === "/stream") {
      let timer: ReturnType<typeof setInterval>;
      return new Response(
        new ReadableStream<Uint8Array>({
          start(c) {
            timer = setInterval(() => c.enqueue(new TextEncoder().encode("tick\n")), 20);
          },
          cancel() {
            clearInterval(timer);
            cancelled.resolve();
          },
        }),
      );
    }
    const body = new Uint8Array(await request.arrayBuffer());
    return new Response(body, {
      headers: { "x-seen": request.headers.get("x-note") ?? "", "x-length": String(body.length) },
    });
  });
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const guard = guardHeaders({
    listener,
    upstream: await listening.promise,
    headerTimeoutMs: TIMEOUT_MS,
    log: () => {},
  });
  return {
    url: `http://127.0.0.1:${listener.addr.port}`,
    port: listener.addr.port,
    cancelled: cancelled.promise,
    async stop() {
      guard.close();
      await server.shutdown();
      await guard.finished;
    },
  };
}

/** Everything the guard sends on a raw connection until it closes, and when it closed. */
async function rawExchange(port: number, send: (conn: Deno.Conn) => Promise<void>) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const t0 = performance.now();
  const sending = send(conn).catch(() => undefined);
  const chunks: Uint8Array[] = [];
  const buffer = new Uint8Array(4096);
  try {
    for (let n = await conn.read(buffer); n !== null; n = await conn.read(buffer)) {
      chunks.push(buffer.slice(0, n));
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.ConnectionReset)) throw e;
  }
  const ms = performance.now() - t0;
  conn.close();
  await sending;
  return { text: new TextDecoder().decode(Uint8Array.from(chunks.flatMap((c) => [...c]))), ms };
}

Deno.test("an idle, a trickling and an oversize request head are cut off at the deadline", async () => {
  const s = await guarded();
  try {
    const idle = await rawExchange(s.port, () => Promise.resolve());
    assert.match(idle.text, /^HTTP\/1\.1 408 Request Timeout\r\n/);
    assert.ok(idle.ms >= TIMEOUT_MS - 20, `closed after ${idle.ms} ms`);
    // A byte every 50 ms keeps the connection busy but never finishes the head.
    const trickle = await rawExchange(s.port, async (conn) => {
      for (const c of "GET / HTTP/1.1\r\nHost: x\r\nX-Note: slow\r\n") {
        await conn.write(new TextEncoder().encode(c));
        await new Promise((r) => setTimeout(r, 50));
      }
    });
    assert.match(trickle.text, /^HTTP\/1\.1 408 Request Timeout\r\n/);
    assert.ok(trickle.ms < 4 * TIMEOUT_MS, `closed after ${trickle.ms} ms`);
    const huge = await rawExchange(s.port, (conn) =>
      writeAll(
        conn,
        new TextEncoder().encode(`GET / HTTP/1.1\r\nX-Big: ${"a".repeat(MAX_HEAD_BYTES)}\r\n\r\n`),
      ));
    assert.match(huge.text, /^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
  } finally {
    await s.stop();
  }
});

Deno.test("whole requests pass unchanged, one per connection; bodies and non-ASCII headers too", async () => {
  const s = await guarded();
  try {
    const body = new Uint8Array(300_000).map((_, i) => i % 251);
    const res = await fetch(`${s.url}/echo`, {
      method: "POST",
      headers: { connection: "keep-alive" },
      body,
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("connection"), "close");
    assert.equal(res.headers.get("x-length"), String(body.length));
    assert.deepEqual(new Uint8Array(await res.arrayBuffer()), body);
    // Sequential requests each get their own connection and their own deadline.
    for (let i = 0; i < 3; i++) assert.equal((await fetch(`${s.url}/`)).status, 200);
    // Header bytes above 0x7f (UTF-8 here) reach the server as sent.
    const raw = await rawExchange(s.port, (conn) =>
      writeAll(
        conn,
        new TextEncoder().encode(
          "POST /echo HTTP/1.1\r\nHost: x\r\nX-Note: Ünïcödé ✓\r\nContent-Length: 2\r\n\r\nhi",
        ),
      ));
    assert.match(raw.text, /^HTTP\/1\.1 200 OK\r\n/);
    assert.match(raw.text, /\r\nx-seen: Ünïcödé ✓\r\n/);
    assert.match(raw.text, /\r\n\r\nhi$/);
  } finally {
    await s.stop();
  }
});

Deno.test("a client that leaves a streamed reply cancels it at the server", async () => {
  const s = await guarded();
  try {
    const res = await fetch(`${s.url}/stream`);
    const reader = res.body!.getReader();
    assert.match(new TextDecoder().decode((await reader.read()).value), /tick/);
    await reader.cancel();
    await s.cancelled;
  } finally {
    await s.stop();
  }
});
