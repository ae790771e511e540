// Tests for engine/hparams.ts: hostile counts in a model's metadata are refused by key and range
// before anything is sized by them; a real model's values pass through unchanged.

import assert from "node:assert/strict";
import { openGguf } from "./gguf/read.ts";
import type { GgufValue } from "./gguf/gguf_model.ts";
import { MAX_DIM, MAX_EXPERTS, MAX_LAYERS, readHParams } from "./hparams.ts";
import { testModel } from "../tests/_models.ts";

async function tinyMetadata(arch: "qwen35moe" | "qwen35"): Promise<Map<string, GgufValue>> {
  const model = await openGguf(await testModel({ arch }));
  try {
    return new Map(model.metadata);
  } finally {
    model.close();
  }
}

Deno.test("a tiny model's hyperparameters read as its preset wrote them", async () => {
  const hp = readHParams(await tinyMetadata("qwen35moe"));
  assert.equal(hp.arch, "qwen35moe");
  assert.equal(hp.isDeltaNet.length, hp.nLayer);
  assert.ok(hp.nLayer >= 1 && hp.E >= hp.Ku && hp.Ku >= 1);
  assert.equal(hp.C, 2 * hp.Nk * hp.Dk + hp.Nv * hp.Dv);
});

Deno.test("out-of-range counts are refused naming the key and its range, before any allocation", async () => {
  const base = await tinyMetadata("qwen35moe");
  const cases: [string, GgufValue, RegExp][] = [
    [
      "block_count",
      2 ** 31,
      new RegExp(`"qwen35moe.block_count" is 2147483648, .*1\\.\\.${MAX_LAYERS}`),
    ],
    ["block_count", 1e8, /"qwen35moe.block_count" is 100000000/],
    ["block_count", 0, /"qwen35moe.block_count" is 0, expected a whole number 1\.\./],
    ["block_count", 2n ** 63n, /"qwen35moe.block_count" is 9223372036854776000/],
    ["block_count", 2.5, /"qwen35moe.block_count" is 2.5/],
    ["nextn_predict_layers", 1000, /"qwen35moe.nextn_predict_layers" is 1000, expected .* 0\.\./],
    ["embedding_length", 2 ** 40, new RegExp(`"qwen35moe.embedding_length" .*1\\.\\.${MAX_DIM}`)],
    ["embedding_length", -64, /"qwen35moe.embedding_length" is -64/],
    ["expert_count", 100_000, new RegExp(`"qwen35moe.expert_count" .*1\\.\\.${MAX_EXPERTS}`)],
    ["expert_used_count", 1000, /"qwen35moe.expert_used_count" is 1000/],
    ["vocab_size", 2 ** 32, /"qwen35moe.vocab_size" is 4294967296/],
    ["full_attention_interval", 0, /"qwen35moe.full_attention_interval" is 0/],
    ["attention.layer_norm_rms_epsilon", NaN, /epsilon" is NaN, expected a finite number > 0/],
    ["rope.freq_base", -1, /"qwen35moe.rope.freq_base" is -1/],
  ];
  for (const [key, value, pattern] of cases) {
    const meta = new Map(base);
    meta.set(`qwen35moe.${key}`, value);
    assert.throws(() => readHParams(meta), (e: unknown) => {
      assert.ok(e instanceof RangeError, `${key} = ${value}: ${String(e)}`);
      assert.match(e.message, pattern);
      return true;
    });
  }
});

Deno.test("a missing or mistyped key is a SyntaxError naming it", async () => {
  const meta = await tinyMetadata("qwen35");
  meta.delete("qwen35.embedding_length");
  assert.throws(() => readHParams(meta), /"qwen35.embedding_length" is missing/);
  meta.set("qwen35.embedding_length", "64");
  assert.throws(() => readHParams(meta), /"qwen35.embedding_length" is string, expected a number/);
});
