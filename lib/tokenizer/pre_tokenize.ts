// Byte-level BPE input: the split regex named by tokenizer.ggml.pre, and GPT-2's byte ↔ char map.
// Used by lib/tokenizer/tokenizer.ts (encoding) and tools/synth/vocab.ts (training the vocab).

/** The `tokenizer.ggml.pre` values we can split for (docs/model_arch.md §2.3). */
export type PreTokenizerName = "qwen2" | "qwen35";
export const PRE_TOKENIZER_NAMES: readonly PreTokenizerName[] = ["qwen2", "qwen35"];

// llama.cpp runs these regexes with std::regex, whose `\s` is C `isspace` below 128 and its own
// White_Space table above (unicode.cpp collapses those to \v). That set holds U+0085 and lacks
// U+FEFF, the reverse of JS `\s`, so the class is written out.
const WS = "\\t\\n\\v\\f\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";

// llama.cpp spells Qwen's `(?i:'s|'t|...)` with explicit case pairs; with Unicode case folding
// the original would also match e.g. "'ſ" (long s), which llama.cpp does not.
const CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/**
 * The split regexes of llama-vocab.cpp, with `\s`/`\S` as above:
 *   qwen2:  contractions | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]* |
 *           \s*[\r\n]+ | \s+(?!\S) | \s+
 *   qwen35: the same with letters `[\p{L}\p{M}]+` and `\p{M}` also excluded from punctuation runs.
 * Every code point is matched by some alternative, so the matches tile the text.
 */
function splitRegex(letters: string, punctuation: string): RegExp {
  return new RegExp(
    [
      CONTRACTIONS,
      `[^\\r\\n\\p{L}\\p{N}]?${letters}`,
      "\\p{N}",
      ` ?[^${WS}${punctuation}]+[\\r\\n]*`,
      `[${WS}]*[\\r\\n]+`,
      `[${WS}]+(?![^${WS}])`,
      `[${WS}]+`,
    ].join("|"),
    "gu",
  );
}

const SPLIT: Readonly<Record<PreTokenizerName, RegExp>> = {
  qwen2: splitRegex("\\p{L}+", "\\p{L}\\p{N}"),
  qwen35: splitRegex("[\\p{L}\\p{M}]+", "\\p{L}\\p{M}\\p{N}"),
};

/** Splits text into the words BPE merges within. Concatenating the words gives back `text`. */
export function preTokenize(text: string, name: PreTokenizerName): string[] {
  const words: string[] = [];
  for (const match of text.matchAll(SPLIT[name])) words.push(match[0]);
  return words;
}

/**
 * GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * (controls, space, 0x7F–0xA0, 0xAD) take U+0100 onward in byte order. Index = byte value.
 */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const chars: string[] = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    chars[b] = String.fromCharCode(printable ? b : next++);
  }
  return chars;
})();

const CHAR_TO_BYTE: ReadonlyMap<string, number> = new Map(BYTE_TO_CHAR.map((c, b) => [c, b]));

const utf8 = new TextEncoder();

/** The byte-level spelling of text: one char per UTF-8 byte, as vocabulary entries are written. */
export function byteLevelEncode(text: string): string {
  let out = "";
  for (const b of utf8.encode(text)) out += BYTE_TO_CHAR[b];
  return out;
}

/**
 * The bytes a byte-level spelling stands for. A char outside the map (never in a well-formed
 * vocabulary) stands for its own UTF-8 bytes.
 */
export function byteLevelDecode(chars: string): Uint8Array {
  const bytes: number[] = [];
  for (const c of chars) {
    const b = CHAR_TO_BYTE.get(c);
    if (b !== undefined) bytes.push(b);
    else bytes.push(...utf8.encode(c));
  }
  return Uint8Array.from(bytes);
}
