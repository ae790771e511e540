// A parsed chat request → prompt ids through the model's chat template (on the tokenizer thread),
// plus where the history ends (the prefix-cache boundary). Used by the routes; ids go to scheduler.

import { type ChatMessage, ChatTemplateError, type ChatTool } from "../tokenizer/chat_template.ts";
import type { CountedParts, TokenizerThread } from "../tokenizer/tokenizer_thread.ts";
import { ApiError } from "./api_error.ts";
import type { ToolSpec } from "./output.ts";
import type { ReplyFormat } from "./tool_grammar.ts";

export type ToolChoice =
  | { readonly type: "auto" }
  | { readonly type: "any" }
  | { readonly type: "none" }
  | { readonly type: "tool"; readonly name: string };

/** The API-independent request both chat APIs parse into. */
export interface ChatRequest {
  /** Template-shaped messages; a leading system message holds the system prompt. */
  readonly messages: readonly ChatMessage[];
  readonly tools: readonly ToolSpec[];
  readonly toolChoice: ToolChoice;
  /** Asks the template for reasoning (true/false), or leaves its default (undefined). */
  readonly thinking: boolean | undefined;
  /** Text the reply continues (an Anthropic assistant prefill). */
  readonly prefill?: string;
  /** The reply must be JSON (of a schema) or follow a grammar. */
  readonly format?: ReplyFormat;
}

export interface Prompt {
  readonly ids: number[];
  /** ids.length, or for a prompt far over the context a lower bound on its length (no ids). */
  readonly tokens: number;
  /** Tokens of the history alone: the next turn of this conversation starts with them. */
  readonly historyTokens: number;
  /** The text ends inside an opened <think> (the template opens one for thinking models). */
  readonly endsInThinking: boolean;
}

/**
 * Prompts are counted exactly up to this many contexts, so a client told its prompt is too long
 * learns by how much (Claude Code compacts by it); past that only a lower bound is worked out.
 */
const COUNTED_CONTEXTS = 4;

/** Renders chat requests with one model's template and tokenizer, on the tokenizer thread. */
export class PromptBuilder {
  readonly #thread: TokenizerThread;
  readonly #limit: number;

  constructor(thread: TokenizerThread, ctx: number) {
    this.#thread = thread;
    this.#limit = COUNTED_CONTEXTS * ctx;
  }

  async build(request: ChatRequest): Promise<Prompt> {
    const tools: ChatTool[] | undefined = request.tools.length
      ? request.tools.map((t) => ({
        type: "function",
        function: { name: t.name, description: t.description, parameters: t.inputSchema },
      }))
      : undefined;
    const chat = { messages: request.messages, tools, enableThinking: request.thinking };
    try {
      const p = await this.#thread.chat({ chat, prefill: request.prefill }, this.#limit);
      return { ...p, ids: Array.from(p.ids) };
    } catch (e) {
      if (!(e instanceof ChatTemplateError)) throw e;
      throw new ApiError(
        "invalid_request",
        `Cannot render the conversation with the model's chat template: ${e.message}`,
        { cause: e },
      );
    }
  }

  /**
   * Ids of each text (a raw prompt's parts; control-token texts as those tokens unless `specials`
   * is false); past the counted length only a count.
   */
  texts(texts: readonly string[], specials = true): Promise<CountedParts> {
    return this.#thread.texts(texts, this.#limit, specials);
  }

  close(): void {
    this.#thread.close();
  }
}

/**
 * The 400 clients recognise for a context overflow (Claude Code compacts on it). `exact` is false
 * when `promptTokens` is only a lower bound.
 */
export function checkFits(promptTokens: number, ctx: number, exact = true): void {
  if (promptTokens > ctx) {
    throw new ApiError(
      "invalid_request",
      `prompt is too long: ${exact ? "" : "at least "}${promptTokens} tokens > ${ctx} maximum`,
      { param: "messages" },
    );
  }
}
