// A parsed chat request → prompt ids through the model's chat template, plus where the history
// ends (the prefix-cache boundary). Used by the chat routes; the ids go to lib/scheduler/.

import { type ChatMessage, type ChatTool, renderChat } from "../tokenizer/chat_template.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { ApiError } from "./api_error.ts";
import type { ToolSpec } from "./output.ts";

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
}

export interface Prompt {
  readonly text: string;
  readonly ids: number[];
  /** Tokens of the history alone: the next turn of this conversation starts with them. */
  readonly historyTokens: number;
  /** The text ends inside an opened <think> (the template opens one for thinking models). */
  readonly endsInThinking: boolean;
}

/** Renders chat requests with one model's template and tokenizer. */
export class PromptBuilder {
  readonly #tokenizer: TextTokenizer;
  readonly #template: string;

  constructor(tokenizer: TextTokenizer, template: string) {
    this.#tokenizer = tokenizer;
    this.#template = template;
  }

  build(request: ChatRequest): Prompt {
    const tools: ChatTool[] | undefined = request.tools.length
      ? request.tools.map((t) => ({
        type: "function",
        function: { name: t.name, description: t.description, parameters: t.inputSchema },
      }))
      : undefined;
    const input = { messages: request.messages, tools, enableThinking: request.thinking };
    const text = this.#render({ ...input, addGenerationPrompt: true }) + (request.prefill ?? "");
    const ids = this.#tokenizer.encode(text);
    const historyText = this.#render({ ...input, addGenerationPrompt: false });
    const history = this.#tokenizer.encode(historyText);
    let common = 0;
    while (common < history.length && common < ids.length && history[common] === ids[common]) {
      common++;
    }
    // Only the part after the history (generation prompt and prefill) can leave <think> open.
    const tail = text.startsWith(historyText) ? text.slice(historyText.length) : text;
    const lastOpen = tail.lastIndexOf("<think>");
    return {
      text,
      ids,
      historyTokens: common,
      endsInThinking: lastOpen !== -1 && tail.indexOf("</think>", lastOpen) === -1,
    };
  }

  #render(input: Parameters<typeof renderChat>[1]): string {
    try {
      return renderChat(this.#template, input);
    } catch (e) {
      throw new ApiError(
        "invalid_request",
        `Cannot render the conversation with the model's chat template: ${(e as Error).message}`,
        { cause: e },
      );
    }
  }
}

/** The 400 clients recognise for a context overflow (Claude Code compacts on it). */
export function checkFits(promptTokens: number, ctx: number): void {
  if (promptTokens > ctx) {
    throw new ApiError(
      "invalid_request",
      `prompt is too long: ${promptTokens} tokens > ${ctx} maximum`,
      { param: "messages" },
    );
  }
}
