// The bench's figures under load, as users see them: a head (main.ts) with a slot per client, and
// clients streaming /completion at once (tools/loadtest.ts), unsplit at each count, then split.
//
// /completion sends every token as an event, so the gaps between tokens are the tokens' own; a
// /v1/messages stream sends nothing for a token without visible text (most of a random model's).

import { BENCH_SAMPLING, type Deadline, type LoadFigure, OutOfTime } from "./measure.ts";
import { benchPrompt } from "./server_bench.ts";
import { layersName, startServing } from "./split.ts";
import { loadFigure, type RequestSpec, runLoad } from "../tools/loadtest.ts";
import { DEFAULT_MAX_BATCH } from "../engine/stage.ts";
import type { DraftMode } from "../lib/scheduler/draft.ts";

export interface LoadBenchOptions {
  readonly model: string;
  readonly backend: string;
  readonly gpu: string;
  /** Prompt length in tokens after the chat template, at most. */
  readonly promptTokens: number;
  /** n_predict of each request; every reply runs to it (ignore_eos). */
  readonly maxTokens: number;
  /** Clients at once, one figure each, through the whole model on the head. */
  readonly clients: readonly number[];
  /** Clients at once through the split; none or split undefined: no split. */
  readonly splitClients: readonly number[];
  /** Layer where the head ends and the worker begins. */
  readonly split?: number;
  /** Requests each client sends one after another. */
  readonly requests: number;
  /** The heads' --prefill-chunk; their default when undefined. */
  readonly prefillChunk?: number;
  /** The heads' --prefill-step-ms; their default when undefined. */
  readonly prefillStepMs?: number;
  /** Also these counts of clients through the whole model with the head's --draft `draft`. */
  readonly draftClients?: readonly number[];
  readonly draft?: DraftMode;
  readonly seed: number;
  readonly deadline: Deadline;
  readonly log: (line: string) => void;
}

/** How the figures under load were taken, and why any is missing. */
export interface LoadSetup {
  readonly backend: string;
  readonly gpu: string;
  readonly route: "/completion";
  readonly promptTokens: number;
  readonly maxTokens: number;
  readonly temperature: number;
  readonly topP?: number;
  readonly topK?: number;
  readonly requestsPerClient: number;
  readonly prefillChunk?: number;
  readonly prefillStepMs?: number;
  /** Each layout's layers, slots and start seconds (and --draft, where the head drafts). */
  readonly heads: readonly {
    readonly layers: string;
    readonly draft?: DraftMode;
    readonly slots: number;
    readonly startSeconds?: number;
  }[];
  /** "layers, N clients: why" for each figure not taken. */
  readonly notes: readonly string[];
}

/**
 * What the bench report carries: `load` unsplit (issue 23's name), `loadSplit`, `loadDraft` (the
 * whole model with the head drafting), and how.
 */
export interface LoadBenchResult {
  readonly load: readonly LoadFigure[];
  readonly loadSplit?: readonly LoadFigure[];
  readonly loadDraft?: readonly LoadFigure[];
  readonly loadSetup: LoadSetup;
}

/**
 * Each count of clients streams its requests at once; the first after a one-request warm-up
 * (the head's first steps build pipelines). A count starts only while the deadline has time for
 * the count before it scaled by the clients (prefill grows with them): it would not fit otherwise.
 */
async function levels(
  url: string,
  layers: string,
  counts: readonly number[],
  request: RequestSpec,
  options: LoadBenchOptions,
  notes: string[],
): Promise<LoadFigure[]> {
  const { deadline, log } = options;
  await runLoad({ url, clients: 1, requests: 1, request });
  const figures: LoadFigure[] = [];
  let last: { clients: number; seconds: number } | undefined;
  for (const clients of counts) {
    try {
      const need = last ? (last.seconds * clients) / last.clients : 0;
      if (deadline.left <= need) {
        throw new OutOfTime(
          `${deadline.left.toFixed(0)} s left, about ${need.toFixed(0)} s needed`,
        );
      }
      const report = await runLoad({ url, clients, requests: options.requests, request });
      last = { clients, seconds: report.wallMs / 1000 };
      const figure = loadFigure(report);
      log(
        `load ${layers}, ${clients} clients: ${figure.aggregateTokPerS.toFixed(1)} tok/s, ` +
          `first token p50 ${figure.ttftP50Ms.toFixed(0)} ms, gap p99 ${
            figure.gapP99Ms.toFixed(1)
          } ms`,
      );
      figures.push(figure);
    } catch (e) {
      const why = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
      log(`load ${layers}, ${clients} clients: ${why}`);
      notes.push(`${layers}, ${clients} clients: ${why}`);
    }
  }
  return figures;
}

/** The head unsplit at each count of clients, then split at options.split at each of splitClients. */
export async function benchLoad(options: LoadBenchOptions): Promise<LoadBenchResult> {
  const { prompt, nLayer } = await benchPrompt(options.model, options.promptTokens);
  const request: RequestSpec = {
    route: "/completion",
    prompt: prompt.ids,
    maxTokens: options.maxTokens,
    temperature: BENCH_SAMPLING.temperature,
    topP: BENCH_SAMPLING.topP,
    topK: BENCH_SAMPLING.topK,
    seed: options.seed,
    ignoreEos: true,
  };
  const notes: string[] = [];
  const heads: LoadSetup["heads"][number][] = [];
  const drafting = options.draft !== undefined && options.draft !== "off" &&
    (options.draftClients?.length ?? 0) > 0;
  const layouts = [
    { split: undefined, counts: options.clients, draft: undefined, name: "load" },
    ...(options.split !== undefined && options.splitClients.length
      ? [{ split: options.split, counts: options.splitClients, draft: undefined, name: "split" }]
      : []),
    ...(drafting
      ? [{ split: undefined, counts: options.draftClients!, draft: options.draft, name: "draft" }]
      : []),
  ];
  const results = new Map<string, LoadFigure[]>();
  for (const { split, counts, draft, name } of layouts) {
    const layers = `${layersName(nLayer, split)}${draft === undefined ? "" : ` --draft ${draft}`}`;
    const slots = Math.max(...counts);
    let serving;
    try {
      if (options.deadline.left <= 0) throw new OutOfTime("no time left to start it");
      serving = await startServing({
        ...options,
        slots,
        // A slot per client, and every client's request admitted at once.
        queue: slots,
        // Runs of as many positions as a head with the default context takes (its maxBatch is
        // the context where shorter): the prompts of clients arriving together share its steps.
        ctx: Math.max(prompt.tokens + options.maxTokens + 16, DEFAULT_MAX_BATCH),
        nLayer,
        split,
        draft,
        startTimeoutS: Math.min(Math.max(options.deadline.left, 1), 900),
      });
      heads.push({ layers, slots, draft, startSeconds: serving.startSeconds });
      results.set(name, await levels(serving.url, layers, counts, request, options, notes));
    } catch (e) {
      const why = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
      options.log(`load ${layers}: ${why}`);
      heads.push({ layers, slots, draft });
      notes.push(`${layers}: ${why}`);
      results.set(name, []);
    } finally {
      await serving?.stop();
    }
  }
  return {
    load: results.get("load")!,
    loadSplit: results.get("split"),
    loadDraft: results.get("draft"),
    loadSetup: {
      backend: options.backend,
      gpu: options.gpu,
      route: "/completion",
      promptTokens: prompt.tokens,
      maxTokens: options.maxTokens,
      temperature: BENCH_SAMPLING.temperature,
      topP: BENCH_SAMPLING.topP,
      topK: BENCH_SAMPLING.topK,
      requestsPerClient: options.requests,
      prefillChunk: options.prefillChunk,
      prefillStepMs: options.prefillStepMs,
      heads,
      notes,
    },
  };
}
