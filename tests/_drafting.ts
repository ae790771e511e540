// Speculative decoding through a one-slot scheduler, for the drafting tests: a request decoded with
// drafts (lib/scheduler/draft.ts), and what the scheduler counted of them.

import { complete } from "../lib/scheduler/complete.ts";
import { Scheduler, type SchedulerOptions } from "../lib/scheduler/scheduler.ts";
import type { SequenceRequest } from "../lib/scheduler/sequence.ts";

/** A drafted request's ids, its drafts verified and kept, and the prompt rows its stages ran. */
export interface DraftedRun {
  readonly ids: number[];
  readonly verifies: number;
  readonly drafted: number;
  readonly accepted: number;
  /** Positions the first stage counted as prefill: the prompt's alone, verify runs aside. */
  readonly prefillTokens: number;
}

/** `request` decoded by a scheduler of one slot over `setup`'s stages, drafting as it says. */
export async function decodeDrafted(
  setup: Pick<SchedulerOptions, "local" | "link" | "tokenizer" | "draft" | "drafter">,
  request: SequenceRequest,
): Promise<DraftedRun> {
  const scheduler = new Scheduler({ ...setup, slots: 1, queue: 1, snapshots: 0 });
  try {
    const { ids } = await complete(scheduler, request);
    const prefillTokens = scheduler.stats.stages[0].prefillTokens;
    return { ids, ...scheduler.stats.drafts, prefillTokens };
  } finally {
    await scheduler.close();
  }
}
