// Speculative decoding through a one-slot scheduler, for the drafting tests: a request decoded with
// drafts (lib/scheduler/draft.ts), and what the scheduler counted of them.

import { complete } from "../lib/scheduler/complete.ts";
import { Scheduler, type SchedulerOptions } from "../lib/scheduler/scheduler.ts";
import type { SequenceRequest } from "../lib/scheduler/sequence.ts";

/**
 * A drafted request's ids (each time it ran), its drafts verified and kept, and the prompt rows
 * its stages ran (over every time).
 */
export interface DraftedRun {
  readonly ids: number[];
  /** The ids of each time the request ran, the last being `ids`. */
  readonly runs: number[][];
  readonly verifies: number;
  readonly drafted: number;
  readonly accepted: number;
  /** Positions the first stage counted as prefill: the prompt's alone, verify runs aside. */
  readonly prefillTokens: number;
}

/**
 * `request` decoded by a scheduler of one slot over `setup`'s stages, drafting as it says; `times`
 * times one after another on that scheduler (the later ones start where the earlier ones left
 * its draft record).
 */
export async function decodeDrafted(
  setup: Pick<SchedulerOptions, "local" | "link" | "tokenizer" | "draft" | "drafter">,
  request: SequenceRequest,
  times = 1,
): Promise<DraftedRun> {
  const scheduler = new Scheduler({ ...setup, slots: 1, queue: 1, snapshots: 0 });
  try {
    const runs: number[][] = [];
    for (let i = 0; i < times; i++) runs.push((await complete(scheduler, request)).ids);
    const prefillTokens = scheduler.stats.stages[0].prefillTokens;
    return { ids: runs[runs.length - 1], runs, ...scheduler.stats.drafts, prefillTokens };
  } finally {
    await scheduler.close();
  }
}
