// What every generation route shares: the head's context, sampling defaults, admission of a
// prepared prompt into the scheduler, and ids. Between the route modules and lib/scheduler/.

import type { Scheduler } from "../scheduler/scheduler.ts";
import type { SamplingOptions, TokenConstraint } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { OutputStream, type ReplyEvent } from "./output.ts";
import { type ChatRequest, checkFits, type Prompt, type PromptBuilder } from "./prompt.ts";
import { ToolCallConstraint } from "./tool_grammar.ts";

export interface SamplingDefaults {
  /** Used when a request sets no temperature; 0 is greedy. */
  readonly temperature: number;
  /** Requests asking for more are clamped to this. */
  readonly temperatureCap: number;
  readonly topK: number;
  readonly topP: number;
}

/** Everything a route needs from the running head. */
export interface Head {
  readonly scheduler: Scheduler;
  readonly tokenizer: TextTokenizer;
  readonly prompts: PromptBuilder;
  /** The loaded model's id, reported by /v1/models and in every response. */
  readonly modelId: string;
  readonly defaults: SamplingDefaults;
  /** SSE keep-alive interval while a stream is silent (queue wait, long prefill). */
  readonly pingMs: number;
  readonly log: (line: string) => void;
}

export interface SamplingRequest {
  readonly temperature?: number;
  readonly topK?: number;
  readonly topP?: number;
  readonly seed?: bigint;
}

/** Explicit values win (temperature clamped to the cap); a missing seed is drawn at random. */
export function resolveSampling(req: SamplingRequest, defaults: SamplingDefaults): SamplingOptions {
  const seed = req.seed ?? crypto.getRandomValues(new BigUint64Array(1))[0];
  return {
    temperature: Math.min(req.temperature ?? defaults.temperature, defaults.temperatureCap),
    topK: req.topK || defaults.topK,
    topP: req.topP ?? defaults.topP,
    seed,
  };
}

/**
 * What tells a generation that its client left: a streamed reply learns it from its body stream
 * being cancelled, a buffered one from the request's signal (which, with deno.json's
 * "no-legacy-abort", aborts only when the client goes, not after every response).
 */
export function streamSignal(stream: boolean, request: Request): AbortSignal | undefined {
  return stream ? undefined : request.signal;
}

const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `prefix` + 24 random base-62 characters, like Anthropic's and OpenAI's ids. */
export function randomId(prefix: string): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return prefix + Array.from(bytes, (b) => ALPHABET[b % ALPHABET.length]).join("");
}

export interface ChatLimits {
  readonly maxTokens: number;
  readonly stop: readonly string[];
  readonly sampling: SamplingRequest;
  /** Prefix of tool_use ids ("toolu_" or "call_"). */
  readonly toolIdPrefix: string;
  readonly signal?: AbortSignal;
}

/**
 * Admits a chat prompt: a 400 when it does not fit the context, tool_choice any/tool as a
 * grammar over the reply, and the sequence's events parsed into content blocks.
 */
export async function admitChat(
  head: Head,
  chat: ChatRequest,
  prompt: Prompt,
  limits: ChatLimits,
): Promise<ReadableStream<ReplyEvent>> {
  checkFits(prompt.ids.length, head.scheduler.ctx);
  const choice = chat.toolChoice;
  const forced = choice.type === "tool"
    ? chat.tools.filter((t) => t.name === choice.name)
    : choice.type === "any"
    ? chat.tools
    : [];
  const constraint: TokenConstraint | undefined = forced.length
    ? new ToolCallConstraint(head.tokenizer, forced)
    : undefined;
  const sequence = await head.scheduler.admit({
    prompt: prompt.ids,
    cacheBoundary: prompt.historyTokens,
    maxTokens: limits.maxTokens,
    stop: limits.stop,
    sampling: resolveSampling(limits.sampling, head.defaults),
    constraint,
    signal: limits.signal,
  });
  return sequence.events.pipeThrough(
    new OutputStream({
      tools: choice.type === "none" ? [] : chat.tools,
      thinking: chat.thinking === true || prompt.endsInThinking,
      startInThinking: prompt.endsInThinking,
      newToolId: () => randomId(limits.toolIdPrefix),
      log: head.log,
    }),
  );
}
