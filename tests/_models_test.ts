// Tests of the test-model cache: one file per spec, shared by parallel callers, reused later,
// and the sha256 that fixtures record (all shards of a split, joined in order).

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { sha256File, testModel } from "./_models.ts";

async function sha256Hex(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("testModel: parallel calls share one generated file, later calls reuse it", async () => {
  const spec = { arch: "qwen35", seed: 11 } as const;
  const [a, b] = await Promise.all([testModel(spec), testModel(spec)]);
  assert.equal(a, b);
  assert.match(a, /tests\/fixtures\/models\/tiny-qwen35-f32-seed11-g[0-9a-f]+\.gguf$/);
  const before = await Deno.stat(a);
  assert.equal(await testModel(spec), a);
  assert.equal((await Deno.stat(a)).mtime?.getTime(), before.mtime?.getTime());
  const model = await openGguf(a);
  try {
    assert.equal(model.metadata.get("general.architecture"), "qwen35");
  } finally {
    model.close();
  }
  assert.notEqual(await testModel({ ...spec, seed: 12 }), a);
});

Deno.test("sha256File hashes all shards of a split model, joined in order", async () => {
  const first = await testModel({ arch: "qwen3next", layout: "legacy", quant: "q8_0", split: 3 });
  assert.match(first, /-00001-of-00003\.gguf$/);
  const model = await openGguf(first);
  const shards = model.shardPaths;
  model.close();
  assert.equal(shards.length, 3);
  const parts = await Promise.all(shards.map((p) => Deno.readFile(p)));
  const joined = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    joined.set(p, at);
    at += p.length;
  }
  assert.equal(await sha256File(first), await sha256Hex(joined));
  assert.equal(await sha256File(shards[1]), await sha256Hex(parts[1]));
});
