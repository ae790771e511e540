// tools/shard.ts: per-stage shards hold exactly their stage's tensors and every metadata key, report
// the whole model's fingerprint, and a stage refuses a shard that lacks its layers.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { stageTensorNames } from "../engine/gguf/stage_shard.ts";
import { type EngineChoice, openLocalStage } from "../engine/open_stage.ts";
import { modelFingerprint } from "../lib/wire/hello.ts";
import { testModel } from "../tests/_models.ts";
import { layerRange, listOf } from "../lib/cli.ts";
import { writeStageShards } from "./shard.ts";

/** `--stages` as the shard command parses it. */
const STAGES = listOf(layerRange);
const REFERENCE: EngineChoice = { backend: "reference" };

const ADDED = ["tandem.shard.first", "tandem.shard.end", "tandem.fingerprint"];

async function withModels<T>(paths: readonly string[], use: (m: GgufModel[]) => T | Promise<T>) {
  const models: GgufModel[] = [];
  try {
    for (const p of paths) models.push(await openGguf(p));
    return await use(models);
  } finally {
    for (const m of models) m.close();
  }
}

/** Checks every shard against the whole model at `wholePath`. */
async function assertShardsOf(wholePath: string, shardPaths: string[], stages: number[][]) {
  await withModels([wholePath, ...shardPaths], async ([whole, ...shards]) => {
    const want = await modelFingerprint(whole);
    for (const [i, shard] of shards.entries()) {
      const [first, end] = stages[i];
      assert.deepEqual(await modelFingerprint(shard), want);
      const keys = [...shard.metadata.keys()].filter((k) => !ADDED.includes(k));
      const wholeKeys = [...whole.metadata.keys()].filter((k) => !k.startsWith("split."));
      assert.deepEqual(keys, wholeKeys);
      for (const k of keys) {
        assert.deepEqual(shard.metadata.get(k), whole.metadata.get(k), k);
        assert.deepEqual(shard.metadataTypes.get(k), whole.metadataTypes.get(k), k);
      }
      assert.equal(shard.metadata.get("tandem.shard.first"), first);
      assert.equal(shard.metadata.get("tandem.shard.end"), end);
      const names = new Set(stageTensorNames(whole, 4, { first, end }));
      assert.deepEqual(new Set(shard.tensors.keys()), names);
      for (const name of names) {
        const t = shard.tensors.get(name)!;
        assert.deepEqual([t.type, t.shape], [
          whole.tensors.get(name)!.type,
          whole.tensors.get(name)!.shape,
        ]);
        assert.deepEqual(await shard.readTensor(name), await whole.readTensor(name), name);
      }
    }
  });
}

Deno.test("shards of one model (plain, split, tied) hold their stage's tensors and its fingerprint", async () => {
  const out = await Deno.makeTempDir({ prefix: "tandem-shard-" });
  try {
    const plain = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
    const paths = await writeStageShards(plain, STAGES.parse("0:1,1:3,3:4"), `${out}/plain`);
    const stem = plain.slice(plain.lastIndexOf("/") + 1).replace(/\.gguf$/, "");
    assert.deepEqual(paths, [
      `${out}/plain/${stem}.layers-0-1.gguf`,
      `${out}/plain/${stem}.layers-1-3.gguf`,
      `${out}/plain/${stem}.layers-3-4.gguf`,
    ]);
    await assertShardsOf(plain, paths, [[0, 1], [1, 3], [3, 4]]);

    // A gguf-split input gives the same shards; the shards are plain files.
    const split = await testModel({ arch: "qwen35moe", quant: "q4_k_m", split: 3 });
    const fromSplit = await writeStageShards(split, STAGES.parse("0:2,2:4"), `${out}/split`);
    await assertShardsOf(split, fromSplit, [[0, 2], [2, 4]]);
    await withModels(fromSplit, (models) => {
      for (const m of models) assert.equal(m.shardPaths.length, 1);
    });

    // Tied: the last stage's LM head is token_embd, so its shard carries a copy.
    const tied = await testModel({ arch: "qwen35moe", quant: "q8_0", tied: true });
    const tiedPaths = await writeStageShards(tied, STAGES.parse("0:2,2:4"), `${out}/tied`);
    await assertShardsOf(tied, tiedPaths, [[0, 2], [2, 4]]);
    await withModels([tiedPaths[1]], ([last]) => {
      assert.ok(last.tensors.has("token_embd.weight"));
    });
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});

Deno.test("a stage refuses a shard without its layers; bad --stages and shard inputs are refused", async () => {
  const out = await Deno.makeTempDir({ prefix: "tandem-shard-" });
  try {
    const path = await testModel({ arch: "qwen35moe" });
    const [head, tail] = await writeStageShards(path, STAGES.parse("0:2,2:4"), out);
    await withModels([tail], async ([model]) => {
      await assert.rejects(
        openLocalStage(model, { engine: REFERENCE, first: 1, end: 4, slots: 1, ctx: 8 }),
        (e: Error) =>
          e instanceof RangeError && /layers 1:4 .*holding layers 2:4 only/.test(e.message),
      );
      const stage = await openLocalStage(model, {
        engine: REFERENCE,
        first: 3,
        end: 4,
        slots: 1,
        ctx: 8,
      });
      stage.close();
    });
    await assert.rejects(
      writeStageShards(path, STAGES.parse("0:2,3:4"), `${out}/x`),
      /stage 2 starts at layer 3, expected 2/,
    );
    await assert.rejects(
      writeStageShards(path, STAGES.parse("0:2,2:3"), `${out}/x`),
      /has 4 layers; end it at 4/,
    );
    await assert.rejects(
      writeStageShards(head, STAGES.parse("0:1,1:4"), `${out}/x`),
      /already a stage shard \(layers 0:2\)/,
    );
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});
