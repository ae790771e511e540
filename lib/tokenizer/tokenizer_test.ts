// Tests for lib/tokenizer/tokenizer.ts: hand-checked BPE cases, special-token parsing as llama.cpp
// does it, round trips over varied text, a naive-BPE cross-check, and metadata errors.

import assert from "node:assert/strict";
import type { GgufValue } from "../../engine/gguf/gguf_model.ts";
import { handMetadata, tinyTokenizer, vocabMetadata } from "../../tests/_tiny_tokenizer.ts";
import { byteLevelEncode, preTokenize, type PreTokenizerName } from "./pre_tokenize.ts";
import { TextTokenizer, TokenType } from "./tokenizer.ts";
import { buildVocab } from "../../tools/synth/vocab.ts";

const A = 0x61, B = 0x62, X = 0x78, SPACE = 0x20;

Deno.test("encode applies merges by rank within each word", () => {
  // ids: bytes 0..255, then 256 "ab", 257 "abc", 258 "Ġa", 259 "Ġb"
  const t = TextTokenizer.fromGguf(handMetadata(["a b", "ab c", "Ġ a", "Ġ b"]));
  assert.deepEqual(t.encode("abc"), [257]);
  assert.deepEqual(t.encode("abab"), [256, 256]);
  // "Ġabc": (a b) has rank 0 and beats the earlier (Ġ a), then (ab c); Ġ stays alone.
  assert.deepEqual(t.encode(" abc"), [SPACE, 257]);
  // "a b" is two words ("a", " b"): no merge spans the boundary.
  assert.deepEqual(t.encode("a b"), [A, 259]);
  assert.deepEqual(t.encode("xab"), [X, 256]);
});

Deno.test("encode prefers the lower rank, then the leftmost pair", () => {
  // 256 "bc", 257 "ab": in "abc" (b c) wins although (a b) comes first.
  const byRank = TextTokenizer.fromGguf(handMetadata(["b c", "a b"]));
  assert.deepEqual(byRank.encode("abc"), [A, 256]);
  // Equal ranks merge left to right: "aaaaa" → aa aa a.
  const ties = TextTokenizer.fromGguf(handMetadata(["a a"]));
  assert.deepEqual(ties.encode("aaaaa"), [256, 256, A]);
  // 256 "aa", 257 "aaa": "aaa" → (aa a).
  const chain = TextTokenizer.fromGguf(handMetadata(["a a", "aa a"]));
  assert.deepEqual(chain.encode("aaa"), [257]);
  assert.deepEqual(chain.encode("aaaa"), [256, 256]);
});

Deno.test("encode falls back like llama.cpp when a merge result is not a token", () => {
  // llama.cpp then emits the ASCII bytes of the piece and drops the others.
  const ascii = TextTokenizer.fromGguf(handMetadata(["a b"], { omit: ["ab"] }));
  assert.deepEqual(ascii.encode("ab"), [A, B]);
  const accented = TextTokenizer.fromGguf(handMetadata(["Ã ©"], { omit: ["Ã©"] }));
  assert.deepEqual(accented.encode("xé"), [X]);
});

Deno.test("specials: control tokens parse only with specials, user-defined always", () => {
  const { vocab, tokenizer: t } = tinyTokenizer();
  const s = vocab.specials;
  const text = "<|im_start|>user\nHi<think>x</think><|im_end|>";
  const withSpecials = t.encode(text);
  assert.deepEqual(withSpecials, [
    s["<|im_start|>"],
    ...t.encode("user\nHi"),
    s["<think>"],
    ...t.encode("x"),
    s["</think>"],
    s["<|im_end|>"],
  ]);
  assert.deepEqual(t.encode(text, { specials: true }), withSpecials);
  const plain = t.encode(text, { specials: false });
  assert.deepEqual(plain, [
    ...t.encode("<|im_start|>user\nHi", { specials: false }),
    s["<think>"],
    ...t.encode("x"),
    s["</think>"],
    ...t.encode("<|im_end|>", { specials: false }),
  ]);
  for (const control of ["<|im_start|>", "<|im_end|>"]) assert.ok(!plain.includes(s[control]));
  // Adjacent and repeated specials, at both ends.
  assert.deepEqual(t.encode("<|im_end|><|im_end|><tool_call></tool_call>"), [
    s["<|im_end|>"],
    s["<|im_end|>"],
    s["<tool_call>"],
    s["</tool_call>"],
  ]);
  // Text that only resembles a special stays text.
  assert.ok(!t.encode("<|im_end|").includes(s["<|im_end|>"]));
  assert.deepEqual(t.encode(""), []);
});

Deno.test("specials: longer special texts are cut out first, as llama.cpp's partition", () => {
  // "ab" starts earlier in "abcd", but the longer "bcd" is cut out first and wins the overlap.
  const t = TextTokenizer.fromGguf(
    handMetadata([], { extra: [["ab", TokenType.Control], ["bcd", TokenType.Control]] }),
  );
  const [ab, bcd] = [256, 257];
  assert.deepEqual(t.encode("abcd"), [A, bcd]);
  assert.deepEqual(t.encode("abab bcd"), [ab, ab, SPACE, bcd]);
});

Deno.test("unused filler tokens are never produced by encoding", () => {
  const vocab = buildVocab({ mergeCount: 700, padTo: 1200 });
  const t = TextTokenizer.fromGguf(vocabMetadata(vocab, "qwen2"));
  assert.equal(t.vocabSize, 1200);
  const filler = vocab.tokens[1100];
  assert.equal(filler, "<|unused_1100|>");
  const firstFiller = vocab.types.indexOf(TokenType.Unused);
  for (const specials of [true, false]) {
    const ids = t.encode(`x ${filler} <|unused_1199|>`, { specials });
    assert.ok(ids.every((id) => id < firstFiller), JSON.stringify(ids));
  }
  // Fillers decode to nothing, like llama.cpp's token_to_piece for unused tokens.
  assert.equal(t.decode([1100]), "");
});

const ROUND_TRIP: readonly string[] = [
  "Hello, world! The quick brown fox jumps over the lazy dog.",
  "export function f(x: number): number {\n\treturn x * 2; // double\n}\n",
  "    indented\n\n\n  \t mixed   whitespace   \r\n trailing   ",
  "3.14159 + 2.71828 = 5.85987; 1,000,000 × 0.5 = 500000",
  "Punctuation!?... (a) [b] {c} <d> \"e\" 'f' `g` ~h~ @i #j $k %l ^m &n *o -p _q +r =s |t \\u /v",
  "Ça va ? Größe, naïve café, São Paulo, Dvořák, Tiếng Việt",
  "Decomposed: e\u0301 a\u0308 n\u0303 o\u0302\u0323 and a lone mark \u0301 at the start",
  "中文：今天天气很好。日本語のテキスト。한국어 텍스트.",
  "Emoji: 😀👍🏽👩‍💻🏳️‍🌈🇫🇷 ❤️ and symbols ∑∫√∞ ≤ ≥ ≠",
  "Odd spaces:\u00a0\u2009\u3000\u0085\u2028\u2029 and \uFEFF BOM inside",
  "\uFEFFleading BOM",
  "Specials: <|im_start|>system\nBe brief.<|im_end|>\n<think>\nhmm\n</think>\n" +
  "<tool_call>{}</tool_call><|endoftext|>",
  "\u0000\u0001\u001f\u007f control bytes",
];

Deno.test("decode(encode(text)) gives the text back, qwen2 and qwen35", () => {
  for (const pre of ["qwen2", "qwen35"] as const) {
    const { tokenizer: t } = tinyTokenizer(pre);
    for (const text of ROUND_TRIP) {
      for (const specials of [true, false]) {
        const ids = t.encode(text, { specials });
        assert.equal(t.decode(ids), text, `${pre} ${JSON.stringify(text)}`);
      }
    }
    // Merges do compress: ordinary English takes far fewer tokens than bytes.
    const english = ROUND_TRIP[0];
    assert.ok(t.encode(english).length < english.length / 2);
  }
});

Deno.test("minTokens bounds the count from below; a limit stops encoding just past it", () => {
  for (const pre of ["qwen2", "qwen35"] as const) {
    const { tokenizer: t } = tinyTokenizer(pre);
    for (const text of [...ROUND_TRIP, "a".repeat(5000), "-".repeat(3000), "😀".repeat(500)]) {
      const n = t.encode(text).length;
      assert.ok(t.minTokens(text) <= n, `${pre} ${JSON.stringify(text.slice(0, 40))}`);
      const cut = t.encode(text, { limit: Math.floor(n / 2) });
      assert.ok(cut.length > Math.floor(n / 2) || n === 0);
      assert.deepEqual(cut, t.encode(text).slice(0, cut.length));
    }
    assert.ok(t.minTokens("x".repeat(10_000)) > 100);
  }
  // A vocabulary that drops bytes (a merge result missing) gives no bound at all.
  const dropping = TextTokenizer.fromGguf(handMetadata(["a b"], { omit: ["ab"] }));
  assert.equal(dropping.minTokens("ab".repeat(100)), 0);
});

Deno.test("lone surrogates are encoded as U+FFFD", () => {
  const { tokenizer: t } = tinyTokenizer();
  assert.equal(t.decode(t.encode("a\uD800b")), "a\uFFFDb");
});

/** GPT-2's original bpe(): merge every occurrence of the lowest-rank pair, repeat. */
function naiveBpe(word: string, ranks: ReadonlyMap<string, number>): string[] {
  let symbols = Array.from(word);
  for (;;) {
    let best: string | undefined;
    for (let i = 0; i + 1 < symbols.length; i++) {
      const key = `${symbols[i]} ${symbols[i + 1]}`;
      const rank = ranks.get(key);
      if (rank !== undefined && (best === undefined || rank < ranks.get(best)!)) best = key;
    }
    if (best === undefined) return symbols;
    const [left, right] = best.split(" ");
    const merged: string[] = [];
    for (let i = 0; i < symbols.length; i++) {
      if (symbols[i] === left && symbols[i + 1] === right) merged.push(symbols[i++] + right);
      else merged.push(symbols[i]);
    }
    symbols = merged;
  }
}

Deno.test("encode agrees with a naive BPE on the corpus and random text", async () => {
  const corpus = await Deno.readTextFile(
    new URL("../../tools/synth/vocab_corpus.txt", import.meta.url),
  );
  let seed = 99;
  let random = "";
  for (let i = 0; i < 3000; i++) {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    random += String.fromCodePoint(
      [0x20 + (seed % 95), 0xc0 + (seed % 200), 0x4e00 + (seed % 50)][seed % 3],
    );
  }
  for (const pre of ["qwen2", "qwen35"] as PreTokenizerName[]) {
    const { vocab, tokenizer: t } = tinyTokenizer(pre);
    const ranks = new Map(vocab.merges.map((m, i) => [m, i]));
    const ids = new Map(vocab.tokens.map((text, id) => [text, id]));
    for (const text of [corpus, random]) {
      const expected = preTokenize(text, pre).flatMap((w) =>
        naiveBpe(byteLevelEncode(w), ranks).map((p) => ids.get(p)!)
      );
      assert.deepEqual(t.encode(text, { specials: false }), expected);
    }
  }
});

Deno.test("eosIds, bosId, eosId and token pieces come from the metadata", () => {
  const { vocab, tokenizer: t } = tinyTokenizer();
  assert.equal(t.vocabSize, vocab.tokens.length);
  assert.equal(t.eosId, vocab.specials["<|im_end|>"]);
  assert.equal(t.bosId, vocab.specials["<|endoftext|>"]);
  assert.deepEqual(
    [...t.eosIds].sort((a, b) => a - b),
    [vocab.specials["<|endoftext|>"], vocab.specials["<|im_end|>"]],
  );
  assert.deepEqual(t.tokenBytes(0xe9), Uint8Array.of(0xe9));
  assert.deepEqual(t.tokenBytes(vocab.specials["<think>"]), new TextEncoder().encode("<think>"));
  // Control tokens render as text unless specials are off; user-defined ones always do.
  assert.equal(t.decode([vocab.specials["<|im_start|>"], 0x41], { specials: false }), "A");
  assert.equal(t.decode([vocab.specials["<think>"]], { specials: false }), "<think>");
  assert.throws(() => t.tokenBytes(vocab.tokens.length), RangeError);
  assert.throws(() => t.tokenBytes(-1), /Cannot detokenize id -1/);
});

Deno.test("EOG and FIM texts are forced to control type, as llama.cpp does", () => {
  // ids 256..260; the last, <|im_end|>, is eos.
  const meta = handMetadata([], {
    extra: [
      ["<|endoftext|>", TokenType.Normal],
      ["<|fim_pad|>", TokenType.UserDefined],
      ["<|fim_prefix|>", TokenType.UserDefined],
      ["<tool_response>", TokenType.UserDefined],
      ["<|im_end|>", TokenType.Control],
    ],
  });
  const t = TextTokenizer.fromGguf(meta);
  assert.deepEqual([...t.eosIds].sort(), [256, 257, 260]);
  assert.deepEqual(t.encode("a<|endoftext|><|fim_prefix|><tool_response>"), [A, 256, 258, 259]);
  // As control tokens they are text without specials; <tool_response> stays user-defined.
  const plain = t.encode("<|endoftext|><|fim_prefix|><tool_response>", { specials: false });
  assert.ok(!plain.includes(256) && !plain.includes(258));
  assert.equal(plain.at(-1), 259);
  assert.equal(t.decode([258, 259], { specials: false }), "<tool_response>");
  assert.equal(t.bosId, null);
});

Deno.test("fromGguf reports bad tokenizer metadata", () => {
  function withKey(key: string, value: GgufValue | undefined): Map<string, GgufValue> {
    const meta = handMetadata(["a b"]);
    if (value === undefined) meta.delete(key);
    else meta.set(key, value);
    return meta;
  }
  assert.throws(
    () => TextTokenizer.fromGguf(withKey("tokenizer.ggml.model", "llama")),
    /"tokenizer\.ggml\.model" is "llama", expected "gpt2"/,
  );
  assert.throws(
    () => TextTokenizer.fromGguf(withKey("tokenizer.ggml.pre", "llama3")),
    /"tokenizer\.ggml\.pre" is "llama3", expected one of "qwen2", "qwen35"/,
  );
  assert.throws(
    () => TextTokenizer.fromGguf(withKey("tokenizer.ggml.eos_token_id", undefined)),
    /"tokenizer\.ggml\.eos_token_id" is missing, expected an id below 257/,
  );
  assert.throws(
    () => TextTokenizer.fromGguf(withKey("tokenizer.ggml.eos_token_id", 9999)),
    /"tokenizer\.ggml\.eos_token_id" is 9999, expected an id below 257/,
  );
  assert.throws(
    () => TextTokenizer.fromGguf(withKey("tokenizer.ggml.merges", undefined)),
    /"tokenizer\.ggml\.merges" is missing, expected an array of strings/,
  );
  const duplicate = handMetadata([], { extra: [["a", TokenType.Normal]] });
  assert.throws(
    () => TextTokenizer.fromGguf(duplicate),
    /"tokenizer\.ggml\.tokens" has the text "a" at 97 and 256, expected each text once/,
  );
  const byteTyped = handMetadata([]);
  byteTyped.set("tokenizer.ggml.token_type", Array.from({ length: 256 }, () => TokenType.Byte));
  assert.throws(
    () => TextTokenizer.fromGguf(byteTyped),
    /"tokenizer\.ggml\.token_type" gives token 0 "Ā" type 6 \(byte\), expected that only for tokens written <0xXX>/,
  );
});
