// What every route gets from the running head (built by lib/server/head.ts): the scheduler,
// tokenizer, prompt builder, model id, sampling defaults, keep-alive interval and log.

import type { Scheduler } from "../scheduler/scheduler.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import type { PromptBuilder } from "./prompt.ts";
import type { SamplingDefaults } from "./sampling_defaults.ts";

/** Everything a route needs from the running head. */
export interface Head {
  readonly scheduler: Scheduler;
  readonly tokenizer: TextTokenizer;
  readonly prompts: PromptBuilder;
  /** The model's Jinja chat template (GET /props shows it). */
  readonly chatTemplate: string;
  /** The loaded model's id, reported by /v1/models and in every response. */
  readonly modelId: string;
  readonly defaults: SamplingDefaults;
  /** SSE keep-alive interval while a stream is silent (queue wait, long prefill). */
  readonly pingMs: number;
  readonly log: (line: string) => void;
}
