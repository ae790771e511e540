// The peer's concurrent load: N sequences each prefill a prompt and generate tokens, all at once,
// stepped together as llama.cpp's server steps its slots; and the figure the bench compares.
// Driven by bench/peers/llama.ts, which binds each step to a node-llama-cpp sequence; no
// node-llama-cpp here, so tests/peer_load_test.ts runs in CI.

import { type LoadFailure, type LoadFigure, median } from "../measure.ts";

export type { LoadFailure, LoadFigure };

/** One load run: its wall seconds, and per sequence the ms from the run's start to each token. */
export interface LoadRun {
  readonly seconds: number;
  readonly tokenMs: readonly (readonly number[])[];
}

/**
 * Feeds `ids` to sequence `sequence` (its prompt at step 0, then the token it last generated) and
 * resolves to the token it generates next; `step` counts the tokens it generated before.
 */
export type Evaluate = (
  sequence: number,
  ids: readonly number[],
  step: number,
) => Promise<number>;

/**
 * Every prompt at once, then `tokens` generated per sequence; the last generated token is not
 * fed. Each step issues every sequence's evaluation before awaiting any: node-llama-cpp puts the
 * evaluations queued before its next event-loop turn into one llama_decode, so each step is one
 * batch of all sequences, as a server loop decodes all its slots at once. (Sequences left to
 * await their own tokens drift apart: each sampled token resolves on its own turn and the batches
 * split; 8 sequences went through decodes of 7, then 1, then 5 and 4 tokens on this project's
 * CPU.) The prompts advance together too, node-llama-cpp giving each sequence an equal share of
 * every batch, so every first token comes once all N prompts are in: the first-token time is the
 * prefill of all of them, where a server that prefills requests in turn answers its first
 * requests sooner.
 */
export async function runLoad(
  prompts: readonly (readonly number[])[],
  tokens: number,
  evaluate: Evaluate,
  now: () => number = () => performance.now(),
): Promise<LoadRun> {
  const tokenMs = prompts.map((): number[] => []);
  const start = now();
  let fed = prompts;
  for (let step = 0; step < tokens; step++) {
    fed = await Promise.all(fed.map(async (ids, sequence) => {
      const token = await evaluate(sequence, ids, step);
      tokenMs[sequence].push(now() - start);
      return [token];
    }));
  }
  return { seconds: (now() - start) / 1000, tokenMs };
}

/** The value below which a fraction p of `values` lies: the nearest-rank percentile. */
export function nearestRank(values: readonly number[], p: number): number {
  if (values.length === 0) {
    throw new RangeError("Cannot take a percentile of no values");
  }
  if (!(p > 0 && p <= 1)) {
    throw new RangeError(`Cannot take the percentile ${p}: use (0, 1]`);
  }
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.ceil(p * sorted.length) - 1];
}

/** The figure of `clients` sequences from its timed runs (the warm-up left out). */
export function loadFigure(
  clients: number,
  runs: readonly LoadRun[],
): LoadFigure {
  if (runs.length === 0) {
    throw new RangeError(
      `Cannot make the load figure of ${clients} clients from no runs`,
    );
  }
  const firsts: number[] = [];
  const gaps: number[] = [];
  const generated = (run: LoadRun) => run.tokenMs.reduce((n, times) => n + times.length, 0);
  for (const run of runs) {
    if (
      run.tokenMs.length !== clients || generated(run) !== generated(runs[0])
    ) {
      throw new RangeError(
        `Cannot make one figure of runs of ${runs.map((r) => r.tokenMs.length).join(", ")} ` +
          `sequences and ${runs.map(generated).join(", ")} tokens for ${clients} clients`,
      );
    }
    for (const times of run.tokenMs) {
      if (times.length < 2) {
        throw new RangeError(
          "Cannot time the gaps of a sequence that generated under 2 tokens",
        );
      }
      firsts.push(times[0]);
      for (let k = 1; k < times.length; k++) gaps.push(times[k] - times[k - 1]);
    }
  }
  return {
    clients,
    aggregateTokPerS: generated(runs[0]) / median(runs.map((r) => r.seconds)),
    ttftP50Ms: median(firsts),
    gapP99Ms: nearestRank(gaps, 0.99),
  };
}
