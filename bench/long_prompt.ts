// The bench's long prompt beside live streams: while some replies decode, a long prompt arrives;
// the streams' p99 gap between tokens with and without it, and its first token against alone.
//
// Every request is a streamed /completion (each token an event), on one head with a slot for each
// stream and one for the long prompt, which goes in as seeded ids (no template) with n_predict 1.

import { BENCH_SAMPLING, type Deadline, OutOfTime, percentile, seededIds } from "./measure.ts";
import { benchPrompt } from "./server_bench.ts";
import { startServing } from "./split.ts";
import { type RequestSpec, streamRequest } from "../tools/loadtest.ts";

export interface LongPromptOptions {
  readonly model: string;
  readonly backend: string;
  readonly gpu: string;
  /** The streams' prompt, in tokens after the chat template, at most. */
  readonly promptTokens: number;
  /** The long prompt's tokens. */
  readonly longTokens: number;
  /** Replies decoding when it arrives. */
  readonly streams: number;
  /** Tokens every stream decodes after all have started, for the gaps without the long prompt. */
  readonly window: number;
  /** The head's --prefill-chunk; its default when undefined. */
  readonly prefillChunk?: number;
  /** The head's --prefill-step-ms; its default when undefined. */
  readonly prefillStepMs?: number;
  readonly seed: number;
  readonly deadline: Deadline;
  readonly log: (line: string) => void;
}

export interface LongPromptReport {
  readonly layers: string;
  readonly streams: number;
  readonly longTokens: number;
  readonly startSeconds?: number;
  /** ms from sending the long prompt to its first token, nothing else running (after a warm-up). */
  readonly ttftAloneMs?: number;
  /** The same while the streams decode. */
  readonly ttftBesideMs?: number;
  /** p99 of the streams' gaps between tokens over `window` tokens each before it arrived. */
  readonly gapP99WithoutMs?: number;
  /** p99 of the streams' gaps that overlap its span from sending to its first token. */
  readonly gapP99WithMs?: number;
  /** How many gaps each p99 is of. */
  readonly gapsWithout?: number;
  readonly gapsWith?: number;
  /** Why a figure is missing. */
  readonly error?: string;
}

/** Streams decoding in the background: each token's arrival, and waits on them. */
class LiveStreams {
  /** performance.now() ms of each stream's token events. */
  readonly times: number[][];
  readonly #abort = new AbortController();
  readonly #settled: Promise<void>[];
  #failure: Error | undefined;
  #wake = () => {};

  constructor(url: string, specs: readonly RequestSpec[]) {
    this.times = specs.map(() => []);
    this.#settled = specs.map(async (spec, i) => {
      try {
        await streamRequest(url, spec, {
          signal: this.#abort.signal,
          onEvent: (ms) => {
            this.times[i].push(ms);
            this.#wake();
          },
        });
        this.#failure ??= new Error(`stream ${i} ended after ${this.times[i].length} tokens`);
      } catch (e) {
        if (!this.#abort.signal.aborted) this.#failure ??= e as Error;
      }
      this.#wake();
    });
  }

  /** Resolves at the first arrival after which `ready` holds; rejects if a stream ends first. */
  until(ready: () => boolean, what: string, timeoutS: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => finish(new Error(`${what} took over ${timeoutS} s`)),
        timeoutS * 1000,
      );
      const finish = (error?: Error) => {
        clearTimeout(timer);
        this.#wake = () => {};
        if (error) reject(error);
        else resolve();
      };
      this.#wake = () => {
        if (this.#failure) finish(new Error(`Cannot wait until ${what}: ${this.#failure.message}`));
        else if (ready()) finish();
      };
      this.#wake();
    });
  }

  /** Every stream has a token after `ms`. */
  allAfter(ms: number): boolean {
    return this.times.every((t) => t.length > 0 && t[t.length - 1] > ms);
  }

  /** Ends every stream (the head sees its clients leave) and waits for them. */
  async stop(): Promise<void> {
    this.#abort.abort();
    await Promise.all(this.#settled);
  }
}

/** Gaps between consecutive tokens of each stream, [start, end] in ms, that `keep` keeps. */
function gaps(
  times: readonly (readonly number[])[],
  keep: (start: number, end: number) => boolean,
): number[] {
  return times.flatMap((t) =>
    t.slice(1).flatMap((end, i) => (keep(t[i], end) ? [end - t[i]] : []))
  );
}

/**
 * On one head: a warm-up, the long prompt alone twice (the first untimed), then the streams, their
 * gaps over `window` tokens each, the long prompt again beside them, and their gaps until each has
 * a token after its first. A request starts only while the deadline has time for the last long one.
 */
export async function benchLongPrompt(options: LongPromptOptions): Promise<LongPromptReport> {
  const { deadline, log, streams, longTokens } = options;
  const { prompt, nLayer, vocab } = await benchPrompt(options.model, options.promptTokens);
  // The long prompt's positions and its one token; the streams decode in the rest of theirs.
  const ctx = Math.max(longTokens + 16, prompt.tokens + options.window * 4);
  const report = { layers: `0:${nLayer}`, streams, longTokens };
  const long: RequestSpec = {
    route: "/completion",
    prompt: Array.from(seededIds(longTokens, vocab, options.seed + 2)),
    maxTokens: 1,
    temperature: 0,
  };
  const stream = (i: number): RequestSpec => ({
    route: "/completion",
    prompt: prompt.ids,
    maxTokens: ctx - prompt.tokens,
    temperature: BENCH_SAMPLING.temperature,
    topP: BENCH_SAMPLING.topP,
    topK: BENCH_SAMPLING.topK,
    seed: options.seed + i,
    ignoreEos: true,
  });
  let serving;
  let live: LiveStreams | undefined;
  // Filled as the figures come, so that one cut short keeps those taken before.
  const measured: { -readonly [K in keyof LongPromptReport]?: LongPromptReport[K] } = {};
  try {
    if (deadline.left <= 0) throw new OutOfTime("no time left to start the head");
    serving = await startServing({
      ...options,
      slots: streams + 1,
      queue: streams + 1,
      ctx,
      nLayer,
      startTimeoutS: Math.min(Math.max(deadline.left, 1), 900),
    });
    measured.startSeconds = serving.startSeconds;
    const url = serving.url;
    await streamRequest(url, { ...stream(0), maxTokens: 8 });
    let lastMs = 0;
    /** The long prompt's request: when it was sent and when its first token came. */
    const sendLong = async () => {
      if (deadline.left * 1000 <= lastMs) {
        throw new OutOfTime(
          `${deadline.left.toFixed(0)} s left, the long prompt took ${
            (lastMs / 1000).toFixed(0)
          } s`,
        );
      }
      const t = await streamRequest(url, long);
      lastMs = t.endMs - t.sentMs;
      if (t.eventMs.length === 0) throw new Error("The long prompt's reply streamed no token");
      return { sent: t.sentMs, first: t.eventMs[0] };
    };
    await sendLong();
    const alone = await sendLong();
    measured.ttftAloneMs = alone.first - alone.sent;
    log(`long prompt of ${longTokens} alone: first token ${measured.ttftAloneMs.toFixed(0)} ms`);
    const waitS = Math.min(Math.max(deadline.left, 30), 900);
    live = new LiveStreams(url, Array.from({ length: streams }, (_, i) => stream(i)));
    const times = live.times;
    await live.until(() => times.every((t) => t.length >= 2), "every stream decodes", waitS);
    const from = performance.now();
    const counts = times.map((t) => t.length);
    await live.until(
      () => times.every((t, i) => t.length >= counts[i] + options.window),
      `${options.window} tokens of each stream`,
      waitS,
    );
    const { sent, first } = await sendLong();
    measured.ttftBesideMs = first - sent;
    await live.until(() => live!.allAfter(first), "a token of each stream after it", waitS);
    const without = gaps(times, (a, b) => a >= from && b <= sent);
    const beside = gaps(times, (a, b) => b > sent && a < first);
    measured.gapP99WithoutMs = percentile(without, 0.99);
    measured.gapP99WithMs = percentile(beside, 0.99);
    measured.gapsWithout = without.length;
    measured.gapsWith = beside.length;
    log(
      `long prompt of ${longTokens} beside ${streams} streams: first token ${
        measured.ttftBesideMs.toFixed(0)
      } ms; their gap p99 ${measured.gapP99WithMs.toFixed(1)} ms with it, ${
        measured.gapP99WithoutMs.toFixed(1)
      } ms without`,
    );
    return { ...report, ...measured };
  } catch (e) {
    const why = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
    log(`long prompt: ${why}`);
    return { ...report, ...measured, error: why };
  } finally {
    await live?.stop();
    await serving?.stop();
  }
}
