// The serving processes the bench starts: worker.ts for the last layers on loopback TCP (put after
// an in-process stage by bench/stage_bench.ts), and main.ts heads for the figures through HTTP.

import type { DraftMode } from "../lib/scheduler/draft.ts";
import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";

export interface WorkerOptions {
  readonly model: string;
  readonly first: number;
  readonly end: number;
  readonly backend: string;
  readonly gpu: string;
  readonly slots: number;
  readonly ctx: number;
  /** How long the worker may take to open its layers and listen. */
  readonly startTimeoutS: number;
  /** Receives each line the worker logs. */
  readonly log: (line: string) => void;
}

/** A child process that logged its ready line. */
export interface RunningProcess {
  /** The line that said it was ready. */
  readonly readyLine: string;
  /** Seconds from spawn until that line (opening its layers is most of it). */
  readonly startSeconds: number;
  /** Stops it (SIGTERM, then SIGKILL after 10 s) and waits for it to exit. */
  stop(): Promise<void>;
}

export interface RunningWorker extends RunningProcess {
  /** host:port it listens on. */
  readonly address: string;
}

const WORKER = new URL("../worker.ts", import.meta.url);
const HEAD = new URL("../main.ts", import.meta.url);
/** A port the OS calls free now; the worker binds it a moment later. */
function freePort(): number {
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = probe.addr as Deno.NetAddr;
  probe.close();
  return port;
}

/** Lines of a byte stream, passed to `onLine` as they arrive. */
async function readLines(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void) {
  let rest = "";
  for await (const text of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + text).split("\n");
    rest = lines.pop()!;
    for (const line of lines) onLine(line);
  }
  if (rest) onLine(rest);
}

/**
 * Spawns `deno run <launcher grant> <args>` and resolves once a line of its stderr matches `ready`; throws with
 * its last lines when it exits or stays silent for `startTimeoutS` first.
 */
async function startProcess(
  args: readonly string[],
  what: string,
  ready: RegExp,
  options: { readonly startTimeoutS: number; readonly log: (line: string) => void },
): Promise<RunningProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    // As `deno task head|worker` start them: each role runs under the grant its flags call for.
    args: ["run", ...LAUNCHER_FLAGS, ...args],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const started = performance.now();
  const tail: string[] = [];
  let readyLine = "";
  let seen: () => void = () => {};
  const isReady = new Promise<void>((resolve) => seen = resolve);
  const lines = readLines(child.stderr, (line) => {
    options.log(line);
    tail.push(line);
    if (tail.length > 20) tail.shift();
    if (!readyLine && ready.test(line)) {
      readyLine = line;
      seen();
    }
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    isReady.then(() => "ready" as const),
    child.status.then((s) => `exited with code ${s.code}` as const),
    new Promise<string>((resolve) => {
      timer = setTimeout(
        () => resolve(`was not ready within ${options.startTimeoutS} s`),
        options.startTimeoutS * 1000,
      );
    }),
  ]);
  clearTimeout(timer);
  const startSeconds = (performance.now() - started) / 1000;
  async function stop(): Promise<void> {
    try {
      child.kill("SIGTERM");
    } catch {
      // Already exited: its status below resolves at once.
    }
    const killer = setTimeout(() => {
      try {
        child.kill("SIGKILL");
      } catch {
        // Exited between the two signals.
      }
    }, 10_000);
    await child.status;
    clearTimeout(killer);
    await lines;
  }
  if (outcome !== "ready") {
    await stop();
    throw new Error(`Cannot start ${what}: it ${outcome}; its last lines:\n${tail.join("\n")}`);
  }
  return { readyLine, startSeconds, stop };
}

/** --backend, and --gpu where the backend has providers. */
function engineArgs(options: { backend: string; gpu: string }): string[] {
  return [
    "--backend",
    options.backend,
    ...(options.backend === "gpu" ? ["--gpu", options.gpu] : []),
  ];
}

/** Spawns worker.ts and resolves once it logs that it is listening. */
export async function startWorker(options: WorkerOptions): Promise<RunningWorker> {
  const port = freePort();
  const running = await startProcess(
    [
      WORKER.pathname,
      "--model",
      options.model,
      "--layers",
      `${options.first}:${options.end}`,
      "--port",
      String(port),
      "--slots",
      String(options.slots),
      "--ctx",
      String(options.ctx),
      ...engineArgs(options),
    ],
    `the worker for layers ${options.first}:${options.end}`,
    / listening on /,
    options,
  );
  return { ...running, address: `127.0.0.1:${port}` };
}

export interface HeadProcessOptions {
  readonly model: string;
  readonly backend: string;
  readonly gpu: string;
  /** Sequences it decodes at once (the worker after it needs at least as many). */
  readonly slots: number;
  readonly ctx: number;
  /** Requests that may wait for a slot (--queue); the head's default when undefined. */
  readonly queue?: number;
  /** Prompt positions a sequence runs per step beside others (--prefill-chunk); default when undefined. */
  readonly prefillChunk?: number;
  /** How long such a step may take (--prefill-step-ms); default when undefined. */
  readonly prefillStepMs?: number;
  /** Speculative decoding (--draft); the head's default ("off") when undefined. */
  readonly draft?: DraftMode;
  /** "0:k" with `next` (the worker's address); the whole model without. */
  readonly layers?: string;
  readonly next?: string;
  readonly startTimeoutS: number;
  readonly log: (line: string) => void;
}

export interface RunningHead extends RunningProcess {
  /** http://host:port it serves. */
  readonly url: string;
}

/** Spawns main.ts on a free port and resolves once it serves (its weights loaded). */
export async function startHeadProcess(options: HeadProcessOptions): Promise<RunningHead> {
  const split = options.layers && options.next
    ? ["--layers", options.layers, "--next", options.next]
    : [];
  const running = await startProcess(
    [
      HEAD.pathname,
      "--model",
      options.model,
      "--port",
      "0",
      "--slots",
      String(options.slots),
      "--ctx",
      String(options.ctx),
      ...(options.queue === undefined ? [] : ["--queue", String(options.queue)]),
      ...(options.prefillChunk === undefined
        ? []
        : ["--prefill-chunk", String(options.prefillChunk)]),
      ...(options.prefillStepMs === undefined
        ? []
        : ["--prefill-step-ms", String(options.prefillStepMs)]),
      ...(options.draft === undefined ? [] : ["--draft", String(options.draft)]),
      // Without the prefix cache every request prefills its whole prompt, as the figure means.
      "--snapshots",
      "0",
      ...engineArgs(options),
      ...split,
    ],
    `the head${split.length ? ` on layers ${options.layers}` : ""}`,
    / serving \S+ at http/,
    options,
  );
  const url = / at (http:\/\/[^\s:]+:\d+)/.exec(running.readyLine)?.[1];
  if (!url) {
    await running.stop();
    throw new Error(`Cannot find the head's address in "${running.readyLine}"`);
  }
  return { ...running, url };
}

/** A head's options but its layers, which `split` decides. */
export interface ServingOptions extends Omit<HeadProcessOptions, "layers" | "next"> {
  /** The model's layers; with `split` k, the head holds 0:k and a worker k:nLayer. */
  readonly nLayer: number;
  readonly split?: number;
}

/** A head serving HTTP, after its worker when split. */
export interface Serving {
  readonly url: string;
  /** "0:40" unsplit, "0:20 + 20:40" split. */
  readonly layers: string;
  /** Seconds until the head served (the worker's start included). */
  readonly startSeconds: number;
  /** Stops the head, then the worker. */
  stop(): Promise<void>;
}

/** "0:n", or "0:k + k:n" for a split at k. */
export function layersName(nLayer: number, split?: number): string {
  return split === undefined ? `0:${nLayer}` : `0:${split} + ${split}:${nLayer}`;
}

/**
 * Starts a head on the whole model, or a worker for layers k:n and a head on 0:k before it, each
 * with the same slots and context; what was started is stopped again when a later start fails.
 */
export async function startServing(options: ServingOptions): Promise<Serving> {
  const { split, nLayer } = options;
  const started: RunningProcess[] = [];
  const stop = async () => {
    for (const p of started.reverse()) await p.stop();
  };
  const start = performance.now();
  try {
    let next: string | undefined;
    if (split !== undefined) {
      const worker = await startWorker({ ...options, first: split, end: nLayer });
      started.push(worker);
      next = worker.address;
    }
    const head = await startHeadProcess({
      ...options,
      layers: split === undefined ? undefined : `0:${split}`,
      next,
    });
    started.push(head);
    return {
      url: head.url,
      layers: layersName(nLayer, split),
      startSeconds: (performance.now() - start) / 1000,
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}
