// One forward pass over a chain of stages in this process, layers [0, n) split over local and
// remote stages: what tests and benches compare; decoding goes through lib/scheduler/.

import type { LastOutput, Stage, StageInput, StageRunOptions } from "./stage.ts";

/** Result of running all stages for positions [base, base+n) of one slot. */
export type PipelineResult = LastOutput;

/** Runs the chain: token ids into the first stage, hidden rows between, ids out of the last. */
export async function runPipeline(
  stages: readonly Stage[],
  slot: number,
  ids: Uint32Array,
  base: number,
  options: StageRunOptions = {},
): Promise<PipelineResult> {
  let input: StageInput = { kind: "ids", ids };
  for (const stage of stages) {
    const out = await stage.run(slot, input, ids.length, base, options);
    if (out.kind === "ids") {
      const { ids, top, lse, tops } = out;
      return { ids, top, lse, ...(tops ? { tops } : {}) };
    }
    input = { kind: "hidden", rows: out.rows };
  }
  throw new RangeError("Cannot finish the pipeline: the last stage returned hidden rows, not ids");
}

/** Largest prefill chunk every stage accepts. */
export function chainMaxBatch(stages: readonly Stage[]): number {
  return Math.min(...stages.map((s) => s.maxBatch));
}
