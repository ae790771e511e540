// Greedy generation over a pipeline of stages: prefill in chunks, then one token per step.
// The loop behind `deno task generate`; the head's scheduler has its own interleaved loop.

import { chainMaxBatch, type PipelineResult, runPipeline } from "./pipeline.ts";
import type { Stage, TopEntry } from "./stage.ts";

export interface GenerateOptions {
  /** Tokens to generate at most. */
  readonly n: number;
  /** Generation stops after producing one of these ids (it is included in the output). */
  readonly stopIds?: ReadonlySet<number>;
  readonly slot?: number;
  /** Top-k entries to keep per generated position. */
  readonly topk?: number;
}

export interface GenerateResult {
  readonly ids: number[];
  /** Top-k of the logits that produced each generated id. */
  readonly tops: (readonly TopEntry[])[];
}

/** Feeds the prompt from position 0, then decodes greedily. The prompt must not be empty. */
export async function generateGreedy(
  stages: readonly Stage[],
  prompt: readonly number[],
  options: GenerateOptions,
): Promise<GenerateResult> {
  if (prompt.length === 0) throw new RangeError("Cannot generate: the prompt has no tokens");
  const slot = options.slot ?? 0;
  const topk = options.topk ?? 0;
  const chunk = chainMaxBatch(stages);
  let pos = 0;
  let last: PipelineResult = { ids: new Uint32Array(0), top: [] };
  while (pos < prompt.length) {
    const ids = Uint32Array.from(prompt.slice(pos, pos + chunk));
    last = await runPipeline(stages, slot, ids, pos, { topk });
    pos += ids.length;
  }
  const out: number[] = [];
  const tops: (readonly TopEntry[])[] = [];
  let next = last.ids[last.ids.length - 1];
  let top = last.top;
  while (out.length < options.n) {
    out.push(next);
    tops.push(top);
    if (options.stopIds?.has(next) || out.length === options.n) break;
    const step = await runPipeline(stages, slot, Uint32Array.of(next), pos, { topk });
    pos += 1;
    next = step.ids[0];
    top = step.top;
  }
  return { ids: out, tops };
}
