// Tests for lib/tokenizer/pre_tokenize.ts: hand-derived splits under llama.cpp's qwen2/qwen35
// regexes, the tiling property on random text, and the GPT-2 byte map.

import assert from "node:assert/strict";
import {
  BYTE_TO_CHAR,
  byteLevelDecode,
  byteLevelEncode,
  PRE_TOKENIZER_NAMES,
  preTokenize,
} from "./pre_tokenize.ts";

// Each expected split is worked out by hand from the alternatives, first match wins:
// contractions | [^\r\n L N]?L+ | N | ' '?[^\s L N]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
const QWEN2_CASES: readonly (readonly [string, readonly string[]])[] = [
  ["Hello world", ["Hello", " world"]],
  ["I'm sure you'LL see", ["I", "'m", " sure", " you", "'LL", " see"]],
  ["don't", ["don", "'t"]],
  ["12345", ["1", "2", "3", "4", "5"]],
  ["x=42;", ["x", "=", "4", "2", ";"]],
  ["a   b", ["a", "  ", " b"]],
  ["a   ", ["a", "   "]],
  ["  hi", [" ", " hi"]],
  ["a\n\nb", ["a", "\n\n", "b"]],
  ["a \n  b", ["a", " \n", " ", " b"]],
  ["hello!!!\nnext", ["hello", "!!!\n", "next"]],
  ["(foo)", ["(foo", ")"]],
  ["\tindent", ["\tindent"]],
  ["$100.50", ["$", "1", "0", "0", ".", "5", "0"]],
  ["日本語です。", ["日本語です", "。"]],
  ["naïve café", ["naïve", " café"]],
  // A combining mark is not a letter for qwen2: it can only lead the next letter run.
  ["e\u0301te\u0301", ["e", "\u0301te", "\u0301"]],
  // U+0085 is whitespace in llama.cpp (not in JS \s): the run backs off one before "y".
  ["x\u0085\u0085y", ["x", "\u0085", "\u0085y"]],
  // U+FEFF is not whitespace in llama.cpp (it is in JS \s): it is a punctuation-like run.
  ["\uFEFF\uFEFFa", ["\uFEFF\uFEFF", "a"]],
  ["a\u3000\u3000b", ["a", "\u3000", "\u3000b"]],
  ["👍🏽 ok", ["👍🏽", " ok"]],
];

Deno.test("preTokenize qwen2 splits as llama.cpp's regex", () => {
  for (const [text, expected] of QWEN2_CASES) {
    assert.deepEqual(preTokenize(text, "qwen2"), expected, JSON.stringify(text));
  }
});

Deno.test("preTokenize qwen35 keeps combining marks inside letter runs", () => {
  assert.deepEqual(preTokenize("e\u0301te\u0301 x", "qwen35"), ["e\u0301te\u0301", " x"]);
  // After a mark-free start the run is the same as qwen2's.
  assert.deepEqual(preTokenize("Hello world", "qwen35"), ["Hello", " world"]);
  // qwen2 puts a mark after "!" in a punctuation run; for qwen35 it continues the letter run
  // that "!" leads.
  assert.deepEqual(preTokenize("!\u0301a", "qwen2"), ["!\u0301", "a"]);
  assert.deepEqual(preTokenize("!\u0301a", "qwen35"), ["!\u0301a"]);
});

/** Random strings over ranges that exercise every alternative of the regexes. */
function randomText(seed: number, length: number): string {
  const ranges: readonly (readonly [number, number])[] = [
    [0x20, 0x7e],
    [0x09, 0x0d],
    [0x80, 0x24f],
    [0x300, 0x36f],
    [0x2000, 0x206f],
    [0x3000, 0x30ff],
    [0x4e00, 0x4e80],
    [0xfeff, 0xfeff],
    [0x1f300, 0x1f64f],
  ];
  let state = seed;
  function next(n: number): number {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state % n;
  }
  let out = "";
  for (let i = 0; i < length; i++) {
    const [lo, hi] = ranges[next(ranges.length)];
    out += String.fromCodePoint(lo + next(hi - lo + 1));
  }
  return out;
}

Deno.test("preTokenize words tile the text for both pre-tokenizers", () => {
  for (let seed = 1; seed <= 40; seed++) {
    const text = randomText(seed, 200);
    for (const name of PRE_TOKENIZER_NAMES) {
      const words = preTokenize(text, name);
      assert.equal(words.join(""), text, `seed ${seed} ${name}`);
      assert.ok(words.every((w) => w.length > 0));
    }
  }
});

Deno.test("BYTE_TO_CHAR is GPT-2's bytes_to_unicode", () => {
  assert.equal(new Set(BYTE_TO_CHAR).size, 256);
  assert.equal(BYTE_TO_CHAR[0x41], "A");
  assert.equal(BYTE_TO_CHAR[0x20], "Ġ");
  assert.equal(BYTE_TO_CHAR[0x0a], "Ċ");
  assert.equal(BYTE_TO_CHAR[0x00], "\u0100");
  assert.equal(BYTE_TO_CHAR[0x7f], "\u0121");
  assert.equal(BYTE_TO_CHAR[0xad], "\u0143");
  assert.equal(BYTE_TO_CHAR[0xe9], "é");
});

Deno.test("byteLevelEncode and byteLevelDecode are inverse over UTF-8", () => {
  assert.equal(byteLevelEncode(" é"), "ĠÃ©");
  assert.deepEqual(byteLevelDecode("ĠÃ©"), Uint8Array.of(0x20, 0xc3, 0xa9));
  const text = randomText(7, 300);
  assert.equal(new TextDecoder().decode(byteLevelDecode(byteLevelEncode(text))), text);
  // A char outside the map stands for its own UTF-8.
  assert.deepEqual(byteLevelDecode("€"), Uint8Array.of(0xe2, 0x82, 0xac));
});
