// Tests for engine/hparams.ts: hostile counts in a model's metadata are refused by key, value and
// range before anything is sized by them; a real model's values pass through unchanged.

import assert from "node:assert/strict";
import { openGguf } from "./gguf/read.ts";
import type { GgufValue } from "./gguf/gguf_model.ts";
import { MAX_DIM, MAX_EXPERTS, MAX_LAYERS, modelHParams, readHParams } from "./hparams.ts";
import { withTempDir } from "./gguf/_gguf_bytes.ts";
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
    ["block_count", 2n ** 63n, /"qwen35moe.block_count" is 9223372036854775808,/],
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
    // The file that stopped a worker inside the reference engine's IMROPE, naming nothing.
    [
      "rope.dimension_sections",
      [3, -901458906, 2, 0],
      /"qwen35moe.rope.dimension_sections" is \[3,-901458906,2,0\], expected 4 or fewer whole numbers 0\.\.16777216 with a sum above 0/,
    ],
    ["rope.dimension_sections", [0, 0, 0, 0], /sections" is \[0,0,0,0\], expected 4 or fewer/],
    ["rope.dimension_sections", [11, 11, 10, 0, 1], /sections" is \[11,11,10,0,1\], expected/],
    // Sizes that must divide each other name both keys and both values.
    [
      "attention.head_count",
      7,
      /"qwen35moe.attention.head_count" is 7, expected a multiple of "qwen35moe.attention.head_count_kv", which is 2$/,
    ],
    [
      "ssm.inner_size",
      130,
      /"qwen35moe.ssm.inner_size" is 130, expected a multiple of "qwen35moe.ssm.time_step_rank", which is 4$/,
    ],
    [
      "expert_count",
      1,
      /"qwen35moe.expert_used_count" is 2, expected a whole number 1\.\.1 \(at most "qwen35moe.expert_count", which is 1\)/,
    ],
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
  assert.throws(
    () => readHParams(meta),
    /"qwen35.embedding_length" is "64", expected a whole number 1\.\.16777216$/,
  );
  meta.set("qwen35.embedding_length", [64, 64, 32]);
  assert.throws(
    () => readHParams(meta),
    /"qwen35.embedding_length" is \[64,64,32\], expected .*, the same for every layer$/,
  );
  meta.set("qwen35.embedding_length", [64, 64, 64, 64]);
  meta.delete("qwen35.rope.dimension_sections");
  assert.throws(() => readHParams(meta), (e: unknown) => {
    assert.ok(e instanceof SyntaxError);
    assert.match(e.message, /"qwen35.rope.dimension_sections" is missing, expected 4 or fewer/);
    return true;
  });
});

Deno.test("a default that does not fit is refused naming the key it stands for and where it came from", async () => {
  const meta = await tinyMetadata("qwen35moe");
  meta.delete("qwen35moe.attention.key_length");
  meta.set("qwen35moe.embedding_length", 102);
  assert.throws(
    () => readHParams(meta),
    /"qwen35moe.attention.key_length" is missing and its default, qwen35moe.embedding_length \/ qwen35moe.attention.head_count, is 25.5, expected a whole number/,
  );
  const noVocab = await tinyMetadata("qwen35moe");
  noVocab.delete("tokenizer.ggml.tokens");
  assert.throws(
    () => readHParams(noVocab),
    /"qwen35moe.vocab_size" is missing, expected a whole number 1\.\.16777216, or the length of tokenizer.ggml.tokens to give its default/,
  );
});

Deno.test("an opened model's hyperparameters are refused naming its file as well", () =>
  withTempDir(async (dir) => {
    const meta = await tinyMetadata("qwen35moe");
    meta.set("qwen35moe.rope.dimension_sections", [3, -901458906, 2, 0]);
    const path = `${dir}/m.gguf`;
    assert.throws(() => modelHParams({ path, metadata: meta }), (e: unknown) => {
      assert.ok(e instanceof RangeError);
      assert.match(
        e.message,
        new RegExp(
          `^Cannot read model hyperparameters from "${path}": ` +
            `"qwen35moe.rope.dimension_sections" is \\[3,-901458906,2,0\\], expected`,
        ),
      );
      assert.ok(e.cause instanceof RangeError);
      return true;
    });
  }));
