// The head's public socket: each connection must deliver a whole request head within a deadline
// before its bytes reach Deno.serve (which has no header timeout), one request per connection.
// lib/server/head.ts puts it in front of the HTTP server, which listens on loopback only.

import { deadline } from "../wire/deadline.ts";
import { writeAll } from "../wire/frame_stream.ts";

/** Largest request head (request line and headers) accepted; more is answered 431. */
export const MAX_HEAD_BYTES = 64 * 1024;

export interface HeaderGuardOptions {
  /** Where connections come in. */
  readonly listener: Deno.Listener<Deno.TcpConn>;
  /** The HTTP server the heads are passed on to. */
  readonly upstream: Deno.NetAddr;
  /** Time a connection has, from its accept, to send its whole request head. */
  readonly headerTimeoutMs: number;
  readonly log: (line: string) => void;
}

export interface HeaderGuard {
  /** Settles when the listener is closed and every connection has ended. */
  readonly finished: Promise<void>;
  /**
   * Stops accepting and drops connections still sending their head; requests already passed on
   * end when the server answers them (or shuts down).
   */
  close(): void;
}

const utf8 = new TextEncoder();
const END_OF_HEAD = utf8.encode("\r\n\r\n");

function reply(status: string): Uint8Array {
  return utf8.encode(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
}

/**
 * Answers `status`, half-closes, and reads what the client still sends until it closes, so the
 * answer is not lost to a reset caused by unread bytes.
 */
async function refuse(conn: Deno.Conn, status: string): Promise<void> {
  await writeAll(conn, reply(status));
  await conn.closeWrite();
  const scratch = new Uint8Array(4096);
  while (await conn.read(scratch) !== null);
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch (e) {
    if (!(e instanceof Deno.errors.BadResource)) throw e;
  }
}

function latin1(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 8192) {
    text += String.fromCharCode(...bytes.subarray(i, i + 8192));
  }
  return text;
}

/** The index just past the head's blank line in `bytes`, or -1. */
function headEnd(bytes: Uint8Array, from: number): number {
  for (let i = Math.max(0, from - 3); i + 4 <= bytes.length; i++) {
    if (END_OF_HEAD.every((b, k) => bytes[i + k] === b)) return i + 4;
  }
  return -1;
}

/** Reads until the request head is complete: the head and any bytes after it, or null at EOF. */
async function readHead(conn: Deno.Conn): Promise<{ head: string; rest: Uint8Array } | null> {
  const buffer = new Uint8Array(MAX_HEAD_BYTES + 4096);
  let filled = 0;
  while (true) {
    const n = await conn.read(buffer.subarray(filled));
    if (n === null) return null;
    const end = headEnd(buffer.subarray(0, filled + n), filled);
    filled += n;
    if (end > MAX_HEAD_BYTES || (end === -1 && filled > MAX_HEAD_BYTES)) {
      throw new RangeError("head too large");
    }
    if (end !== -1) {
      // One char per byte (true Latin-1), so the bytes come back unchanged in oneRequest().
      return {
        head: latin1(buffer.subarray(0, end)),
        rest: buffer.slice(end, filled),
      };
    }
  }
}

/**
 * The head with its connection headers replaced by `connection: close`, so the server answers
 * this one request and closes: every request on the public socket passes the deadline.
 */
function oneRequest(head: string): Uint8Array {
  const lines = head.slice(0, -4).split("\r\n")
    .filter((line, i) => i === 0 || !/^(connection|keep-alive)\s*:/i.test(line));
  const text = [...lines, "connection: close", "", ""].join("\r\n");
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

/**
 * Copies `from` to `to` until `from` ends, then half-closes `to`, so the end of a request or a
 * reply reaches the other side as it would without the guard. An error on either closes both.
 */
async function pipe(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buffer = new Uint8Array(64 * 1024);
  try {
    for (let n = await from.read(buffer); n !== null; n = await from.read(buffer)) {
      await writeAll(to, buffer.subarray(0, n));
    }
    await to.closeWrite();
  } catch {
    closeQuietly(from);
    closeQuietly(to);
  }
}

/** Starts guarding `listener`. */
export function guardHeaders(options: HeaderGuardOptions): HeaderGuard {
  const { listener, upstream, headerTimeoutMs, log } = options;
  /** Connections still sending their request head. */
  const waiting = new Set<Deno.Conn>();

  async function relay(client: Deno.TcpConn): Promise<void> {
    let server: Deno.TcpConn | undefined;
    try {
      let request: { head: string; rest: Uint8Array } | null;
      waiting.add(client);
      try {
        request = await deadline(readHead(client), headerTimeoutMs, () => new Error("timeout"));
      } catch (e) {
        const status = e instanceof RangeError
          ? "431 Request Header Fields Too Large"
          : "408 Request Timeout";
        await deadline(refuse(client, status), 1000, () => new Error("timeout"))
          .catch(() => undefined);
        return;
      } finally {
        waiting.delete(client);
      }
      if (request === null) return;
      server = await Deno.connect({ hostname: upstream.hostname, port: upstream.port });
      await writeAll(server, oneRequest(request.head));
      await writeAll(server, request.rest);
      // The server closes after its one answer, which ends the connection; a client that
      // leaves first ends its request at the server as it would without the guard.
      const up = pipe(client, server);
      await pipe(server, client);
      closeQuietly(client);
      await up;
    } catch (e) {
      log(`connection from ${(client.remoteAddr as Deno.NetAddr).hostname} ended: ${e}`);
    } finally {
      closeQuietly(client);
      if (server) closeQuietly(server);
    }
  }

  const finished = (async () => {
    const running = new Set<Promise<void>>();
    try {
      for await (const conn of listener) {
        const task = relay(conn).finally(() => running.delete(task));
        running.add(task);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.BadResource)) throw e;
    }
    await Promise.all(running);
  })();
  return {
    finished,
    close() {
      try {
        listener.close();
      } catch (e) {
        if (!(e instanceof Deno.errors.BadResource)) throw e;
      }
      for (const conn of waiting) closeQuietly(conn);
    },
  };
}
