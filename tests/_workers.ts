// Test helpers for lib/wire and worker.ts: free ports, worker processes started as `deno task
// worker` starts them (under the grant their flags call for), in-process stage servers, raw hellos.

import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage, StageOpenOptions } from "../engine/stage.ts";
import { encodeFrame, encodeGreeting, type Frame, MAGIC, Op } from "../lib/wire/frame.ts";
import { FrameReader, writeAll } from "../lib/wire/frame_stream.ts";
import { freshNonce, modelFingerprint, NO_PROOF } from "../lib/wire/hello.ts";
import type { RemoteStage } from "../lib/wire/remote_stage.ts";
import { serveStage, type StageServer } from "../lib/wire/stage_server.ts";

export const PROJECT_ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname)
  .replace(/\/$/, "");
const WORKER = `${PROJECT_ROOT}/worker.ts`;

/** A port that was free a moment ago (the OS picks it). */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

export interface WorkerOptions {
  readonly model: string;
  readonly layers: string;
  readonly port?: number;
  /** --host; default (and the address tests connect to) 127.0.0.1. */
  readonly host?: string;
  readonly slots?: number;
  readonly ctx?: number;
  readonly maxBatch?: number;
  /** --snapshots; default 0, null: the worker's own default (sized from ctx and slots). */
  readonly snapshots?: number | null;
  readonly next?: string;
  readonly keyFile?: string;
  /**
   * Engine of the worker: the CPU reference by default (these tests are about the wire), or the
   * GPU engine on Deno's builtin provider, which needs no permission beyond net and read.
   */
  readonly backend?: "reference" | "gpu";
  /** Flags after the usual ones, e.g. ["--host", "0.0.0.0"]. */
  readonly extra?: readonly string[];
}

export interface WorkerProcess {
  readonly address: string;
  readonly child: Deno.ChildProcess;
  /** Everything the worker wrote to stderr so far. */
  log(): string;
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<void>;
}

/**
 * The `deno run` arguments of a worker, with the launcher's grant of `deno task worker`: the role
 * itself then runs with net only to its port and --next and read only of its files.
 */
export function workerArgs(options: WorkerOptions, port: number): string[] {
  const flags = [
    ["--model", options.model],
    ["--layers", options.layers],
    ["--port", String(port)],
    ...(options.host ? [["--host", options.host]] : []),
    ["--slots", String(options.slots ?? 1)],
    ["--ctx", String(options.ctx ?? 64)],
    ...(options.snapshots === null ? [] : [["--snapshots", String(options.snapshots ?? 0)]]),
    ...(options.maxBatch ? [["--max-batch", String(options.maxBatch)]] : []),
    ...(options.next ? [["--next", options.next]] : []),
    ...(options.keyFile ? [["--key-file", options.keyFile]] : []),
    ...(options.backend === "gpu"
      ? [["--backend", "gpu", "--gpu", "builtin", "--allow-software-gpu"]]
      : [["--backend", "reference"]]),
  ].flat();
  return [
    "run",
    "--no-prompt",
    ...LAUNCHER_FLAGS,
    WORKER,
    ...flags,
    ...(options.extra ?? []),
  ];
}

export interface LoggedProcess {
  readonly child: Deno.ChildProcess;
  /** Everything the process wrote to stderr so far. */
  log(): string;
  /** SIGTERM, then waits for the exit; its status. */
  stop(): Promise<Deno.CommandStatus>;
}

/**
 * Spawns `deno <args>` in the project root and waits until its stderr matches `ready`. Throws
 * with its output if it exits first.
 */
export async function startLogged(
  args: readonly string[],
  ready: RegExp,
  env: Record<string, string> = {},
): Promise<LoggedProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [...args],
    cwd: PROJECT_ROOT,
    env,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let text = "";
  const started = Promise.withResolvers<void>();
  const drained = (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      if (ready.test(text)) started.resolve();
    }
  })();
  const exited = child.status.then(async (s) => {
    await drained;
    return s;
  });
  const early = await Promise.race([started.promise.then(() => undefined), exited]);
  if (early) throw new Error(`deno ${args.join(" ")} exited with ${early.code}:\n${text}`);
  return {
    child,
    log: () => text,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch (e) {
        if (!(e instanceof TypeError)) throw e; // Already exited.
      }
      return await exited;
    },
  };
}

/**
 * Tries a port freePort chose this many times: between its probe and the worker's listen, a
 * test running beside it can take the port (a connection's ephemeral port: seen once in CI).
 */
const PORT_TRIES = 3;

/**
 * Starts worker.ts and waits until it listens. Throws with its output if it exits first; on a
 * port it chose itself that another process took meanwhile, it tries another.
 */
export async function startWorker(options: WorkerOptions): Promise<WorkerProcess> {
  for (let tries = 1;; tries++) {
    const port = options.port ?? freePort();
    try {
      return await startOn(options, port);
    } catch (e) {
      const taken = e instanceof Error && e.message.includes("the port is in use");
      if (options.port !== undefined || !taken || tries === PORT_TRIES) throw e;
    }
  }
}

async function startOn(options: WorkerOptions, port: number): Promise<WorkerProcess> {
  const p = await startLogged(workerArgs(options, port), /listening on/);
  return {
    address: `127.0.0.1:${port}`,
    child: p.child,
    log: p.log,
    async stop() {
      await p.stop();
    },
  };
}

/** Runs worker.ts with `args` to completion (for start-up failures); exit code and stderr. */
export async function runWorkerToExit(
  options: WorkerOptions,
): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: workerArgs(options, options.port ?? freePort()),
    cwd: PROJECT_ROOT,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

export interface LocalServer {
  readonly address: string;
  readonly stage: Stage;
  readonly server: StageServer;
  stop(): Promise<void>;
}

/** A stage server in this process on a free loopback port, over a reference stage. */
export async function serveLocal(
  model: GgufModel,
  stageOptions: StageOpenOptions,
  options: {
    key?: CryptoKey;
    next?: RemoteStage;
    handshakeTimeoutMs?: number;
    /** Opens the served stage; default the reference engine's. */
    open?: (model: GgufModel, options: StageOpenOptions) => Promise<Stage>;
  } = {},
): Promise<LocalServer> {
  const { open = openReferenceStage, ...serve } = options;
  const stage = await open(model, stageOptions);
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const server = serveStage(listener, {
    stage,
    fingerprint: await modelFingerprint(model),
    ...serve,
  });
  return {
    address: `127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    stage,
    server,
    async stop() {
      server.close();
      await server.finished;
      options.next?.close();
      stage.close();
    },
  };
}

/** A raw connection past the hello of a worker without a key: for sending arbitrary bytes. */
export interface RawClient {
  readonly conn: Deno.TcpConn;
  readonly reader: FrameReader;
  /** The worker's HELLO. */
  readonly hello: Frame;
  send(bytes: Uint8Array): Promise<void>;
  /**
   * The next frame from the worker but its ALIVEs (signs of life that may come between any two),
   * null when it closed the connection.
   */
  next(): Promise<Frame | null>;
  close(): void;
}

export async function rawClient(address: string): Promise<RawClient> {
  const [hostname, port] = address.split(":");
  const conn = await Deno.connect({ hostname, port: Number(port) });
  conn.setNoDelay(true);
  const reader = new FrameReader(conn);
  const limits = { nEmbd: 0, maxBatch: 0 };
  // Greeting and AUTH go out together: without a key the proof does not depend on the nonce.
  await writeAll(conn, encodeGreeting(freshNonce(), MAGIC));
  await writeAll(conn, encodeFrame({ op: Op.Auth, proof: NO_PROOF }));
  const challenge = await reader.readFrame(limits);
  if (challenge?.op !== Op.Challenge) throw new Error(`expected a challenge, got ${challenge?.op}`);
  const hello = await reader.readFrame(limits);
  if (hello?.op !== Op.Hello) {
    throw new Error(`expected a hello, got ${JSON.stringify(hello)}`);
  }
  const frameLimits = { nEmbd: hello.info.nEmbd, maxBatch: hello.info.maxBatch };
  return {
    conn,
    reader,
    hello,
    send: (bytes) => writeAll(conn, bytes),
    async next() {
      for (;;) {
        const frame = await reader.readFrame(frameLimits);
        if (frame?.op !== Op.Alive) return frame;
      }
    },
    close() {
      try {
        conn.close();
      } catch (e) {
        if (!(e instanceof Deno.errors.BadResource)) throw e;
      }
    },
  };
}
