// The header guard's thread body: listens on the head's public address and relays each guarded
// connection to the loopback HTTP server (header_guard.ts), driven by header_guard_thread.ts.

import { guardHeaders, type HeaderGuard } from "./header_guard.ts";

/** Messages to the thread: start once, then close. */
export type ToGuard =
  | {
    readonly kind: "start";
    readonly hostname: string;
    readonly port: number;
    readonly upstream: { readonly hostname: string; readonly port: number };
    readonly headerTimeoutMs: number;
  }
  | { readonly kind: "close" };

/** Messages from the thread. */
export type FromGuard =
  | { readonly kind: "listening"; readonly hostname: string; readonly port: number }
  | { readonly kind: "failed"; readonly name: string; readonly message: string }
  | { readonly kind: "log"; readonly line: string }
  | { readonly kind: "finished" };

/** The worker globals this file uses (the project is type-checked with the window globals). */
const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<ToGuard>) => void) | null;
  postMessage(message: FromGuard): void;
};

let guard: HeaderGuard | undefined;

scope.onmessage = (event) => {
  const message = event.data;
  if (message.kind === "close") {
    guard?.close();
    return;
  }
  let listener: Deno.TcpListener;
  try {
    listener = Deno.listen({ hostname: message.hostname, port: message.port });
  } catch (e) {
    const error = e as Error;
    scope.postMessage({ kind: "failed", name: error.name, message: error.message });
    return;
  }
  guard = guardHeaders({
    listener,
    upstream: { transport: "tcp", ...message.upstream },
    headerTimeoutMs: message.headerTimeoutMs,
    log: (line) => scope.postMessage({ kind: "log", line }),
  });
  guard.finished.then(() => scope.postMessage({ kind: "finished" }));
  const { hostname, port } = listener.addr;
  scope.postMessage({ kind: "listening", hostname, port });
};
