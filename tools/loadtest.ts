// `deno task loadtest`: N concurrent clients stream requests from a head and report time to first
// token, the gaps between tokens and output tokens/s, per client and overall. Run by bench/ too.
//
// /v1/messages streams text only (a token without visible text sends nothing), so its gaps are
// between pieces of text; /completion sends every token as an event, so its gaps are the tokens'.

import {
  type Command,
  decimal,
  ENGINE_FLAGS,
  engineChoice,
  flag,
  type FlagTable,
  oneOf,
  runCommand,
  switchFlag,
  text,
  UsageError,
  whole,
} from "../lib/cli.ts";
import { startHead } from "../lib/server/head.ts";
import { type LoadFigure, median, percentile } from "../bench/measure.ts";

export const ROUTES = ["/v1/messages", "/completion"] as const;
export type Route = typeof ROUTES[number];

const LOADTEST = {
  name: "Loadtest",
  usage: "deno task loadtest",
  about: "Runs --clients concurrent clients, each sending --requests streamed requests one after " +
    "another, and reports time to first token (TTFT), the gaps between tokens and decode tokens/s " +
    "per client and overall. Targets --url, or starts a head on --model itself.",
  flags: {
    url: flag(text("URL"), "a running head, e.g. http://127.0.0.1:8080"),
    model: flag(text("PATH"), "start a head on this GGUF instead of using --url"),
    clients: flag(whole(1, 1024), "concurrent clients", 4),
    requests: flag(whole(1), "requests per client", 2),
    "max-tokens": flag(whole(1), "max_tokens (n_predict) of each request", 64),
    route: flag(
      oneOf(ROUTES),
      "/v1/messages (gaps between pieces of text), or /completion (every token an event)",
      "/v1/messages",
    ),
    prompt: flag(text(), "the user message (each client appends its number)", "Tell me a story"),
    temperature: flag(decimal(0, 2), "sampling temperature; 0 is greedy", 0),
    seed: flag(whole(0), "seed of the first request; each request adds its number", 1),
    "ignore-eos": switchFlag("/completion: ban end-of-generation tokens, so every reply is full"),
    "api-key-file": flag(text("PATH"), "a file holding the head's API key"),
    slots: flag(whole(1), "slots of the started head", 4),
    ctx: flag(whole(1), "context of the started head", 2048),
    json: switchFlag("print the report as JSON"),
    ...ENGINE_FLAGS,
  },
} satisfies Command<FlagTable>;

/** One streamed request. */
export interface RequestSpec {
  readonly route: Route;
  /** /v1/messages: the user message; /completion: text or token ids, taken as they are. */
  readonly prompt: string | readonly number[];
  readonly maxTokens: number;
  /** 0 is greedy. */
  readonly temperature: number;
  readonly topP?: number;
  readonly topK?: number;
  readonly seed?: number;
  /** /completion only: end-of-generation tokens are banned, so the reply runs to maxTokens. */
  readonly ignoreEos?: boolean;
}

/** The JSON body of a streamed request to its route. */
export function requestBody(spec: RequestSpec): Record<string, unknown> {
  const sampling = {
    temperature: spec.temperature,
    ...(spec.topP === undefined ? {} : { top_p: spec.topP }),
    ...(spec.topK === undefined ? {} : { top_k: spec.topK }),
    ...(spec.seed === undefined ? {} : { seed: spec.seed }),
  };
  if (spec.route === "/completion") {
    return {
      prompt: spec.prompt,
      n_predict: spec.maxTokens,
      stream: true,
      ...sampling,
      ...(spec.ignoreEos ? { ignore_eos: true } : {}),
    };
  }
  if (typeof spec.prompt !== "string") {
    throw new TypeError("Cannot send token ids to /v1/messages: its content is text");
  }
  if (spec.ignoreEos) throw new TypeError("Cannot ignore end of generation on /v1/messages");
  return {
    model: "loadtest",
    max_tokens: spec.maxTokens,
    stream: true,
    messages: [{ role: "user", content: spec.prompt }],
    ...sampling,
  };
}

/** One streamed reply as its client saw it, in performance.now() milliseconds. */
export interface StreamTimes {
  readonly sentMs: number;
  /**
   * When each event with output came: /completion's token events (one a token), /v1/messages'
   * content deltas (one a piece of text).
   */
  readonly eventMs: readonly number[];
  readonly endMs: number;
  /** Output tokens the head reported at the end. */
  readonly outputTokens: number;
}

export interface StreamOptions {
  readonly apiKey?: string;
  /** Aborting it ends the request: the promise rejects with the signal's reason. */
  readonly signal?: AbortSignal;
  /** Called at each event with output, with its time (as it goes into eventMs). */
  readonly onEvent?: (ms: number) => void;
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
      if (data.length) {
        yield { event, data: JSON.parse(data.join("\n")) as Record<string, unknown> };
      }
    }
  }
}

/** Sends one streamed request and times its events; throws when the head answers an error. */
export async function streamRequest(
  url: string,
  spec: RequestSpec,
  options: StreamOptions = {},
): Promise<StreamTimes> {
  const sentMs = performance.now();
  const res = await fetch(`${url}${spec.route}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(options.apiKey ? { "x-api-key": options.apiKey } : {}),
    },
    body: JSON.stringify(requestBody(spec)),
    signal: options.signal,
  });
  if (!res.ok || !res.body) {
    throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`);
  }
  const eventMs: number[] = [];
  let outputTokens = NaN;
  const seen = () => {
    const ms = performance.now();
    eventMs.push(ms);
    options.onEvent?.(ms);
  };
  for await (const { event, data } of sseEvents(res.body)) {
    if (event === "error" || "error" in data) {
      throw new Error(`stream error: ${JSON.stringify(data).slice(0, 300)}`);
    }
    if (spec.route === "/v1/messages") {
      if (event === "content_block_delta") seen();
      const usage = data.usage as { output_tokens?: number } | undefined;
      if (event === "message_delta") outputTokens = Number(usage?.output_tokens);
    } else if (data.stop === true) {
      outputTokens = Number(data.tokens_predicted);
    } else if (Array.isArray(data.tokens)) {
      seen();
    }
  }
  const endMs = performance.now();
  if (!(outputTokens >= 1)) throw new Error(`the reply reported ${outputTokens} output tokens`);
  return { sentMs, eventMs, endMs, outputTokens };
}

/** One streamed request as the load saw it. */
export interface RequestTiming {
  /** ms from sending the request to its first event with output (its end when none came). */
  readonly ttftMs: number;
  /** ms from sending to the end of the stream. */
  readonly totalMs: number;
  /** Output tokens the head reported. */
  readonly tokens: number;
  /** Tokens after the first per second of the time after it; NaN for a single token. */
  readonly tokensPerSecond: number;
  /** ms between consecutive tokens, on /completion; empty on /v1/messages (text, not tokens). */
  readonly gapsMs: readonly number[];
}

/** A reply's timing from its stream's times. */
export function requestTiming(route: Route, t: StreamTimes): RequestTiming {
  // A reply whose only token has no text (/v1/messages) sends nothing before its end.
  const first = t.eventMs[0] ?? t.endMs;
  const gapsMs = route === "/completion"
    ? t.eventMs.slice(1).map((ms, i) => ms - t.eventMs[i])
    : [];
  return {
    ttftMs: first - t.sentMs,
    totalMs: t.endMs - t.sentMs,
    tokens: t.outputTokens,
    tokensPerSecond: t.outputTokens > 1 ? (t.outputTokens - 1) / ((t.endMs - first) / 1000) : NaN,
    gapsMs,
  };
}

export interface LoadOptions {
  readonly url: string;
  readonly clients: number;
  readonly requests: number;
  /** Every request's; a text prompt gets its client's number appended, a seed the request's. */
  readonly request: RequestSpec;
  readonly apiKey?: string;
}

export interface ClientReport {
  readonly client: number;
  readonly timings: readonly RequestTiming[];
  /** Each failed request: HTTP status and message, or the stream's error event. */
  readonly errors: readonly string[];
}

export interface LoadReport {
  readonly route: Route;
  readonly clients: readonly ClientReport[];
  readonly wallMs: number;
  /** All output tokens over the wall time of the whole run. */
  readonly totalTokensPerSecond: number;
  /** Median over every reply's first token (NaN when none came back). */
  readonly ttftP50Ms: number;
  /** 99th percentile over every gap between tokens (NaN on /v1/messages). */
  readonly gapP99Ms: number;
}

/** Runs the load: every client sends its requests one after another, all clients at once. */
export async function runLoad(options: LoadOptions): Promise<LoadReport> {
  const { request } = options;
  const t0 = performance.now();
  const clients = await Promise.all(
    Array.from({ length: options.clients }, async (_, client) => {
      const timings: RequestTiming[] = [];
      const errors: string[] = [];
      for (let r = 0; r < options.requests; r++) {
        const spec: RequestSpec = {
          ...request,
          prompt: typeof request.prompt === "string"
            ? `${request.prompt} (client ${client})`
            : request.prompt,
          seed: request.seed === undefined
            ? undefined
            : request.seed + client * options.requests + r,
        };
        try {
          const times = await streamRequest(options.url, spec, { apiKey: options.apiKey });
          timings.push(requestTiming(request.route, times));
        } catch (e) {
          errors.push((e as Error).message);
        }
      }
      return { client, timings, errors };
    }),
  );
  const wallMs = performance.now() - t0;
  const all = clients.flatMap((c) => c.timings);
  const tokens = all.reduce((n, t) => n + t.tokens, 0);
  const gaps = all.flatMap((t) => t.gapsMs);
  return {
    route: request.route,
    clients,
    wallMs,
    totalTokensPerSecond: tokens / (wallMs / 1000),
    ttftP50Ms: all.length ? median(all.map((t) => t.ttftMs)) : NaN,
    gapP99Ms: gaps.length ? percentile(gaps, 0.99) : NaN,
  };
}

/** The run's figure under load; throws when a request failed, which would make it flattering. */
export function loadFigure(report: LoadReport): LoadFigure {
  const errors = report.clients.flatMap((c) => c.errors);
  if (errors.length) {
    const sent = errors.length + report.clients.reduce((n, c) => n + c.timings.length, 0);
    throw new Error(`${errors.length} of ${sent} requests failed; the first: ${errors[0]}`);
  }
  return {
    clients: report.clients.length,
    aggregateTokPerS: report.totalTokensPerSecond,
    ttftP50Ms: report.ttftP50Ms,
    gapP99Ms: report.gapP99Ms,
  };
}

/** The report as a table: one row per client, then the whole run. */
export function formatReport(report: LoadReport): string {
  const ms = (x: number) => (Number.isNaN(x) ? "—" : x.toFixed(0)).padStart(9);
  const row = (name: string, timings: readonly RequestTiming[], errors: number) => {
    const ttft = timings.map((t) => t.ttftMs);
    const gaps = timings.flatMap((t) => t.gapsMs);
    const rates = timings.map((t) => t.tokensPerSecond).filter((x) => !Number.isNaN(x));
    const mean = rates.reduce((a, b) => a + b, 0) / rates.length;
    return [
      name.padEnd(8),
      String(timings.length).padStart(4),
      String(errors).padStart(6),
      ms(ttft.length ? median(ttft) : NaN),
      ms(ttft.length ? Math.max(...ttft) : NaN),
      ms(gaps.length ? percentile(gaps, 0.99) : NaN),
      mean.toFixed(1).padStart(9),
    ].join(" ");
  };
  const all = report.clients.flatMap((c) => c.timings);
  const errors = report.clients.flatMap((c) => c.errors);
  const heads = ["TTFT p50", "TTFT max", "gap p99", "tok/s"].map((h) => h.padStart(9));
  return [
    [`${"client".padEnd(8)}`, "ok".padStart(4), "errors".padStart(6), ...heads].join(" "),
    ...report.clients.map((c) => row(String(c.client), c.timings, c.errors.length)),
    row("all", all, errors.length),
    `${report.route}: wall ${(report.wallMs / 1000).toFixed(1)} s, ${
      report.totalTokensPerSecond.toFixed(1)
    } output tokens/s in all (TTFT and gaps between tokens in ms; tok/s = decode rate after ` +
    "the first token; /v1/messages has no gaps, its events are pieces of text)",
    ...errors.slice(0, 5).map((e) => `error: ${e}`),
  ].join("\n");
}

if (import.meta.main) {
  await runCommand(LOADTEST, async (flags) => {
    if (!flags.url === !flags.model) throw new UsageError("Give exactly one of --url and --model");
    if (flags["ignore-eos"] && flags.route !== "/completion") {
      throw new UsageError("--ignore-eos needs --route /completion");
    }
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
        request: {
          route: flags.route,
          prompt: flags.prompt,
          maxTokens: flags["max-tokens"],
          temperature: flags.temperature,
          seed: flags.seed,
          ignoreEos: flags["ignore-eos"] || undefined,
        },
        apiKey,
      });
      console.log(flags.json ? JSON.stringify(report, null, 2) : formatReport(report));
    } finally {
      await head?.close();
    }
  });
}
