// A chat → prompt ids with the model's template and tokenizer, plus where the history ends (the
// prefix-cache boundary). Runs on the tokenizer thread (tokenizer_worker.ts) for lib/server/prompt.ts.

import { type ChatInput, renderChat } from "./chat_template.ts";
import type { TextTokenizer } from "./tokenizer.ts";

/** What the server asks for: the conversation, and text the reply continues (a prefill). */
export interface ChatPromptInput {
  readonly chat: Omit<ChatInput, "addGenerationPrompt">;
  readonly prefill?: string;
}

/** Token counts and ids of a text or chat, cut short once past a limit. */
export interface Counted {
  /** The ids; empty when the text is over the limit. */
  readonly ids: Uint32Array<ArrayBuffer>;
  /** ids.length, or when over the limit a lower bound on the count, above the limit. */
  readonly tokens: number;
}

export interface ChatPrompt extends Counted {
  /** Tokens of the history alone: the next turn of this conversation starts with them. */
  readonly historyTokens: number;
  /** The text ends inside an opened <think> (the template opens one for thinking models). */
  readonly endsInThinking: boolean;
}

/**
 * Ids of `text`, unless it has more than `limit` tokens: then a count above `limit` and no ids.
 * A text too long by its length alone is not tokenized at all.
 */
export function countedIds(
  tokenizer: TextTokenizer,
  text: string,
  limit: number,
  specials = true,
): Counted {
  const atLeast = tokenizer.minTokens(text);
  if (atLeast > limit) return { ids: new Uint32Array(0), tokens: atLeast };
  const ids = tokenizer.encode(text, { limit, specials });
  if (ids.length > limit) return { ids: new Uint32Array(0), tokens: ids.length };
  return { ids: Uint32Array.from(ids), tokens: ids.length };
}

/** Renders and tokenizes a chat; the history is only tokenized when the whole prompt fits. */
export function chatPrompt(
  tokenizer: TextTokenizer,
  template: string,
  input: ChatPromptInput,
  limit: number,
): ChatPrompt {
  const text = renderChat(template, { ...input.chat, addGenerationPrompt: true }) +
    (input.prefill ?? "");
  const whole = countedIds(tokenizer, text, limit);
  if (whole.tokens > limit) return { ...whole, historyTokens: 0, endsInThinking: false };
  const historyText = renderChat(template, { ...input.chat, addGenerationPrompt: false });
  const history = tokenizer.encode(historyText, { limit });
  const ids = whole.ids;
  let common = 0;
  while (common < history.length && common < ids.length && history[common] === ids[common]) {
    common++;
  }
  // Only the part after the history (generation prompt and prefill) can leave <think> open.
  const tail = text.startsWith(historyText) ? text.slice(historyText.length) : text;
  const lastOpen = tail.lastIndexOf("<think>");
  return {
    ...whole,
    historyTokens: common,
    endsInThinking: lastOpen !== -1 && tail.indexOf("</think>", lastOpen) === -1,
  };
}
