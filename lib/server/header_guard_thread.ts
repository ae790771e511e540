// The head's public socket on a thread of its own: header_guard.ts's relay runs in a worker, so
// a streamed token reaches the client while the main thread waits on the GPU or walks a grammar.

import type { HeaderGuard } from "./header_guard.ts";
import type { FromGuard, ToGuard } from "./header_guard_worker.ts";

export interface HeaderGuardThreadOptions {
  /** The public address to listen on. */
  readonly hostname: string;
  readonly port: number;
  /** The loopback HTTP server the guarded requests go to. */
  readonly upstream: Deno.NetAddr;
  /** Time a connection has, from its accept, to send its whole request head. */
  readonly headerTimeoutMs: number;
  readonly log: (line: string) => void;
}

export interface HeaderGuardThread extends HeaderGuard {
  /** Where it listens (the port chosen when 0 was asked for). */
  readonly addr: Deno.NetAddr;
}

/**
 * The listen error as the main thread would have thrown it (Deno.errors.AddrInUse, ...), so
 * callers can tell a busy port from a wrong address.
 */
function listenFailure(name: string, message: string): Error {
  const errors = Deno.errors as unknown as Record<string, new (message: string) => Error>;
  return Object.hasOwn(errors, name) ? new errors[name](message) : new Error(message);
}

/**
 * Why a thread: the main thread records GPU steps (a fused greedy group is tens of ms of
 * synchronous work), polls Dawn and walks grammars; relayed there, a streamed reply reached the
 * client in bursts, 150 ms and more behind its tokens on the H200 (docs/PERFORMANCE.md, "Through
 * the server"). Rejects with the listen error when the address cannot be had.
 */
export function startHeaderGuardThread(
  options: HeaderGuardThreadOptions,
): Promise<HeaderGuardThread> {
  const worker = new Worker(new URL("./header_guard_worker.ts", import.meta.url).href, {
    type: "module",
  });
  const listening = Promise.withResolvers<HeaderGuardThread>();
  const finished = Promise.withResolvers<void>();
  const end = () => {
    worker.terminate();
    finished.resolve();
  };
  let serving = false;
  worker.onmessage = (event: MessageEvent<FromGuard>) => {
    const message = event.data;
    switch (message.kind) {
      case "listening":
        serving = true;
        listening.resolve({
          addr: { transport: "tcp", hostname: message.hostname, port: message.port },
          finished: finished.promise,
          close: () => worker.postMessage({ kind: "close" } satisfies ToGuard),
        });
        return;
      case "failed":
        end();
        listening.reject(listenFailure(message.name, message.message));
        return;
      case "log":
        options.log(message.line);
        return;
      case "finished":
        end();
    }
  };
  worker.onerror = (event) => {
    event.preventDefault();
    const error = new Error(`The header guard's thread failed: ${event.message}`);
    options.log(error.message);
    worker.terminate();
    if (!serving) {
      finished.resolve();
      listening.reject(error);
      return;
    }
    // A head without its public socket must not look alive: the rejection nobody awaits yet
    // ends the process, as a failed accept loop on the main thread did.
    finished.reject(error);
  };
  const { hostname, port, upstream, headerTimeoutMs } = options;
  worker.postMessage(
    {
      kind: "start",
      hostname,
      port,
      upstream: { hostname: upstream.hostname, port: upstream.port },
      headerTimeoutMs,
    } satisfies ToGuard,
  );
  return listening.promise;
}
