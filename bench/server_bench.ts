// Figures through the server as users see them: a head (main.ts, unsplit, then split over a
// worker) answering /v1/messages and /completion streams; first token and decode tok/s per request.
// Run by bench/decode.ts after the engine figures; the head and worker are child processes.

import { openGguf } from "../engine/gguf/read.ts";
import { readHParams } from "../engine/hparams.ts";
import { PromptBuilder } from "../lib/server/prompt.ts";
import { TokenizerThread } from "../lib/tokenizer/tokenizer_thread.ts";
import { type Deadline, type Figure, OutOfTime, timingOf } from "./measure.ts";
import { layersName, startServing } from "./split.ts";
import { requestTiming, streamRequest } from "../tools/loadtest.ts";

export interface ServerBenchOptions {
  readonly model: string;
  readonly backend: string;
  readonly gpu: string;
  /** Prompt length in tokens (after the chat template), at most. */
  readonly promptTokens: number;
  /** max_tokens of each request. */
  readonly maxTokens: number;
  /** Layer where the head ends and the worker begins for the split; undefined: unsplit only. */
  readonly split?: number;
  readonly runs: number;
  readonly deadline: Deadline;
  readonly log: (line: string) => void;
}

/** One kind of request, timed over the runs: first token, then the tokens after it. */
export interface ServerFigure {
  /** Seconds from sending the request to the first streamed token; tokens = prompt tokens. */
  readonly ttft: Figure;
  /**
   * Seconds per output token after the first, of the replies longer than one token; an error on
   * /v1/messages, whose stream does not say how many tokens came before its first text.
   */
  readonly decode: Figure;
}

export interface ServerMode {
  /** "0:40" unsplit, "0:20 + 20:40" split. */
  readonly layers: string;
  /** Seconds until the head served (the worker's start included for the split). */
  readonly startSeconds?: number;
  /** The figures of each route. */
  readonly routes?: readonly ServerRoute[];
  readonly error?: string;
}

/** One route's figures, greedy and sampled. */
export interface ServerRoute {
  /**
   * "/v1/messages": the first token is the first text delta, so tokens without visible text
   * (a random model's most) are not seen. "/completion": every token is an event of its own.
   */
  readonly route: "/v1/messages" | "/completion";
  /** temperature 0. */
  readonly greedy: ServerFigure;
  /** temperature 0.7, top_p 0.9. */
  readonly sampled: ServerFigure;
}

export interface ServerReport {
  readonly backend: string;
  readonly gpu: string;
  readonly promptTokens: number;
  readonly maxTokens: number;
  readonly modes: readonly ServerMode[];
}

/** One streamed reply, timed. */
export interface StreamTiming {
  readonly ttftSeconds: number;
  /** Tokens the reply reported (usage.output_tokens). */
  readonly outputTokens: number;
  /** Seconds from the first streamed token to the end of the stream. */
  readonly afterFirstSeconds: number;
}

const WORDS = ("the river keeps its own counsel and stones remember every flood while lanterns " +
  "drift past quiet harbours where old sailors mend nets beneath a patient sky").split(" ");

/**
 * User text whose chat prompt (the model's template, as the head renders it) is as long as
 * possible without passing `tokens`; and that length.
 */
export async function promptOfLength(
  prompts: PromptBuilder,
  tokens: number,
): Promise<{ text: string; tokens: number; ids: number[] }> {
  const text = (n: number) => Array.from({ length: n }, (_, i) => WORDS[(i * 7) % WORDS.length]);
  const build = (n: number) =>
    prompts.build({
      messages: [{ role: "user", content: text(n).join(" ") }],
      tools: [],
      toolChoice: { type: "auto" },
      thinking: false,
    });
  const length = async (n: number) => (await build(n)).tokens;
  let lo = 1;
  let hi = 1;
  while (await length(hi) <= tokens) hi *= 2;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (await length(mid) <= tokens) lo = mid;
    else hi = mid;
  }
  const built = await build(lo);
  return { text: text(lo).join(" "), tokens: built.tokens, ids: built.ids };
}

type Sampling = { readonly temperature: number; readonly top_p?: number };

/** The bench's prompt: the user text, and the ids the chat template makes of it. */
export interface BenchPrompt {
  readonly text: string;
  readonly ids: readonly number[];
}

/**
 * POSTs one streaming request to `route` and times its reply: /v1/messages gets the prompt's text
 * (the head applies the template), /completion the same ids (no template, no tokenizing).
 */
export async function timeStream(
  url: string,
  route: ServerRoute["route"],
  prompt: BenchPrompt,
  maxTokens: number,
  sampling: Sampling,
): Promise<StreamTiming> {
  const times = await streamRequest(url, {
    route,
    prompt: route === "/completion" ? prompt.ids : prompt.text,
    maxTokens,
    temperature: sampling.temperature,
    topP: sampling.top_p,
  });
  const t = requestTiming(route, times);
  return {
    ttftSeconds: t.ttftMs / 1000,
    outputTokens: t.tokens,
    afterFirstSeconds: (t.totalMs - t.ttftMs) / 1000,
  };
}

/** Why a /v1/messages figure has no pace. */
const UNPACED = "not measured on /v1/messages: a stream of text does not say how many tokens " +
  "came before its first text (most of the bench model's tokens have none); see /completion";

/** One warm-up, then `runs` timed requests (fewer when the deadline comes). */
async function figure(
  time: () => Promise<StreamTiming>,
  route: ServerRoute["route"],
  promptTokens: number,
  options: ServerBenchOptions,
  name: string,
): Promise<ServerFigure> {
  const { deadline, log } = options;
  try {
    if (deadline.left <= 0) throw new OutOfTime("no time left for a warm-up");
    const warm = await time();
    const each = warm.ttftSeconds + warm.afterFirstSeconds;
    const runs = Math.min(options.runs, Math.floor(deadline.left / Math.max(each, 1e-6)));
    if (runs < 1) throw new OutOfTime(`the warm-up took ${each.toFixed(1)} s`);
    const timed: StreamTiming[] = [];
    for (let i = 0; i < runs; i++) {
      timed.push(await time());
    }
    const ttft = timingOf(timed.map((t) => t.ttftSeconds));
    if (route === "/v1/messages") {
      // Its first text may come with any token, so the tokens after it are unknown.
      log(`${name}: first text ${(ttft.median * 1000).toFixed(0)} ms, median of ${runs}`);
      return {
        ttft: { tokens: promptTokens, timing: ttft },
        decode: { tokens: 1, error: UNPACED },
      };
    }
    // A reply that ended at its first token (sampled end of turn) has no pace to give.
    const paced = timed.filter((t) => t.outputTokens > 1);
    if (paced.length === 0) throw new Error("every reply ended at its first token");
    const perToken = timingOf(paced.map((t) => t.afterFirstSeconds / (t.outputTokens - 1)));
    log(
      `${name}: first token ${(ttft.median * 1000).toFixed(0)} ms, ${
        (1 / perToken.median).toFixed(1)
      } tok/s after it, median of ${runs}`,
    );
    return {
      ttft: { tokens: promptTokens, timing: ttft },
      decode: { tokens: 1, timing: perToken },
    };
  } catch (e) {
    const error = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
    log(`${name}: ${error}`);
    return { ttft: { tokens: promptTokens, error }, decode: { tokens: 1, error } };
  }
}

/** The bench's chat prompt of a model, and the model's layers and vocabulary. */
export interface ModelPrompt {
  readonly prompt: BenchPrompt & { readonly tokens: number };
  readonly nLayer: number;
  readonly vocab: number;
}

/** The longest user text whose chat prompt (the model's own template) fits `tokens`. */
export async function benchPrompt(path: string, tokens: number): Promise<ModelPrompt> {
  const model = await openGguf(path);
  try {
    const template = model.metadata.get("tokenizer.chat_template");
    if (typeof template !== "string") {
      throw new TypeError(`Cannot bench the server on "${path}": it has no chat template`);
    }
    const thread = await TokenizerThread.start(model.metadata, template);
    try {
      const prompt = await promptOfLength(new PromptBuilder(thread, tokens), tokens);
      const hp = readHParams(model.metadata);
      return { prompt, nLayer: hp.nLayer, vocab: hp.V };
    } finally {
      thread.close();
    }
  } finally {
    model.close();
  }
}

/** The head unsplit, then split at options.split over a worker; one greedy and one sampled figure. */
export async function benchServer(options: ServerBenchOptions): Promise<ServerReport> {
  const { prompt, nLayer } = await benchPrompt(options.model, options.promptTokens);
  const modes: ServerMode[] = [];
  const layouts = [undefined, ...(options.split === undefined ? [] : [options.split])];
  for (const split of layouts) {
    const layers = layersName(nLayer, split);
    let serving;
    try {
      serving = await startServing({
        ...options,
        // One request at a time needs one slot; given to both, since the worker must have at
        // least the head's and the head's own default (DEFAULT_SLOTS) is more.
        slots: 1,
        ctx: prompt.tokens + options.maxTokens + 16,
        nLayer,
        split,
        startTimeoutS: Math.min(Math.max(options.deadline.left, 1), 900),
      });
      const routes: ServerRoute[] = [];
      for (const route of ["/v1/messages", "/completion"] as const) {
        const url = serving.url;
        const run = (sampling: Sampling, what: string) =>
          figure(
            () => timeStream(url, route, prompt, options.maxTokens, sampling),
            route,
            prompt.tokens,
            options,
            `server ${layers} ${route} ${what}`,
          );
        const greedy = await run({ temperature: 0 }, "greedy");
        const sampled = await run({ temperature: 0.7, top_p: 0.9 }, "temperature 0.7");
        routes.push({ route, greedy, sampled });
      }
      modes.push({ layers, startSeconds: serving.startSeconds, routes });
    } catch (e) {
      options.log(`server ${layers}: ${(e as Error).message}`);
      modes.push({ layers, error: (e as Error).message });
    } finally {
      await serving?.stop();
    }
  }
  return {
    backend: options.backend,
    gpu: options.gpu,
    promptTokens: prompt.tokens,
    maxTokens: options.maxTokens,
    modes,
  };
}
