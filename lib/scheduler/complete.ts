// One sequence run to its end and collected: ids, per-token probabilities, stop reason. How
// `deno task generate` and the tests drive the scheduler, the server's one decode loop.

import type { Stage } from "../../engine/stage.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import type { RemoteStage } from "../wire/remote_stage.ts";
import { StageLink } from "./link.ts";
import { Scheduler } from "./scheduler.ts";
import type { SequenceRequest, StopReason, TokenProbs, Usage } from "./sequence.ts";

export interface Completion {
  /** Generated ids, the one that ended generation included. */
  readonly ids: number[];
  /** Each generated token's probabilities, when the request asked for them (logprobs). */
  readonly probs: TokenProbs[];
  readonly reason: StopReason;
  readonly usage: Usage;
}

export interface ChainOptions {
  /** The local stage: layers [0, k), or the whole model without `next`. */
  readonly local: Stage;
  /** Layers [k, n) behind a worker. */
  readonly next?: RemoteStage;
  readonly tokenizer: TextTokenizer;
  /** Sequences at once (default 1). */
  readonly slots?: number;
}

/**
 * A scheduler over a local stage and the rest of the chain, without a prefix cache. As many
 * sequences may wait as run: a slot frees just after its sequence's end event.
 */
export function chainScheduler(options: ChainOptions): Scheduler {
  const slots = options.slots ?? 1;
  return new Scheduler({
    local: options.local,
    link: options.next ? new StageLink(options.next) : undefined,
    tokenizer: options.tokenizer,
    slots,
    queue: slots,
    snapshots: 0,
  });
}

/** complete() on a fresh chainScheduler; closes it and its link (and so `chain.next`) after. */
export async function completeOnce(
  chain: ChainOptions,
  request: SequenceRequest,
): Promise<Completion> {
  const scheduler = chainScheduler(chain);
  try {
    return await complete(scheduler, request);
  } finally {
    await scheduler.close();
    scheduler.link?.close();
  }
}

export interface GreedyOptions {
  readonly maxTokens: number;
  /** See SequenceRequest.stopIds; an empty set generates maxTokens tokens whatever comes. */
  readonly stopIds?: ReadonlySet<number>;
  /** Log-probabilities with this many best candidates per token (SequenceRequest.logprobs). */
  readonly nProbs?: number;
}

/** A greedy request: every token is the last stage's argmax, exactly. */
export function greedy(prompt: readonly number[], options: GreedyOptions): SequenceRequest {
  return {
    prompt,
    maxTokens: options.maxTokens,
    stopIds: options.stopIds,
    logprobs: options.nProbs,
    sampling: { temperature: 0, topK: 0, topP: 1, seed: 0n },
  };
}

/** Admits `request` and reads its events to the end; a failed sequence throws its error. */
export async function complete(
  scheduler: Scheduler,
  request: SequenceRequest,
): Promise<Completion> {
  const sequence = await scheduler.admit(request);
  const ids: number[] = [];
  const probs: TokenProbs[] = [];
  for await (const event of sequence.events) {
    if (event.type === "token") {
      ids.push(event.id);
      if (event.probs) probs.push(event.probs);
    } else if (event.type === "end") {
      return { ids, probs, reason: event.reason, usage: event.usage };
    } else if (event.type === "error") {
      throw event.error;
    }
  }
  throw new Error(`Sequence ${sequence.id} ended without an end event (it was cancelled)`);
}
