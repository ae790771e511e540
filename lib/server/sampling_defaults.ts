// The head's sampling defaults and how a request's own sampling fields resolve against them.
// Used by the routes (lib/server/messages.ts, openai.ts, completion.ts) before admission.

import type { PenaltyOptions } from "../sampling/penalties.ts";
import type { SamplingOptions } from "../scheduler/sequence.ts";

/** The temperature of a request that sets none, unless the head says otherwise: the APIs' 1. */
export const DEFAULT_TEMPERATURE = 1;

export interface SamplingDefaults {
  /** Used when a request sets no temperature; 0 is greedy. */
  readonly temperature: number;
  /** Requests asking for more are clamped to this. */
  readonly temperatureCap: number;
  readonly topK: number;
  readonly topP: number;
}

export interface SamplingRequest {
  readonly temperature?: number;
  readonly topK?: number;
  readonly topP?: number;
  readonly minP?: number;
  readonly minKeep?: number;
  readonly seed?: bigint;
  readonly penalties?: PenaltyOptions;
}

/** Explicit values win (temperature clamped to the cap); a missing seed is drawn at random. */
export function resolveSampling(req: SamplingRequest, defaults: SamplingDefaults): SamplingOptions {
  const seed = req.seed ?? crypto.getRandomValues(new BigUint64Array(1))[0];
  return {
    temperature: Math.min(req.temperature ?? defaults.temperature, defaults.temperatureCap),
    topK: req.topK || defaults.topK,
    topP: req.topP ?? defaults.topP,
    minP: req.minP ?? 0,
    minKeep: req.minKeep ?? 1,
    seed,
    penalties: req.penalties,
  };
}
