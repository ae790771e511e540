// Starts a role (head or worker) under the grant its own flags call for: the launcher thread reads
// the flags, derives the grant (grants.ts) and runs the role in a thread that holds only that.
// The entry point of main.ts and worker.ts, for `deno task` and the compiled binaries alike.
//
// The entry module runs twice: once as the process's main module (the launcher thread, with the
// broad grant of LAUNCHER_FLAGS) and once as the role thread, a Web Worker on the same module
// with Deno's per-worker permissions. The flag values and the files they name, resolved through
// their links, travel to it in one message; it answers with one message when the role ends.

import { type Command, type FlagTable, type FlagValues, runCommand, UsageError } from "../cli.ts";
import {
  dawnFolder,
  describeGrant,
  resolveRoleFiles,
  type Role,
  type RoleFiles,
  type RoleFlags,
  roleGrant,
} from "./grants.ts";

/** Launcher → role thread. */
interface Start {
  readonly values: unknown;
  readonly files: RoleFiles;
}

/** Role thread → launcher: how the role ended. */
type Ended =
  | { readonly ok: true }
  | { readonly ok: false; readonly message: string; readonly usage: boolean };

/** Whether this module runs in a role thread (a Web Worker) rather than the main thread. */
function inRoleThread(): boolean {
  const scope = (globalThis as { WorkerGlobalScope?: new () => unknown }).WorkerGlobalScope;
  return typeof scope === "function" && globalThis instanceof scope;
}

/** Runs the role thread: waits for the values, runs `main`, reports how it ended. */
function serveRoleThread<V>(main: (values: V, files: RoleFiles) => Promise<void>): void {
  const port = globalThis as unknown as {
    onmessage: ((e: MessageEvent<Start>) => void) | null;
    postMessage(message: Ended): void;
  };
  port.onmessage = (e) => {
    port.onmessage = null;
    main(e.data.values as V, e.data.files).then(
      () => port.postMessage({ ok: true }),
      (err: Error) =>
        port.postMessage({
          ok: false,
          message: err?.message ?? String(err),
          usage: err instanceof UsageError,
        }),
    );
  };
}

/** Starts the role thread on `entry` under `grant` and waits until the role ends. */
async function runInRoleThread(
  role: Role,
  entry: string,
  start: Start,
  grant: ReturnType<typeof roleGrant>,
): Promise<void> {
  const ended = Promise.withResolvers<void>();
  let thread: Worker;
  try {
    thread = new Worker(entry, { type: "module", name: role, deno: { permissions: grant } });
  } catch (e) {
    throw new Error(
      `Cannot start the ${role} under its own grant: ${(e as Error).message}; start it with ` +
        `"deno task ${role}" or the tandem-${role} binary, whose launcher holds what it hands down`,
    );
  }
  thread.onmessage = (e: MessageEvent<Ended>) => {
    if (e.data.ok) ended.resolve();
    else ended.reject(e.data.usage ? new UsageError(e.data.message) : new Error(e.data.message));
  };
  thread.onerror = (e) => {
    e.preventDefault();
    ended.reject(new Error(e.message));
  };
  thread.postMessage(start);
  try {
    await ended.promise;
  } finally {
    thread.terminate();
  }
}

/** What the launcher hands the role thread: its flag values, and what its grant follows. */
export interface Prepared<V> {
  readonly values: V;
  readonly touches: RoleFlags;
}

/** A loopback port free a moment ago, for a role's internal server (the OS picks it). */
export function freeLoopbackPort(): number {
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = probe.addr as Deno.NetAddr;
  probe.close();
  return port;
}

/**
 * The whole life of a role process. In the launcher thread: flags (--help and usage errors as
 * every command), the grant derived from them, then the role thread; in the role thread: `main`.
 * `entry` is the calling module's import.meta.url; `prepare` settles the values the role gets
 * (e.g. picks its internal port) and picks the flags the grant follows. `main` must read the
 * model and key files through `files` (resolved): the paths the flags give are not granted when
 * they are links.
 */
export async function runRole<F extends FlagTable>(
  role: Role,
  command: Command<F>,
  entry: string,
  prepare: (values: FlagValues<F>) => Prepared<FlagValues<F>>,
  main: (values: FlagValues<F>, files: RoleFiles) => Promise<void>,
): Promise<void> {
  if (inRoleThread()) return serveRoleThread(main);
  await runCommand(command, async (given) => {
    const { values, touches } = prepare(given);
    const files = resolveRoleFiles(touches);
    const grant = roleGrant(touches, files, dawnFolder());
    console.error(`[launch] the ${role} runs with: ${describeGrant(grant, files)}`);
    await runInRoleThread(role, entry, { values, files }, grant);
  });
  // The role ended on its own (a signal): nothing else may keep the process up.
  Deno.exit(0);
}
