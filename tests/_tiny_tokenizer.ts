// Test helpers: GGUF-style tokenizer metadata for the generated test vocabulary and for small
// hand-written BPE vocabularies. Used by the *_test.ts files of lib/tokenizer and tools/synth.

import type { GgufValue } from "../engine/gguf/gguf_model.ts";
import { CHAT_TEMPLATE } from "../tools/synth/qwen_chat_template.ts";
import { buildVocab, tokenizerEntries, type Vocab } from "../tools/synth/vocab.ts";
import { BYTE_TO_CHAR, type PreTokenizerName } from "../lib/tokenizer/pre_tokenize.ts";
import { TextTokenizer, TokenType } from "../lib/tokenizer/tokenizer.ts";

/** The metadata a reader returns for the tokenizer.* entries the generator writes for `vocab`. */
export function vocabMetadata(vocab: Vocab, pre: PreTokenizerName): Map<string, GgufValue> {
  const entries = tokenizerEntries(vocab, { pre, chatTemplate: CHAT_TEMPLATE });
  return new Map(entries.map((e) => [e.key, e.value as GgufValue]));
}

const tiny = new Map<PreTokenizerName, { vocab: Vocab; tokenizer: TextTokenizer }>();

/** The tiny preset's vocabulary (700 merges) and its tokenizer, built once per pre-tokenizer. */
export function tinyTokenizer(
  pre: PreTokenizerName = "qwen2",
): { vocab: Vocab; tokenizer: TextTokenizer } {
  let built = tiny.get(pre);
  if (!built) {
    const vocab = buildVocab({ mergeCount: 700 });
    built = { vocab, tokenizer: TextTokenizer.fromGguf(vocabMetadata(vocab, pre)) };
    tiny.set(pre, built);
  }
  return built;
}

/**
 * Metadata for a hand-written vocabulary: the 256 byte tokens (id = byte value), then each merge's
 * result in merge order unless `omit` lists it, then `extra` tokens with their types. Merges are
 * written in byte-level spelling ("Ġ" is the space byte). Eos is the last token.
 */
export function handMetadata(
  merges: readonly string[],
  options: { extra?: readonly (readonly [string, number])[]; omit?: readonly string[] } = {},
): Map<string, GgufValue> {
  const tokens = [...BYTE_TO_CHAR];
  for (const merge of merges) {
    const text = merge.replace(" ", "");
    if (!tokens.includes(text) && !options.omit?.includes(text)) tokens.push(text);
  }
  const types: number[] = tokens.map(() => TokenType.Normal);
  for (const [text, type] of options.extra ?? []) {
    tokens.push(text);
    types.push(type);
  }
  return new Map<string, GgufValue>([
    ["tokenizer.ggml.model", "gpt2"],
    ["tokenizer.ggml.pre", "qwen2"],
    ["tokenizer.ggml.tokens", tokens],
    ["tokenizer.ggml.token_type", types],
    ["tokenizer.ggml.merges", [...merges]],
    ["tokenizer.ggml.eos_token_id", tokens.length - 1],
  ]);
}
