// The worker-kill drill: a head process serving concurrent streams while its worker is SIGKILLed
// and restarted again and again. kill_drill_test.ts runs it at CI size; `deno task drill`, long.
//
// Every request must either complete byte-identical to its uninterrupted reference or end with a
// typed error (a 503/529 refusal, or an error event after a prefix of the reference); the head
// process must live through it all, its live memory within 10% of where it was after warm-up and
// its open files as many.

import { comparableSse, post, tinyModel } from "../_head.ts";
import { type Command, flag, type FlagTable, runCommand, whole } from "../../lib/cli.ts";
import { LAUNCHER_FLAGS } from "../../lib/launch/grants.ts";
import { INSPECTOR, LiveMemory } from "./live_memory.ts";
import {
  freePort,
  type LoggedProcess,
  PROJECT_ROOT,
  startLogged,
  startWorker,
  type WorkerProcess,
} from "../_workers.ts";

export interface DrillOptions {
  readonly kills: number;
  /** Clients streaming at once, each one request after another. Default 3. */
  readonly clients?: number;
  /** Seeds the choice of requests and the time between kills. Default 1. */
  readonly seed?: number;
  readonly log?: (line: string) => void;
}

export interface DrillReport {
  readonly kills: number;
  readonly clients: number;
  readonly requests: number;
  /** Completed byte-identical to the reference. */
  readonly identical: number;
  /** Refused with a typed error before the stream began (the worker was down). */
  readonly refused: number;
  /** Ended with a typed error event after a prefix of the reference: the errors' messages. */
  readonly cut: readonly string[];
  /** Anything else, each with what went wrong. */
  readonly failures: readonly string[];
  /** Sequences the head resumed after losing the worker (its /metrics). */
  readonly resumes: number;
  /**
   * Bytes the head's isolates hold after a full collection (live_memory.ts), after the warm-up
   * and after the last kill, with its streams finished: a leak shows as growth here.
   */
  readonly liveStart: number;
  readonly liveEnd: number;
  /**
   * The head's open file descriptors after the warm-up and at the end: a connection to a killed
   * worker that is never closed shows here. (Its resident size is no measure of a leak: V8
   * commits heap and malloc keeps freed buffers as they see fit, 30% more over 300 kills with the
   * live memory flat, so the drill only logs it.)
   */
  readonly filesStart: number;
  readonly filesEnd: number;
  /** The head process ran from start to end (it never died or restarted). */
  readonly headAlive: boolean;
  readonly seconds: number;
}

interface DrillRequest {
  readonly path: string;
  readonly body: Record<string, unknown>;
}

const user = (content: string) => [{ role: "user", content }];
/**
 * Greedy and seeded sampling (OpenAI's and llama.cpp's `seed`), 16 tokens each; the raw
 * /completion prompts are short, so that the replays after each kill stay cheap.
 */
const REQUESTS: readonly DrillRequest[] = [
  {
    path: "/v1/messages",
    body: { model: "m", max_tokens: 16, temperature: 0, messages: user("Hi") },
  },
  {
    path: "/v1/chat/completions",
    body: { model: "m", max_tokens: 16, temperature: 0.9, seed: 11, messages: user("A poem") },
  },
  {
    path: "/completion",
    body: { prompt: "Once upon a time", n_predict: 16, temperature: 0, seed: 1 },
  },
  { path: "/completion", body: { prompt: "The sea", n_predict: 16, temperature: 0.9, seed: 4 } },
].map((r) => ({ path: r.path, body: { stream: true, ...r.body } }));

const CTX = 256;
const HEAD_SLOTS = 3;

/** SplitMix32-style steps: small, seeded, enough to vary timing and choices reproducibly. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return ((z ^ (z >>> 16)) >>> 0) / 2 ** 32;
  };
}

/**
 * The comparable form of a stream: comparableSse, without the prompt-cache counts (they depend
 * on what an earlier request left in the cache, and a restart emptied) and /completion's timings.
 */
function normalized(body: string): string {
  return comparableSse(body)
    .replace(
      /"(input_tokens|cache_read_input_tokens|cache_creation_input_tokens|cached_tokens|tokens_cached)":\d+/g,
      '"$1":0',
    )
    .replace(/"timings":\{[^}]*\}/g, '"timings":{}');
}

/** A frame line of `normalized`: "event|data", the event "null" for OpenAI's unnamed frames. */
function frameOf(line: string): { event: string; body: unknown } {
  const sep = line.indexOf("|");
  const data = line.slice(sep + 1);
  let body: unknown;
  try {
    body = JSON.parse(data);
  } catch {
    body = data; // OpenAI's [DONE].
  }
  return { event: line.slice(0, sep), body };
}

/**
 * The message of a typed error frame: Anthropic's `event: error`, or an unnamed frame holding
 * `error` with a type (OpenAI, llama.cpp); undefined for any other frame.
 */
function typedError(line: string): string | undefined {
  const { event, body } = frameOf(line);
  const b = body as { type?: unknown; error?: { type?: unknown; message?: unknown } };
  const typed = typeof b?.error?.type === "string" && typeof b.error.message === "string" &&
    (event === "error" ? b.type === "error" : event === "null");
  return typed ? `${b.error!.type}: ${b.error!.message}` : undefined;
}

/** The generated text of a normalized stream (Anthropic, OpenAI or llama.cpp frames). */
function textOf(lines: readonly string[]): string {
  return lines.map((line) => {
    const { body } = frameOf(line);
    const b = body as {
      delta?: { text?: string };
      choices?: { delta?: { content?: string } }[];
      content?: string;
    };
    return b?.delta?.text ?? b?.choices?.[0]?.delta?.content ?? b?.content ?? "";
  }).join("");
}

/** Resident set size of process `pid`, bytes (Linux). */
async function rssOf(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(status);
  if (!kb) throw new Error(`Cannot read the resident size of process ${pid}`);
  return Number(kb[1]) * 1024;
}

/** File descriptors process `pid` has open (Linux). */
function openFiles(pid: number): number {
  return [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
}

/** The head's log line that says where it serves. */
const SERVING = /serving \S+ at (http:\/\/[^\s:]+:\d+)/;

/**
 * `main.ts` as its own process, started as `deno task head` starts it (with its inspector open,
 * for LiveMemory): split after layer 2, reference backend, on a free port.
 */
function startHeadProcess(model: string, next: string): Promise<LoggedProcess> {
  return startLogged([
    "run",
    ...LAUNCHER_FLAGS,
    `--inspect=127.0.0.1:${freePort()}`,
    `${PROJECT_ROOT}/main.ts`,
    ...["--model", model, "--layers", "0:2", "--next", next, "--backend", "reference"],
    ...["--port", "0", "--slots", String(HEAD_SLOTS), "--queue", "8", "--ctx", String(CTX)],
    ...["--snapshots", "4", "--restart-grace-s", "10"],
  ], SERVING);
}

/** Frames the clients have received: the kill loop paces itself by them. */
class FrameCount {
  #count = 0;
  #waiter: { readonly at: number; readonly resolve: () => void } | undefined;

  get value(): number {
    return this.#count;
  }

  add(n: number): void {
    this.#count += n;
    if (this.#waiter && this.#count >= this.#waiter.at) {
      this.#waiter.resolve();
      this.#waiter = undefined;
    }
  }

  /** Resolves once the count reaches `at`; throws when that takes longer than `ms`. */
  async reach(at: number, ms: number): Promise<void> {
    if (this.#count >= at) return;
    const reached = Promise.withResolvers<void>();
    this.#waiter = { at, resolve: reached.resolve };
    const timer = setTimeout(
      () => reached.reject(new Error(`The streams made no progress for ${ms} ms`)),
      ms,
    );
    try {
      await reached.promise;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** One request and how it ended, checked against its reference. */
async function exchange(
  url: string,
  request: DrillRequest,
  reference: string,
  frames?: FrameCount,
): Promise<"identical" | "refused" | { cut: string } | string> {
  const res = await post(`${url}${request.path}`, request.body);
  if (res.status !== 200) {
    const body = await res.json().catch(() => undefined);
    const typed = (res.status === 503 || res.status === 529) &&
      typeof body?.error?.type === "string";
    return typed ? "refused" : `status ${res.status}: ${JSON.stringify(body)}`;
  }
  let body = "";
  for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
    body += chunk;
    frames?.add(chunk.split("\n\n").length - 1);
  }
  const got = normalized(body);
  if (got === reference) return "identical";
  // Cut short: a typed error after text that starts the reference's text. (The frames
  // themselves may differ: the last text is released and the block closed before the error.)
  // An OpenAI stream closes with [DONE] after its error chunk, as after a normal end.
  const lines = got.split("\n");
  const closed = request.path !== "/v1/chat/completions" || lines.pop() === "null|[DONE]";
  const error = typedError(lines.at(-1)!);
  if (closed && error !== undefined && textOf(reference.split("\n")).startsWith(textOf(lines))) {
    return { cut: error };
  }
  return `${request.path} ${JSON.stringify(request.body)} differs from its reference:\n` +
    `got:  ${got}\nwant: ${reference}`;
}

/** Runs the drill: `kills` worker kills under `clients` streaming clients. */
export async function runKillDrill(options: DrillOptions): Promise<DrillReport> {
  if (!Number.isInteger(options.kills) || options.kills < 1) {
    throw new RangeError(`Cannot drill ${options.kills} kills: give a whole number, 1 or more`);
  }
  const log = options.log ?? (() => undefined);
  const clients = options.clients ?? 3;
  const next = random(options.seed ?? 1);
  const model = await tinyModel();
  const port = freePort();
  const startOurWorker = () =>
    startWorker({ model, layers: "2:4", port, slots: HEAD_SLOTS, ctx: CTX, snapshots: 4 });
  let worker: WorkerProcess = await startOurWorker();
  const head = await startHeadProcess(model, worker.address);
  const url = SERVING.exec(head.log())![1];
  const memory = await LiveMemory.connect(INSPECTOR.exec(head.log())![1]);
  let headAlive = true;
  head.child.status.then(() => headAlive = false);
  const t0 = performance.now();
  const outcomes = { identical: 0, refused: 0 };
  const cut: string[] = [];
  const failures: string[] = [];
  try {
    const references: string[] = [];
    for (const request of REQUESTS) {
      const res = await post(`${url}${request.path}`, request.body);
      references.push(normalized(await res.text()));
    }
    // Warm-up: every request once more, so the baseline holds what a running head holds.
    for (const [i, request] of REQUESTS.entries()) {
      const outcome = await exchange(url, request, references[i]);
      if (outcome !== "identical") throw new Error(`the warm-up run differs: ${outcome}`);
    }
    const liveStart = await memory.bytes();
    const filesStart = openFiles(head.child.pid);
    let stopping = false;
    const frames = new FrameCount();
    const streams = Array.from({ length: clients }, async () => {
      while (!stopping) {
        const i = Math.floor(next() * REQUESTS.length);
        const outcome = await exchange(url, REQUESTS[i], references[i], frames);
        if (typeof outcome === "object") cut.push(outcome.cut);
        else if (outcome === "identical" || outcome === "refused") outcomes[outcome]++;
        else failures.push(outcome);
        // As a client honouring retry-after would, only sooner: the drill wants load.
        if (outcome === "refused") await new Promise((r) => setTimeout(r, 100));
      }
    });
    for (let k = 0; k < options.kills; k++) {
      // Kill once the streams have moved on by a few frames (about a token each) since the last
      // restart: every kill then meets generation in progress, and every restart is followed
      // by progress. None for a long while means the head hangs.
      await frames.reach(frames.value + 2 + Math.floor(next() * 10), 30_000);
      worker.child.kill("SIGKILL");
      await worker.stop();
      // Sometimes the worker stays down a while, so that new requests meet it down.
      if (next() < 0.3) await new Promise((r) => setTimeout(r, next() * 300));
      worker = await startOurWorker();
      const rss = await rssOf(head.child.pid);
      log(
        `kill ${k + 1}/${options.kills}: ${outcomes.identical} identical, ${outcomes.refused} ` +
          `refused, ${cut.length} cut, ${failures.length} failed; head rss ${
            (rss / 2 ** 20).toFixed(1)
          } MiB`,
      );
    }
    stopping = true;
    await Promise.all(streams);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const liveEnd = await memory.bytes();
    const filesEnd = openFiles(head.child.pid);
    const resumes = /^tandem_sequence_resumes_total (\d+)$/m.exec(metrics);
    return {
      kills: options.kills,
      clients,
      requests: outcomes.identical + outcomes.refused + cut.length + failures.length,
      ...outcomes,
      cut,
      failures,
      resumes: resumes ? Number(resumes[1]) : NaN,
      liveStart,
      liveEnd,
      filesStart,
      filesEnd,
      headAlive,
      seconds: (performance.now() - t0) / 1000,
    };
  } finally {
    memory.close();
    await head.stop();
    await worker.stop();
  }
}

/** What the drill must show, as a list of what went wrong: empty when it passed. */
export function drillProblems(report: DrillReport): string[] {
  const problems = [...report.failures];
  if (!report.headAlive) problems.push("the head process died");
  if (report.liveEnd > report.liveStart * 1.1) {
    problems.push(
      `the head's live memory grew from ${report.liveStart} to ${report.liveEnd} bytes, more than 10%`,
    );
  }
  // Each client's kept-alive connection may be open at one point and not at the other.
  if (report.filesEnd > report.filesStart + report.clients) {
    problems.push(
      `the head's open files went from ${report.filesStart} to ${report.filesEnd}: it leaks them`,
    );
  }
  if (report.identical === 0) problems.push("no request completed");
  // A kill waits for frames, so streams are mid-generation at nearly every one.
  if (report.resumes < report.kills / 2) {
    problems.push(`only ${report.resumes} resumes in ${report.kills} kills: kills missed the load`);
  }
  return problems;
}

export const DRILL = {
  name: "Drill",
  usage: "deno task drill",
  about: "SIGKILLs a worker again and again while streaming clients use the head in front of it " +
    "(the tiny test model, split after layer 2), and prints a JSON report. Exits 1 when a request " +
    "was neither byte-identical to its reference nor ended with a typed error, the head died, " +
    "its live memory grew more than 10% or it kept more files open.",
  flags: {
    kills: flag(whole(1), "worker kills", 100),
    clients: flag(whole(1, 64), "clients streaming at once", 3),
    seed: flag(whole(0), "seeds the choice of requests and the time between kills", 1),
  },
} satisfies Command<FlagTable>;

if (import.meta.main) {
  await runCommand(DRILL, async (flags) => {
    const report = await runKillDrill({ ...flags, log: (line) => console.error(line) });
    console.log(JSON.stringify(report, null, 2));
    const problems = drillProblems(report);
    for (const p of problems) console.error(`drill: ${p}`);
    if (problems.length > 0) Deno.exit(1);
  });
}
