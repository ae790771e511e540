// Admission of a prepared chat prompt into the scheduler (context and schema checks, forced tool
// calls and response formats as a grammar, reply parsing), and how a generation learns its client
// left. Routes → lib/scheduler/.

import type { TokenConstraint } from "../scheduler/sequence.ts";
import type { Head } from "./head_context.ts";
import { OutputStream, type ReplyEvent } from "./output.ts";
import { type ChatRequest, checkFits, type Prompt } from "./prompt.ts";
import { randomId } from "./random_id.ts";
import { resolveSampling, type SamplingRequest } from "./sampling_defaults.ts";
import { grammarConstraint } from "../grammar/token_mask.ts";
import { checkToolSchemas, replyGrammar } from "./tool_grammar.ts";

/**
 * What tells a generation that its client left: a streamed reply learns it from its body stream
 * being cancelled, a buffered one from the request's signal (which, with deno.json's
 * "no-legacy-abort", aborts only when the client goes, not after every response).
 */
export function streamSignal(stream: boolean, request: Request): AbortSignal | undefined {
  return stream ? undefined : request.signal;
}

export interface ChatLimits {
  readonly maxTokens: number;
  readonly stop: readonly string[];
  readonly sampling: SamplingRequest;
  /** Prefix of tool_use ids ("toolu_" or "call_"). */
  readonly toolIdPrefix: string;
  /** Per-token log-probabilities with this many best candidates (see SequenceRequest). */
  readonly logprobs?: number;
  readonly signal?: AbortSignal;
}

/**
 * Admits a chat prompt: a 400 when a schema is unusable or the prompt does not fit the context,
 * tool_choice any/tool and a response format as a grammar over the reply, and the sequence's
 * events parsed into content blocks.
 */
export async function admitChat(
  head: Head,
  chat: ChatRequest,
  prompt: Prompt,
  limits: ChatLimits,
): Promise<ReadableStream<ReplyEvent>> {
  checkToolSchemas(chat.tools);
  const choice = chat.toolChoice;
  const forced = choice.type === "tool"
    ? chat.tools.filter((t) => t.name === choice.name)
    : choice.type === "any"
    ? chat.tools
    : [];
  const grammar = replyGrammar({
    forced,
    optional: choice.type === "auto" ? chat.tools : [],
    format: chat.format,
    reasoning: prompt.endsInThinking,
  });
  const constraint: TokenConstraint | undefined = grammar &&
    grammarConstraint(grammar, head.tokenizer);
  checkFits(prompt.tokens, head.scheduler.ctx, prompt.ids.length === prompt.tokens);
  const sequence = await head.scheduler.admit({
    prompt: prompt.ids,
    cacheBoundary: prompt.historyTokens,
    maxTokens: limits.maxTokens,
    stop: limits.stop,
    sampling: resolveSampling(limits.sampling, head.defaults),
    constraint,
    logprobs: limits.logprobs,
    signal: limits.signal,
  });
  return sequence.events.pipeThrough(
    new OutputStream({
      tools: choice.type === "none" ? [] : chat.tools,
      thinking: chat.thinking === true || prompt.endsInThinking,
      startInThinking: prompt.endsInThinking,
      newToolId: () => randomId(limits.toolIdPrefix),
      tokenBytes: (id) => head.tokenizer.tokenBytes(id),
      log: head.log,
    }),
  );
}
