// A raw prompt (no chat template) → ids: its text parts tokenized on the tokenizer thread, token
// ids kept, in order. Used by POST /completion (completion.ts) and /v1/completions.

import type { Head } from "./head_context.ts";

/** A text to tokenize, or a token id. */
export type PromptPart = string | number;

/**
 * The ids of `parts`, with BOS first when the prompt starts with text and the model's tokenizer
 * adds one (as llama.cpp does; never for the Qwen models). A prompt too long to count exactly has
 * a lower bound for `tokens` and no ids.
 */
export async function rawPromptIds(
  parts: readonly PromptPart[],
  head: Head,
): Promise<{ ids: number[]; tokens: number }> {
  const t = head.tokenizer;
  const bos = t.addBos && typeof parts[0] === "string" ? [t.bosId!] : [];
  const texts = parts.filter((p): p is string => typeof p === "string");
  // A prompt of ids only skips the round trip to the tokenizer thread.
  const counted = texts.length === 0 ? { parts: [], tokens: 0 } : await head.prompts.texts(texts);
  if (counted.parts.length < texts.length) {
    return { ids: [], tokens: bos.length + counted.tokens + parts.length - texts.length };
  }
  let next = 0;
  const ids = [
    ...bos,
    ...parts.flatMap((p) => typeof p === "number" ? [p] : Array.from(counted.parts[next++])),
  ];
  return { ids, tokens: ids.length };
}
