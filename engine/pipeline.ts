// A chain of stages run one after another in this process: layers [0, n) split over local and
// remote stages. Used by the generate CLI; the head's split driver overlaps stages on its own.

import type { LastOutput, Stage, StageInput, StageRunOptions } from "./stage.ts";

/** Result of running all stages for positions [base, base+n) of one slot. */
export type PipelineResult = LastOutput;

/** Checks that the stages cover [0, nLayer) contiguously, in order, with the same width. */
export function checkChain(stages: readonly Stage[]): void {
  if (stages.length === 0) throw new RangeError("Cannot build a pipeline: no stages given");
  let next = 0;
  for (const s of stages) {
    if (s.first !== next) {
      throw new RangeError(
        `Cannot build a pipeline: a stage starts at layer ${s.first}, expected ${next}; check --layers`,
      );
    }
    if (s.nEmbd !== stages[0].nEmbd || s.nLayer !== stages[0].nLayer) {
      throw new RangeError(
        `Cannot build a pipeline: stage ${s.first}..${s.end} has n_embd ${s.nEmbd} and ${s.nLayer} layers, expected ${
          stages[0].nEmbd
        } and ${stages[0].nLayer}`,
      );
    }
    next = s.end;
  }
  if (next !== stages[0].nLayer) {
    throw new RangeError(
      `Cannot build a pipeline: the stages end at layer ${next}, the model has ${stages[0].nLayer}`,
    );
  }
}

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
    if (out.kind === "ids") return { ids: out.ids, top: out.top, lse: out.lse };
    input = { kind: "hidden", rows: out.rows };
  }
  throw new RangeError("Cannot finish the pipeline: the last stage returned hidden rows, not ids");
}

/** Largest prefill chunk every stage accepts. */
export function chainMaxBatch(stages: readonly Stage[]): number {
  return Math.min(...stages.map((s) => s.maxBatch));
}
