// Tests for tools/synth/vocab.ts: determinism, a valid BPE layout (bytes, merges, specials,
// fillers), agreement with a naive trainer, and the tokenizer.* entries llama.cpp reads.

import assert from "node:assert/strict";
import corpus from "./vocab_corpus.txt" with { type: "text" };
import { buildVocab, SPECIAL_TOKENS, tokenizerEntries } from "./vocab.ts";
import { CHAT_TEMPLATE } from "./qwen_chat_template.ts";
import { BYTE_TO_CHAR, byteLevelEncode, preTokenize } from "../../lib/tokenizer/pre_tokenize.ts";
import { TokenType } from "../../lib/tokenizer/tokenizer.ts";

Deno.test("buildVocab is deterministic and a greedy prefix of longer trainings", () => {
  const a = buildVocab({ mergeCount: 700 });
  assert.deepEqual(buildVocab({ mergeCount: 700 }), a);
  assert.deepEqual(buildVocab({ mergeCount: 300 }).merges, a.merges.slice(0, 300));
});

Deno.test("buildVocab lays out bytes, merges, specials with valid BPE structure", () => {
  for (const mergeCount of [700, 4000]) {
    const v = buildVocab({ mergeCount });
    assert.equal(v.merges.length, mergeCount);
    assert.equal(new Set(v.merges).size, mergeCount);
    assert.deepEqual(v.tokens.slice(0, 256), BYTE_TO_CHAR);
    assert.equal(new Set(v.tokens).size, v.tokens.length, "token texts are unique");
    assert.equal(v.types.length, v.tokens.length);
    // Every merge joins two tokens that exist before it (bytes or earlier results).
    const available = new Set(BYTE_TO_CHAR);
    const results: string[] = [];
    for (const merge of v.merges) {
      const parts = merge.split(" ");
      assert.equal(parts.length, 2, merge);
      assert.ok(available.has(parts[0]) && available.has(parts[1]), merge);
      const text = parts.join("");
      if (!available.has(text)) results.push(text);
      available.add(text);
    }
    const specialStart = 256 + results.length;
    assert.deepEqual(v.tokens.slice(256, specialStart), results);
    assert.ok(v.types.slice(0, specialStart).every((t) => t === TokenType.Normal));
    const specialIds = SPECIAL_TOKENS.map((_, i) => specialStart + i);
    assert.deepEqual(specialIds.map((id) => [v.tokens[id], v.types[id]]), SPECIAL_TOKENS);
    assert.deepEqual(SPECIAL_TOKENS.map(([text]) => v.specials[text]), specialIds);
    assert.equal(v.tokens.length, specialStart + SPECIAL_TOKENS.length);
    assert.equal(v.eosId, v.specials["<|im_end|>"]);
    assert.equal(v.bosId, v.specials["<|endoftext|>"]);
    assert.equal(v.padId, v.specials["<|endoftext|>"]);
  }
  const tiny = buildVocab({ mergeCount: 700 });
  assert.ok(tiny.tokens.length > 900 && tiny.tokens.length <= 963, `${tiny.tokens.length}`);
});

Deno.test("Qwen's special token types: chat delimiters control, tags user-defined", () => {
  const v = buildVocab({ mergeCount: 10 });
  const type = (text: string) => v.types[v.specials[text]];
  for (const t of ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) assert.equal(type(t), 3, t);
  for (const t of ["<tool_call>", "</tool_call>", "<think>", "</think>"]) {
    assert.equal(type(t), 4, t);
  }
});

Deno.test("padTo pads with unique unused fillers to the exact size", () => {
  const v = buildVocab({ mergeCount: 700, padTo: 248320 });
  assert.equal(v.tokens.length, 248320);
  assert.equal(v.types.length, 248320);
  const first = v.specials["</think>"] + 1;
  assert.equal(v.tokens[first], `<|unused_${first}|>`);
  assert.equal(v.tokens[248319], "<|unused_248319|>");
  assert.ok(v.types.slice(first).every((t) => t === TokenType.Unused));
  assert.equal(new Set(v.tokens).size, v.tokens.length);
  const unpadded = buildVocab({ mergeCount: 700 });
  assert.deepEqual(v.tokens.slice(0, first), unpadded.tokens);
  assert.deepEqual(buildVocab({ mergeCount: 700, padTo: first }).tokens, unpadded.tokens);
});

Deno.test("buildVocab rejects impossible sizes", () => {
  assert.throws(
    () => buildVocab({ mergeCount: 700, padTo: 900 }),
    /Cannot pad the vocabulary to 900 tokens: it already has 963/,
  );
  assert.throws(() => buildVocab({ mergeCount: -1 }), RangeError);
  assert.throws(
    () => buildVocab({ mergeCount: 1e6 }),
    /Cannot train 1000000 merges: .* yields only \d+/,
  );
});

/** Recounts every pair each step: most frequent wins, ties to the shorter then smaller key. */
function naiveMerges(count: number): string[] {
  const freq = new Map<string, number>();
  for (const w of preTokenize(corpus, "qwen2")) {
    const text = byteLevelEncode(w);
    freq.set(text, (freq.get(text) ?? 0) + 1);
  }
  let words = [...freq].map(([text, n]) => ({ symbols: Array.from(text), n }));
  const merges: string[] = [];
  while (merges.length < count) {
    const pairs = new Map<string, number>();
    for (const { symbols, n } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const key = `${symbols[i]} ${symbols[i + 1]}`;
        pairs.set(key, (pairs.get(key) ?? 0) + n);
      }
    }
    const [best] = [...pairs].sort(([ka, a], [kb, b]) =>
      b - a || ka.length - kb.length || (ka < kb ? -1 : 1)
    )[0];
    const [l, r] = best.split(" ");
    words = words.map(({ symbols, n }) => {
      const out: string[] = [];
      for (let i = 0; i < symbols.length; i++) {
        if (symbols[i] === l && symbols[i + 1] === r) {
          out.push(symbols[i++] + r);
        } else out.push(symbols[i]);
      }
      return { symbols: out, n };
    });
    merges.push(best);
  }
  return merges;
}

Deno.test("training matches a naive BPE trainer", () => {
  assert.deepEqual(buildVocab({ mergeCount: 60 }).merges, naiveMerges(60));
});

Deno.test("tokenizerEntries writes the keys and value types llama.cpp reads", () => {
  const v = buildVocab({ mergeCount: 50 });
  const entries = tokenizerEntries(v, { pre: "qwen35", chatTemplate: CHAT_TEMPLATE });
  const byKey = new Map(entries.map((e) => [e.key, e]));
  assert.deepEqual(byKey.get("tokenizer.ggml.model"), {
    key: "tokenizer.ggml.model",
    type: "string",
    value: "gpt2",
  });
  assert.equal(byKey.get("tokenizer.ggml.pre")?.value, "qwen35");
  assert.deepEqual(
    [...byKey.values()].map((e) => [e.key, e.type, "itemType" in e ? e.itemType : undefined]),
    [
      ["tokenizer.ggml.model", "string", undefined],
      ["tokenizer.ggml.pre", "string", undefined],
      ["tokenizer.ggml.tokens", "array", "string"],
      ["tokenizer.ggml.token_type", "array", "i32"],
      ["tokenizer.ggml.merges", "array", "string"],
      ["tokenizer.ggml.eos_token_id", "u32", undefined],
      ["tokenizer.ggml.bos_token_id", "u32", undefined],
      ["tokenizer.ggml.padding_token_id", "u32", undefined],
      ["tokenizer.ggml.add_bos_token", "bool", undefined],
      ["tokenizer.chat_template", "string", undefined],
    ],
  );
  assert.equal(byKey.get("tokenizer.ggml.eos_token_id")?.value, v.eosId);
  assert.equal(byKey.get("tokenizer.ggml.add_bos_token")?.value, false);
  assert.equal(byKey.get("tokenizer.ggml.tokens")?.value, v.tokens);
});
