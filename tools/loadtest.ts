// `deno task loadtest`: N concurrent clients stream /v1/messages from a head and report, per client
// and overall, time to first token and decode tokens/s. Against --url, or a head it starts itself.

import {
  type Command,
  ENGINE_FLAGS,
  engineChoice,
  flag,
  type FlagTable,
  runCommand,
  switchFlag,
  text,
  UsageError,
  whole,
} from "../lib/cli.ts";
import { startHead } from "../lib/server/head.ts";

const LOADTEST = {
  name: "Loadtest",
  usage: "deno task loadtest",
  about: "Runs --clients concurrent clients, each sending --requests streamed /v1/messages " +
    "requests one after another, and reports time to first token (TTFT) and decode tokens/s per " +
    "client and overall. Targets --url, or starts a head on --model itself.",
  flags: {
    url: flag(text("URL"), "a running head, e.g. http://127.0.0.1:8080"),
    model: flag(text("PATH"), "start a head on this GGUF instead of using --url"),
    clients: flag(whole(1, 1024), "concurrent clients", 4),
    requests: flag(whole(1), "requests per client", 2),
    "max-tokens": flag(whole(1), "max_tokens of each request", 64),
    prompt: flag(text(), "the user message (each client appends its number)", "Tell me a story"),
    "api-key-file": flag(text("PATH"), "a file holding the head's API key"),
    slots: flag(whole(1), "slots of the started head", 4),
    ctx: flag(whole(1), "context of the started head", 2048),
    json: switchFlag("print the report as JSON"),
    ...ENGINE_FLAGS,
  },
} satisfies Command<FlagTable>;

export interface LoadOptions {
  readonly url: string;
  readonly clients: number;
  readonly requests: number;
  readonly maxTokens: number;
  readonly prompt: string;
  readonly apiKey?: string;
}

/** One streamed request as the client saw it. */
export interface RequestTiming {
  /** ms from sending the request to the first text (or thinking or tool) delta. */
  readonly ttftMs: number;
  /** ms from sending to the end of the stream. */
  readonly totalMs: number;
  /** Output tokens the head reported (message_delta usage). */
  readonly tokens: number;
  /** Tokens after the first per second of the time after it; NaN for a single token. */
  readonly tokensPerSecond: number;
}

export interface ClientReport {
  readonly client: number;
  readonly timings: readonly RequestTiming[];
  /** Each failed request: HTTP status and message, or the stream's error event. */
  readonly errors: readonly string[];
}

export interface LoadReport {
  readonly clients: readonly ClientReport[];
  readonly wallMs: number;
  /** All output tokens over the wall time of the whole run. */
  readonly totalTokensPerSecond: number;
}

/** The events of an SSE body as they arrive: (event name, data) pairs. */
async function* sseEvents(body: ReadableStream<Uint8Array>) {
  let buffer = "";
  for await (const chunk of body.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    for (let end = buffer.indexOf("\n\n"); end !== -1; end = buffer.indexOf("\n\n")) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (event) yield { event, data: data.join("\n") };
    }
  }
}

/** Sends one streamed request; its timing, or why it failed. */
async function timeRequest(
  options: LoadOptions,
  content: string,
): Promise<RequestTiming | string> {
  const t0 = performance.now();
  const res = await fetch(`${options.url}/v1/messages`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(options.apiKey ? { "x-api-key": options.apiKey } : {}),
    },
    body: JSON.stringify({
      model: "loadtest",
      max_tokens: options.maxTokens,
      // Greedy, as before the head's default became 1: the fused decode path is what is timed.
      temperature: 0,
      stream: true,
      messages: [{ role: "user", content }],
    }),
  });
  if (!res.ok || !res.body) return `HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`;
  let first: number | undefined;
  let tokens = 0;
  for await (const { event, data } of sseEvents(res.body)) {
    if (event === "content_block_delta") first ??= performance.now();
    else if (event === "message_delta") tokens = JSON.parse(data).usage?.output_tokens ?? tokens;
    else if (event === "error") return `stream error: ${data.slice(0, 200)}`;
  }
  const end = performance.now();
  if (first === undefined) return "the stream carried no content";
  return {
    ttftMs: first - t0,
    totalMs: end - t0,
    tokens,
    tokensPerSecond: tokens > 1 ? (tokens - 1) / ((end - first) / 1000) : NaN,
  };
}

/** Runs the load: every client sends its requests one after another, all clients at once. */
export async function runLoad(options: LoadOptions): Promise<LoadReport> {
  const t0 = performance.now();
  const clients = await Promise.all(
    Array.from({ length: options.clients }, async (_, client) => {
      const timings: RequestTiming[] = [];
      const errors: string[] = [];
      for (let r = 0; r < options.requests; r++) {
        const result = await timeRequest(options, `${options.prompt} (client ${client})`)
          .catch((e) => `request failed: ${(e as Error).message}`);
        if (typeof result === "string") errors.push(result);
        else timings.push(result);
      }
      return { client, timings, errors };
    }),
  );
  const wallMs = performance.now() - t0;
  const tokens = clients.flatMap((c) => c.timings).reduce((n, t) => n + t.tokens, 0);
  return { clients, wallMs, totalTokensPerSecond: tokens / (wallMs / 1000) };
}

function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

/** The report as a table: one row per client, then the whole run. */
export function formatReport(report: LoadReport): string {
  const row = (name: string, timings: readonly RequestTiming[], errors: number) => {
    const ttft = timings.map((t) => t.ttftMs);
    const rates = timings.map((t) => t.tokensPerSecond).filter((x) => !Number.isNaN(x));
    const mean = rates.reduce((a, b) => a + b, 0) / rates.length;
    return [
      name.padEnd(8),
      String(timings.length).padStart(4),
      String(errors).padStart(6),
      percentile(ttft, 0.5).toFixed(0).padStart(9),
      Math.max(...ttft, NaN).toFixed(0).padStart(9),
      mean.toFixed(1).padStart(9),
    ].join(" ");
  };
  const all = report.clients.flatMap((c) => c.timings);
  const errors = report.clients.flatMap((c) => c.errors);
  return [
    `${"client".padEnd(8)} ${"ok".padStart(4)} ${"errors".padStart(6)} ${"TTFT p50".padStart(9)} ${
      "TTFT max".padStart(9)
    } ${"tok/s".padStart(9)}`,
    ...report.clients.map((c) => row(String(c.client), c.timings, c.errors.length)),
    row("all", all, errors.length),
    `wall ${(report.wallMs / 1000).toFixed(1)} s, ${
      report.totalTokensPerSecond.toFixed(1)
    } output tokens/s in all (TTFT in ms; tok/s = decode rate after the first token)`,
    ...errors.slice(0, 5).map((e) => `error: ${e}`),
  ].join("\n");
}

if (import.meta.main) {
  await runCommand(LOADTEST, async (flags) => {
    if (!flags.url === !flags.model) throw new UsageError("Give exactly one of --url and --model");
    const apiKey = flags["api-key-file"]
      ? (await Deno.readTextFile(flags["api-key-file"])).trim()
      : undefined;
    const head = flags.model
      ? await startHead({
        model: flags.model,
        port: 0,
        slots: flags.slots,
        ctx: flags.ctx,
        queue: flags.clients,
        engine: engineChoice(flags),
        log: () => {},
      })
      : undefined;
    try {
      const report = await runLoad({
        url: head?.url ?? flags.url!,
        clients: flags.clients,
        requests: flags.requests,
        maxTokens: flags["max-tokens"],
        prompt: flags.prompt,
        apiKey,
      });
      console.log(flags.json ? JSON.stringify(report, null, 2) : formatReport(report));
    } finally {
      await head?.close();
    }
  });
}
