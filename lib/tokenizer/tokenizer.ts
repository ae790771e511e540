// Text ↔ token ids for the byte-level BPE vocabularies of Qwen GGUFs, from their tokenizer.* keys.
// Prompt text (lib/tokenizer/chat_template.ts) → ids for the scheduler; ids → bytes for output.

import { BPE } from "@huggingface/tokenizers";
import { describeValue, type GgufValue } from "../../engine/gguf/gguf_model.ts";
import {
  BYTE_TO_CHAR,
  byteLevelDecode,
  byteLevelEncode,
  PRE_TOKENIZER_NAMES,
  preTokenize,
  type PreTokenizerName,
} from "./pre_tokenize.ts";

/** `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type). */
export const TokenType = {
  Undefined: 0,
  Normal: 1,
  Unknown: 2,
  Control: 3,
  UserDefined: 4,
  Unused: 5,
  Byte: 6,
} as const;

/**
 * Token texts llama-vocab.cpp treats as end of generation (and forces to control type) that occur
 * in Qwen vocabularies: the chat and text ends, and the FIM pad / repo / file-separator tokens.
 */
const EOG_TEXTS: ReadonlySet<string> = new Set([
  "<|im_end|>",
  "<|endoftext|>",
  "<|fim_pad|>",
  "<|repo_name|>",
  "<|fim_repo|>",
  "<|file_sep|>",
]);

/** The other FIM tokens, which llama-vocab.cpp also forces to control type (not EOG). */
const FIM_TEXTS: readonly string[] = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"];

/** Metadata keys whose ids are end of generation when present. */
const EOG_ID_KEYS = ["eos", "eot", "eom"].map((k) => `tokenizer.ggml.${k}_token_id`);

export interface EncodeOptions {
  /**
   * Parse control-token texts (`<|im_start|>`) in the text as those tokens; default true, as
   * llama.cpp's tokenize with parse_special. User-defined tokens (`<think>`) are parsed either way,
   * as llama.cpp and HF tokenizers do.
   */
  readonly specials?: boolean;
  /**
   * Stop after the word that takes the ids past this many, so a text far over a context costs a
   * context's worth of work; more than `limit` ids back means the text has at least that many.
   */
  readonly limit?: number;
}

export interface DecodeOptions {
  /** Render control tokens as their text; default true. False drops them, like llama.cpp's
   * token_to_piece with special = false. */
  readonly specials?: boolean;
}

interface SpecialToken {
  readonly text: string;
  readonly id: number;
  readonly control: boolean;
}

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);

/**
 * A byte-level BPE tokenizer that reproduces llama.cpp's tokenize and token_to_piece for the
 * `qwen2` and `qwen35` pre-tokenizers. Merges run in @huggingface/tokenizers' BPE model; special
 * tokens, splitting and byte mapping follow llama-vocab.cpp. No BOS is ever added.
 */
export class TextTokenizer {
  readonly vocabSize: number;
  /** `tokenizer.ggml.bos_token_id`, or null when the file has none. */
  readonly bosId: number | null;
  /**
   * `tokenizer.ggml.add_bos_token` (false when absent or without a BOS id): whether llama.cpp
   * puts BOS before a text prompt. False for the Qwen models.
   */
  readonly addBos: boolean;
  readonly eosId: number;
  /** Ids that end generation: eos (and eot/eom when given) plus the texts in EOG_TEXTS. */
  readonly eosIds: ReadonlySet<number>;

  readonly #tokens: readonly string[];
  readonly #types: readonly number[];
  readonly #ids: ReadonlyMap<string, number>;
  readonly #pre: PreTokenizerName;
  readonly #bpe: BPE;
  /** Control and user-defined tokens, longest UTF-8 text first (llama.cpp's partition order). */
  readonly #specials: readonly SpecialToken[];
  readonly #pieces: (Uint8Array | undefined)[];
  /** Bytes of the longest token, when every byte of any text lands in some token; else 0. */
  readonly #maxTokenBytes: number;

  private constructor(meta: ReadonlyMap<string, GgufValue>) {
    const model = meta.get("tokenizer.ggml.model");
    if (model !== "gpt2") {
      fail(
        `Cannot build the tokenizer: "tokenizer.ggml.model" is ${describeValue(model)}, ` +
          `expected "gpt2" (byte-level BPE); this model's vocabulary is not supported`,
      );
    }
    const pre = meta.get("tokenizer.ggml.pre");
    if (!PRE_TOKENIZER_NAMES.includes(pre as PreTokenizerName)) {
      fail(
        `Cannot build the tokenizer: "tokenizer.ggml.pre" is ${describeValue(pre)}, expected ` +
          `one of ${PRE_TOKENIZER_NAMES.map((n) => `"${n}"`).join(", ")}`,
      );
    }
    this.#pre = pre as PreTokenizerName;

    // llama.cpp renames empty texts so that every text maps back to one id.
    const tokens = stringArray(meta, "tokenizer.ggml.tokens").map((t, i) => t || `[EMPTY_${i}]`);
    if (tokens.length === 0) {
      fail(`Cannot build the tokenizer: "tokenizer.ggml.tokens" is [], expected the tokens' texts`);
    }
    const types = meta.has("tokenizer.ggml.token_type")
      ? numberArray(meta, "tokenizer.ggml.token_type")
      : tokens.map(() => TokenType.Normal);
    if (types.length < tokens.length) {
      fail(
        `Cannot build the tokenizer: "tokenizer.ggml.token_type" is ${describeValue(types)} ` +
          `(${types.length} entries), expected one for each of the ${tokens.length} tokens`,
      );
    }
    const ids = new Map<string, number>();
    tokens.forEach((text, id) => {
      if (ids.has(text)) {
        fail(
          `Cannot build the tokenizer: "tokenizer.ggml.tokens" has the text ` +
            `${describeValue(text)} at ${ids.get(text)} and ${id}, expected each text once`,
        );
      }
      if (types[id] === TokenType.Byte && !/^<0x[0-9A-Fa-f]{2}>$/.test(text)) {
        fail(
          `Cannot build the tokenizer: "tokenizer.ggml.token_type" gives token ${id} ` +
            `${describeValue(text)} type 6 (byte), expected that only for tokens written ` +
            `<0xXX>; byte-level BPE vocabularies mark their byte tokens type 1`,
        );
      }
      ids.set(text, id);
    });
    this.#tokens = tokens;
    this.#ids = ids;
    this.vocabSize = tokens.length;
    this.#pieces = new Array(tokens.length);

    this.eosId = tokenId(meta, "tokenizer.ggml.eos_token_id", tokens.length) ??
      fail(
        `Cannot build the tokenizer: "tokenizer.ggml.eos_token_id" is missing, expected an id ` +
          `below ${tokens.length}, the length of "tokenizer.ggml.tokens"`,
      );
    this.bosId = tokenId(meta, "tokenizer.ggml.bos_token_id", tokens.length) ?? null;
    this.addBos = this.bosId !== null && meta.get("tokenizer.ggml.add_bos_token") === true;
    const eog = new Set<number>();
    for (const key of EOG_ID_KEYS) {
      const id = tokenId(meta, key, tokens.length);
      if (id !== undefined) eog.add(id);
    }
    const forcedTypes = types.slice(0, tokens.length);
    for (const text of [...EOG_TEXTS, ...FIM_TEXTS]) {
      const id = ids.get(text);
      if (id === undefined) continue;
      if (EOG_TEXTS.has(text)) eog.add(id);
      forcedTypes[id] = TokenType.Control;
    }
    this.eosIds = eog;
    this.#types = forcedTypes;

    this.#specials = forcedTypes
      .flatMap((type, id) =>
        type === TokenType.Control || type === TokenType.Unknown || type === TokenType.UserDefined
          ? [{ text: tokens[id], id, control: type !== TokenType.UserDefined }]
          : []
      )
      .sort((a, b) => utf8.encode(b.text).length - utf8.encode(a.text).length || a.id - b.id);

    // Only the library model's merge loop (bpe()) is used: ids come from #ids, which also lets a
    // piece missing from the vocabulary fall back as llama.cpp does. So the model gets no
    // vocabulary; a second 250k-entry map would double the load time.
    const merges = stringArray(meta, "tokenizer.ggml.merges");
    this.#bpe = new BPE({ type: "BPE", vocab: {}, merges, ignore_merges: false });
    // BPE pieces are byte chars or merge results: when all of those are tokens, no byte of a
    // text is dropped (#encodeOrdinary's fallback), so a token never stands for more bytes than
    // the longest one does.
    const covered = BYTE_TO_CHAR.every((c) => ids.has(c)) &&
      merges.every((m) => ids.has(m.replace(" ", "")));
    let longest = 0;
    for (let id = 0; covered && id < tokens.length; id++) {
      longest = Math.max(longest, this.tokenBytes(id).length);
    }
    this.#maxTokenBytes = covered ? longest : 0;
  }

  /** Builds the tokenizer from a GGUF's metadata; throws a SyntaxError naming a bad key. */
  static fromGguf(meta: ReadonlyMap<string, GgufValue>): TextTokenizer {
    return new TextTokenizer(meta);
  }

  /** Token ids of `text`, exactly as llama.cpp's tokenize(add_special = false). */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const limit = options.limit ?? Infinity;
    const ids: number[] = [];
    for (const fragment of this.#partition(text.toWellFormed(), options.specials ?? true)) {
      if (ids.length > limit) break;
      if (typeof fragment === "number") ids.push(fragment);
      else this.#encodeOrdinary(fragment, ids, limit);
    }
    return ids;
  }

  /**
   * A lower bound on encode(text).length, without encoding: every token stands for at most the
   * longest token's bytes, and a text has at least as many UTF-8 bytes as UTF-16 units. 0 when
   * the vocabulary can drop bytes (then no bound holds).
   */
  minTokens(text: string): number {
    return this.#maxTokenBytes ? Math.ceil(text.length / this.#maxTokenBytes) : 0;
  }

  /** The text of `ids`; bytes that are not valid UTF-8 become U+FFFD. */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const parts = ids.map((id) => this.tokenBytes(id, options));
    const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      bytes.set(p, at);
      at += p.length;
    }
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes);
  }

  /**
   * The bytes token `id` stands for, as llama.cpp's token_to_piece: normal tokens through the
   * byte map, control and user-defined tokens as their text, unused and undefined ones as nothing.
   * A piece can end inside a UTF-8 sequence; lib/scheduler/sequence.ts joins them.
   */
  tokenBytes(id: number, options: DecodeOptions = {}): Uint8Array {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new RangeError(
        `Cannot detokenize id ${id}: the vocabulary has ${this.vocabSize} tokens (0..${
          this.vocabSize - 1
        })`,
      );
    }
    const type = this.#types[id];
    if (type === TokenType.Control || type === TokenType.Unknown) {
      if (options.specials === false) return EMPTY;
    }
    return this.#pieces[id] ??= this.#piece(id, type);
  }

  #piece(id: number, type: number): Uint8Array {
    const text = this.#tokens[id];
    switch (type) {
      case TokenType.Normal:
        return byteLevelDecode(text);
      case TokenType.Control:
      case TokenType.Unknown:
      case TokenType.UserDefined:
        return utf8.encode(text);
      case TokenType.Byte:
        return Uint8Array.of(parseInt(text.slice(3, 5), 16));
      default:
        return EMPTY;
    }
  }

  /**
   * Splits text around special-token texts, as llama.cpp's tokenizer_st_partition: each special
   * in turn (longest first) cuts every remaining text fragment at all of its occurrences.
   */
  #partition(text: string, parseControl: boolean): (string | number)[] {
    let fragments: (string | number)[] = text ? [text] : [];
    for (const special of this.#specials) {
      if (special.control && !parseControl) continue;
      const next: (string | number)[] = [];
      for (const fragment of fragments) {
        if (typeof fragment === "number") {
          next.push(fragment);
          continue;
        }
        let from = 0;
        for (
          let at = fragment.indexOf(special.text);
          at !== -1;
          at = fragment.indexOf(special.text, from)
        ) {
          if (at > from) next.push(fragment.slice(from, at));
          next.push(special.id);
          from = at + special.text.length;
        }
        if (from < fragment.length) next.push(fragment.slice(from));
      }
      fragments = next;
    }
    return fragments;
  }

  #encodeOrdinary(text: string, ids: number[], limit: number): void {
    for (const word of preTokenize(text, this.#pre)) {
      if (ids.length > limit) return;
      for (const piece of this.#bpe.bpe(byteLevelEncode(word))) {
        const id = this.#ids.get(piece);
        if (id !== undefined) {
          ids.push(id);
          continue;
        }
        // A merge whose result is not in the vocabulary: llama.cpp emits the piece's bytes that
        // are tokens on their own, which only ASCII bytes can be (one byte of UTF-8 text).
        for (const b of utf8.encode(piece)) {
          const byteId = b < 0x80 ? this.#ids.get(String.fromCharCode(b)) : undefined;
          if (byteId !== undefined) ids.push(byteId);
        }
      }
    }
  }
}

function fail(message: string): never {
  throw new SyntaxError(message);
}

function stringArray(meta: ReadonlyMap<string, GgufValue>, key: string): string[] {
  const value = meta.get(key);
  if (!Array.isArray(value) || !value.every((v) => typeof v === "string")) {
    fail(
      `Cannot build the tokenizer: "${key}" is ${
        describeValue(value)
      }, expected an array of strings`,
    );
  }
  return value as string[];
}

function numberArray(meta: ReadonlyMap<string, GgufValue>, key: string): number[] {
  const value = meta.get(key);
  if (!Array.isArray(value) || !value.every((v) => typeof v === "number")) {
    fail(
      `Cannot build the tokenizer: "${key}" is ${
        describeValue(value)
      }, expected an array of integers`,
    );
  }
  return value as number[];
}

/** The id stored under `key`, undefined when absent; out-of-range ids are an error. */
function tokenId(
  meta: ReadonlyMap<string, GgufValue>,
  key: string,
  vocabSize: number,
): number | undefined {
  const value = meta.get(key);
  if (value === undefined) return undefined;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value >= vocabSize) {
    fail(
      `Cannot build the tokenizer: "${key}" is ${describeValue(value)}, expected an id below ` +
        `${vocabSize}, the length of "tokenizer.ggml.tokens"`,
    );
  }
  return value;
}
