// A TCP proxy between two stages, for tests: a fixed delay each way (a link between boxes) and a
// partition (nothing forwarded, nothing closed, until it heals), as a network between boxes does.
// In a test's process (StageProxy.start), or as a process of its own (startProxyProcess).

import { parseAddress } from "../lib/wire/peer.ts";
import { startLogged } from "./_workers.ts";

/** A chunk read (null: the end of the stream) and when it may be written on. */
interface Chunk {
  readonly bytes: Uint8Array | null;
  readonly due: number;
}

/** One direction of one connection: the chunks read and not yet written, oldest first. */
class Chunks {
  readonly #items: Chunk[] = [];
  #arrived = Promise.withResolvers<void>();

  push(chunk: Chunk): void {
    this.#items.push(chunk);
    this.#arrived.resolve();
  }

  /** The only chunk, when it is the end: a connection that closed having sent nothing. */
  get endedEmpty(): boolean {
    return this.#items.length === 1 && this.#items[0].bytes === null;
  }

  async next(): Promise<Chunk> {
    while (this.#items.length === 0) {
      this.#arrived = Promise.withResolvers<void>();
      await this.#arrived.promise;
    }
    return this.#items.shift()!;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Forwards every connection to `target`. Each chunk read is written `delayMs` later, in order;
 * an end of stream is forwarded the same way (as a half close). While partitioned, nothing is
 * written and no new connection reaches the target, but every byte and end is kept and goes out
 * once healed, as TCP retransmits across a cut that mends; the sockets themselves stay open.
 */
export class StageProxy {
  readonly address: string;
  readonly #listener: Deno.TcpListener;
  readonly #target: { hostname: string; port: number };
  readonly #delayMs: number;
  readonly #conns = new Set<Deno.TcpConn>();
  #open = Promise.withResolvers<void>();
  #partitioned = false;
  #accepting: Promise<void>;

  private constructor(listener: Deno.TcpListener, target: string, delayMs: number) {
    this.#listener = listener;
    this.#target = parseAddress(target);
    this.#delayMs = delayMs;
    this.address = `127.0.0.1:${listener.addr.port}`;
    this.#open.resolve();
    this.#accepting = this.#acceptAll();
  }

  /** A proxy on a free loopback port in front of `target` (host:port). */
  static start(target: string, options: { delayMs?: number; port?: number } = {}): StageProxy {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: options.port ?? 0 });
    return new StageProxy(listener, target, options.delayMs ?? 0);
  }

  /** Stops forwarding, both ways and for new connections, without closing anything. */
  partition(): void {
    if (this.#partitioned) return;
    this.#partitioned = true;
    this.#open = Promise.withResolvers<void>();
  }

  /** Forwards again, starting with everything held meanwhile. */
  heal(): void {
    this.#partitioned = false;
    this.#open.resolve();
  }

  /** Closes the listener and every connection. */
  async close(): Promise<void> {
    this.#listener.close();
    for (const conn of this.#conns) closeQuietly(conn);
    await this.#accepting;
  }

  async #acceptAll(): Promise<void> {
    const running = new Set<Promise<void>>();
    try {
      for await (const conn of this.#listener) {
        const task = this.#serve(conn).finally(() => running.delete(task));
        running.add(task);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.BadResource)) throw e;
    }
    await Promise.all(running);
  }

  async #serve(client: Deno.TcpConn): Promise<void> {
    this.#conns.add(client);
    client.setNoDelay(true);
    const toTarget = new Chunks();
    // Read from the client at once, so a client that leaves during a partition is kept as such.
    const fromClient = this.#pump(client, toTarget);
    await this.#open.promise;
    if (toTarget.endedEmpty) {
      // It gave up before the cut mended: its connection never got through.
      closeQuietly(client);
      this.#conns.delete(client);
      return;
    }
    let target: Deno.TcpConn;
    try {
      target = await Deno.connect(this.#target);
    } catch {
      closeQuietly(client);
      this.#conns.delete(client);
      return;
    }
    this.#conns.add(target);
    target.setNoDelay(true);
    const toClient = new Chunks();
    await Promise.all([
      fromClient,
      this.#drain(toTarget, target),
      this.#pump(target, toClient),
      this.#drain(toClient, client),
    ]);
    for (const conn of [client, target]) {
      closeQuietly(conn);
      this.#conns.delete(conn);
    }
  }

  /** Reads `from` into `queue` until its end (or an error, taken as one). */
  async #pump(from: Deno.TcpConn, queue: Chunks): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    try {
      for (let n = await from.read(buffer); n !== null; n = await from.read(buffer)) {
        queue.push({ bytes: buffer.slice(0, n), due: performance.now() + this.#delayMs });
      }
    } catch {
      // A reset is an end like any other here.
    }
    queue.push({ bytes: null, due: performance.now() + this.#delayMs });
  }

  /** Writes `queue`'s chunks to `to`, each at its time and while not partitioned. */
  async #drain(queue: Chunks, to: Deno.TcpConn): Promise<void> {
    try {
      while (true) {
        const chunk = await queue.next();
        const wait = chunk.due - performance.now();
        if (wait > 0) await sleep(wait);
        await this.#open.promise;
        if (chunk.bytes === null) {
          await to.closeWrite();
          return;
        }
        for (let done = 0; done < chunk.bytes.length;) {
          done += await to.write(chunk.bytes.subarray(done));
        }
      }
    } catch {
      // The other side is gone; the pumps see it too.
      closeQuietly(to);
    }
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch (e) {
    if (!(e instanceof Deno.errors.BadResource)) throw e;
  }
}

/** A proxy in a process of its own, so that this process's work does not delay its timers. */
export interface ProxyProcess {
  readonly address: string;
  stop(): Promise<void>;
}

/** Starts this file as a process forwarding to `target` with `delayMs` each way. */
export async function startProxyProcess(target: string, delayMs: number): Promise<ProxyProcess> {
  const url = decodeURIComponent(new URL(import.meta.url).pathname);
  const p = await startLogged(
    ["run", "--allow-net", url, target, String(delayMs)],
    /proxy listening on \S+\n/,
  );
  const address = /proxy listening on (\S+)\n/.exec(p.log())![1];
  return {
    address,
    async stop() {
      await p.stop();
    },
  };
}

if (import.meta.main) {
  const [target, delay] = Deno.args;
  const proxy = StageProxy.start(target, { delayMs: Number(delay) });
  console.error(`proxy listening on ${proxy.address}`);
  Deno.addSignalListener("SIGTERM", () => proxy.close().finally(() => Deno.exit(0)));
}
