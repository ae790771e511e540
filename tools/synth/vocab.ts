// The byte-level BPE vocabulary of generated test models, trained on vocab_corpus.txt, plus Qwen's
// special tokens. The model generator writes it as tokenizer.* keys; lib/tokenizer reads it back.

import corpus from "./vocab_corpus.txt" with { type: "text" };
import type { GgufMetaEntry } from "../gguf/gguf_write.ts";
import {
  BYTE_TO_CHAR,
  byteLevelEncode,
  preTokenize,
  type PreTokenizerName,
} from "../../lib/tokenizer/pre_tokenize.ts";
import { TokenType } from "../../lib/tokenizer/tokenizer.ts";

export interface Vocab {
  /** Byte-level texts: ids 0..255 are the single bytes (id = byte value), then merge results,
   * then SPECIAL_TOKENS, then fillers up to padTo. */
  tokens: string[];
  /** `tokenizer.ggml.token_type` per token (TokenType values). */
  types: number[];
  /** `"left right"` in rank order; both parts and their concatenation are tokens. */
  merges: string[];
  /** Id of each special token's text. */
  specials: Record<string, number>;
  bosId: number;
  eosId: number;
  padId: number;
}

/**
 * Qwen's special tokens and the types its converted GGUFs give them: the chat delimiters are
 * control tokens, the tool-call and thinking tags user-defined (type 4).
 */
export const SPECIAL_TOKENS: readonly (readonly [string, number])[] = [
  ["<|endoftext|>", TokenType.Control],
  ["<|im_start|>", TokenType.Control],
  ["<|im_end|>", TokenType.Control],
  ["<tool_call>", TokenType.UserDefined],
  ["</tool_call>", TokenType.UserDefined],
  ["<think>", TokenType.UserDefined],
  ["</think>", TokenType.UserDefined],
];

/**
 * Trains `mergeCount` merges on the embedded corpus (deterministic: the most frequent pair wins,
 * ties to the smaller `"left right"` string) and lays out the vocabulary described on Vocab.
 * Byte tokens are type 1: llama.cpp's byte type (6) is for `<0xXX>` texts, which gpt2
 * vocabularies do not have. `padTo` appends unused (type 5) fillers `<|unused_ID|>`, which no
 * merge produces and which are not special, so encoding text never yields them.
 */
export function buildVocab(options: { mergeCount: number; padTo?: number }): Vocab {
  const { mergeCount, padTo } = options;
  if (!Number.isInteger(mergeCount) || mergeCount < 0) {
    throw new RangeError(
      `Cannot build a vocabulary with mergeCount ${mergeCount}: expected an integer ≥ 0`,
    );
  }
  const merges = trainMerges(mergeCount);
  const tokens = [...BYTE_TO_CHAR];
  const known = new Set(tokens);
  for (const merge of merges) {
    // Two merges can spell the same text ("ab c" and "a bc"); the token is listed once.
    const text = merge.replace(" ", "");
    if (!known.has(text)) {
      known.add(text);
      tokens.push(text);
    }
  }
  const types = tokens.map(() => TokenType.Normal as number);
  const specials: Record<string, number> = {};
  for (const [text, type] of SPECIAL_TOKENS) {
    if (known.has(text)) {
      throw new Error(
        `Cannot add special token "${text}": a merge already produced it; edit the corpus`,
      );
    }
    specials[text] = tokens.length;
    tokens.push(text);
    types.push(type);
  }
  if (padTo !== undefined) {
    if (!Number.isInteger(padTo) || padTo < tokens.length) {
      throw new RangeError(
        `Cannot pad the vocabulary to ${padTo} tokens: it already has ${tokens.length}; ` +
          `use a larger padTo or a smaller mergeCount`,
      );
    }
    // The fillers cannot collide: every other token is a byte, a merge of corpus text (which has
    // no "<|unused_"), or a special above.
    for (let id = tokens.length; id < padTo; id++) {
      tokens.push(`<|unused_${id}|>`);
      types.push(TokenType.Unused);
    }
  }
  const endOfText = specials["<|endoftext|>"];
  return {
    tokens,
    types,
    merges,
    specials,
    bosId: endOfText,
    eosId: specials["<|im_end|>"],
    padId: endOfText,
  };
}

/**
 * The tokenizer.* metadata entries llama.cpp reads, with the value types it expects (ids u32,
 * token types i32, no BOS added).
 */
export function tokenizerEntries(
  vocab: Vocab,
  options: { pre: PreTokenizerName; chatTemplate: string },
): GgufMetaEntry[] {
  return [
    { key: "tokenizer.ggml.model", type: "string", value: "gpt2" },
    { key: "tokenizer.ggml.pre", type: "string", value: options.pre },
    { key: "tokenizer.ggml.tokens", type: "array", itemType: "string", value: vocab.tokens },
    { key: "tokenizer.ggml.token_type", type: "array", itemType: "i32", value: vocab.types },
    { key: "tokenizer.ggml.merges", type: "array", itemType: "string", value: vocab.merges },
    { key: "tokenizer.ggml.eos_token_id", type: "u32", value: vocab.eosId },
    { key: "tokenizer.ggml.bos_token_id", type: "u32", value: vocab.bosId },
    { key: "tokenizer.ggml.padding_token_id", type: "u32", value: vocab.padId },
    { key: "tokenizer.ggml.add_bos_token", type: "bool", value: false },
    { key: "tokenizer.chat_template", type: "string", value: options.chatTemplate },
  ];
}

/** A pair of adjacent symbols: how often it occurs (word frequency weighted) and in which words. */
interface PairStats {
  count: number;
  readonly words: Set<number>;
}

/** Symbol ids stay below 2^16 (bytes plus the corpus's few thousand merges): a pair is a number. */
const PAIR = 0x10000;

/**
 * Classic BPE training over the corpus's pre-tokenized (qwen2) byte-level words: repeatedly merge
 * the most frequent adjacent pair everywhere. Symbols are small integers, only the words a merge
 * touches are recounted, and a heap finds the next pair: thousands of merges take well under a
 * second.
 */
function trainMerges(mergeCount: number): string[] {
  const texts: string[] = [];
  const symbolIds = new Map<string, number>();
  function symbol(text: string): number {
    let id = symbolIds.get(text);
    if (id === undefined) {
      if (texts.length === PAIR) throw new RangeError(`Cannot train past ${PAIR} symbols`);
      id = texts.push(text) - 1;
      symbolIds.set(text, id);
    }
    return id;
  }
  const wordFreq = new Map<string, number>();
  for (const word of preTokenize(corpus, "qwen2")) {
    const text = byteLevelEncode(word);
    wordFreq.set(text, (wordFreq.get(text) ?? 0) + 1);
  }
  const words: number[][] = [];
  const freqs: number[] = [];
  for (const [text, freq] of wordFreq) {
    words.push(Array.from(text, symbol));
    freqs.push(freq);
  }

  const pairs = new Map<number, PairStats>();
  const heap = new PairHeap();
  const changed = new Set<number>();
  function count(w: number, sign: 1 | -1): void {
    const symbols = words[w];
    for (let i = 0; i + 1 < symbols.length; i++) {
      const pair = symbols[i] * PAIR + symbols[i + 1];
      let stats = pairs.get(pair);
      if (!stats) pairs.set(pair, stats = { count: 0, words: new Set() });
      stats.count += sign * freqs[w];
      if (sign > 0) stats.words.add(w);
      else stats.words.delete(w);
      if (stats.count === 0) pairs.delete(pair);
      changed.add(pair);
    }
  }
  function requeue(): void {
    for (const pair of changed) {
      const stats = pairs.get(pair);
      if (!stats) continue;
      // The GGUF merge text "left right": byte-level text never contains U+0020.
      const key = `${texts[Math.floor(pair / PAIR)]} ${texts[pair % PAIR]}`;
      heap.push({ pair, key, count: stats.count });
    }
    changed.clear();
  }
  words.forEach((_, w) => count(w, 1));
  requeue();

  const merges: string[] = [];
  while (merges.length < mergeCount) {
    // Entries whose count has changed since they were pushed are stale; a fresh one follows them.
    let best = heap.pop();
    while (best && pairs.get(best.pair)?.count !== best.count) best = heap.pop();
    if (!best) {
      throw new RangeError(
        `Cannot train ${mergeCount} merges: tools/synth/vocab_corpus.txt yields only ` +
          `${merges.length}; lower mergeCount or extend the corpus`,
      );
    }
    const left = Math.floor(best.pair / PAIR);
    const right = best.pair % PAIR;
    const merged = symbol(texts[left] + texts[right]);
    for (const w of [...pairs.get(best.pair)!.words]) {
      count(w, -1);
      words[w] = mergeSymbols(words[w], left, right, merged);
      count(w, 1);
    }
    requeue();
    merges.push(best.key);
  }
  return merges;
}

/** Replaces each non-overlapping left-to-right occurrence of (left, right) by `merged`. */
function mergeSymbols(
  symbols: readonly number[],
  left: number,
  right: number,
  merged: number,
): number[] {
  const out: number[] = [];
  for (let i = 0; i < symbols.length; i++) {
    if (symbols[i] === left && symbols[i + 1] === right) {
      out.push(merged);
      i++;
    } else {
      out.push(symbols[i]);
    }
  }
  return out;
}

interface PairEntry {
  readonly pair: number;
  /** The merge as GGUF writes it, "left right". */
  readonly key: string;
  readonly count: number;
}

/** The merge order: most frequent first, ties to the shorter, then the smaller "left right". */
function mergesBefore(a: PairEntry, b: PairEntry): boolean {
  if (a.count !== b.count) return a.count > b.count;
  if (a.key.length !== b.key.length) return a.key.length < b.key.length;
  return a.key < b.key;
}

/** A binary heap of pair entries, first in merge order at the top. */
class PairHeap {
  readonly #items: PairEntry[] = [];

  push(entry: PairEntry): void {
    const items = this.#items;
    let i = items.push(entry) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!mergesBefore(items[i], items[parent])) break;
      [items[i], items[parent]] = [items[parent], items[i]];
      i = parent;
    }
  }

  pop(): PairEntry | undefined {
    const items = this.#items;
    const top = items[0];
    const last = items.pop();
    if (items.length > 0 && last) {
      items[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let first = i;
        if (l < items.length && mergesBefore(items[l], items[first])) first = l;
        if (r < items.length && mergesBefore(items[r], items[first])) first = r;
        if (first === i) break;
        [items[i], items[first]] = [items[first], items[i]];
        i = first;
      }
    }
    return top;
  }
}
