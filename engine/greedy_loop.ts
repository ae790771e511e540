// Greedy generation over a pipeline of stages: prefill in chunks, then one token per step (or
// several per submission where a single stage can chain its own argmaxes).
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

/** Decode steps per submission when one stage decodes on its own: one readback per this many. */
const FUSED_STEPS = 16;

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
  let last: PipelineResult = { ids: new Uint32Array(0), top: [], lse: NaN };
  while (pos < prompt.length) {
    const ids = Uint32Array.from(prompt.slice(pos, pos + chunk));
    last = await runPipeline(stages, slot, ids, pos, { topk });
    pos += ids.length;
  }
  const out = [last.ids[last.ids.length - 1]];
  const tops: (readonly TopEntry[])[] = [last.top];
  // Without per-position top-k a lone whole-model stage decodes many tokens per readback.
  const fused = stages.length === 1 && topk === 0
    ? stages[0].decodeGreedy?.bind(stages[0])
    : undefined;
  const stopped = () => options.stopIds?.has(out[out.length - 1]) ?? false;
  while (out.length < options.n && !stopped()) {
    const steps = fused ? Math.min(FUSED_STEPS, options.n - out.length, chunk) : 1;
    const step = fused
      ? await fused(slot, out[out.length - 1], pos, steps)
      : await runPipeline(stages, slot, Uint32Array.of(out[out.length - 1]), pos, { topk });
    pos += steps;
    for (const id of step.ids) {
      out.push(id);
      tops.push(steps === 1 ? step.top : []);
      if (stopped()) break;
    }
  }
  return { ids: out, tops };
}
