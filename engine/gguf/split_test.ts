// Tests for gguf-split handling in engine/gguf/read.ts: finding the shards, and refusing missing,
// renamed, mixed or inconsistent shards with an error that names the file and the fix.

import assert from "node:assert/strict";
import { GgmlType } from "../quant/ggml_types.ts";
import { assertOpenFails, Bytes, put, withTempDir } from "./_gguf_bytes.ts";
import { openGguf } from "./read.ts";
import { resolveModelFiles } from "./model_files.ts";
import { type GgufTensorPlan, writeGguf } from "../../tools/gguf/gguf_write.ts";

/** One hand-made shard: the three split.* keys and [4] f32 tensors with 16 bytes of data each. */
function shard(no: number, count: number, total: number, names: readonly string[]): Uint8Array {
  const b = new Bytes().header(names.length, 3)
    .str("split.no").u32(2).u16(no)
    .str("split.count").u32(2).u16(count)
    .str("split.tensors.count").u32(5).u32(total);
  names.forEach((n, i) => b.tensor(n, [4], GgmlType.F32, 32 * i));
  b.pad(32);
  names.forEach((_, i) => b.raw(new Uint8Array(16).fill(no * 16 + i)).pad(32));
  return b.bytes();
}

function plan(n: number): GgufTensorPlan[] {
  return Array.from({ length: n }, (_, i) => ({ name: `t${i}`, shape: [8], type: GgmlType.F32 }));
}

async function writeModel(path: string, tensors: number, shards: number): Promise<string[]> {
  return await writeGguf(
    path,
    [{ key: "general.name", type: "string", value: path }],
    plan(tensors),
    (_, i) => new Uint8Array(32).fill(i),
    { shards },
  );
}

Deno.test("hand-made shards combine, each tensor read from the shard that holds it", () =>
  withTempDir(async (dir) => {
    const first = await put(dir, "m-00001-of-00002.gguf", shard(0, 2, 3, ["a"]));
    await put(dir, "m-00002-of-00002.gguf", shard(1, 2, 3, ["b", "c"]));
    const model = await openGguf(first);
    try {
      assert.deepEqual([...model.tensors.values()].map((t) => [t.name, t.shard]), [
        ["a", 0],
        ["b", 1],
        ["c", 1],
      ]);
      assert.deepEqual(await model.readTensor("a"), new Uint8Array(16).fill(0));
      assert.deepEqual(await model.readTensor("c"), new Uint8Array(16).fill(17));
    } finally {
      model.close();
    }
  }));

Deno.test("a missing shard is NotFound, naming the file to download", () =>
  withTempDir(async (dir) => {
    const paths = await writeModel(`${dir}/m.gguf`, 6, 3);
    await Deno.remove(paths[1]);
    await assertOpenFails(
      paths[0],
      Deno.errors.NotFound,
      /shard 2 of 3 of ".*m-00001-of-00003\.gguf": ".*m-00002-of-00003\.gguf" does not exist/,
    );
  }));

Deno.test("a shard under another shard's name is refused as an index mismatch", () =>
  withTempDir(async (dir) => {
    const paths = await writeModel(`${dir}/m.gguf`, 6, 3);
    await Deno.copyFile(paths[2], paths[1]);
    await assertOpenFails(
      paths[0],
      SyntaxError,
      /"[^"]*m-00002-of-00003\.gguf" as shard 2 .*: it holds shard 3, expected 2/,
    );
  }));

Deno.test("shards of a different split of the same name are refused", () =>
  withTempDir(async (dir) => {
    const a = await writeModel(`${dir}/a.gguf`, 6, 3);
    const twoShards = await writeModel(`${dir}/b.gguf`, 6, 2);
    await Deno.copyFile(twoShards[1], a[1]);
    await assertOpenFails(
      a[0],
      SyntaxError,
      /it is one of 2 shards, the first shard says 3; the shards must all come from one gguf-split/,
    );
    const moreTensors = await writeModel(`${dir}/c.gguf`, 9, 3);
    await Deno.copyFile(moreTensors[1], a[1]);
    await assertOpenFails(
      a[0],
      SyntaxError,
      /it says the model has 9 tensors, the first shard says 6/,
    );
  }));

Deno.test("a shard without split keys is refused", () =>
  withTempDir(async (dir) => {
    const a = await writeModel(`${dir}/a.gguf`, 4, 2);
    await writeModel(a[1], 2, 1);
    await assertOpenFails(
      a[0],
      SyntaxError,
      /"[^"]*a-00002-of-00002\.gguf" .*has no "split\.count" key/,
    );
  }));

Deno.test("a tensor in two shards is refused, naming both files", () =>
  withTempDir(async (dir) => {
    const first = await put(dir, "m-00001-of-00002.gguf", shard(0, 2, 2, ["a"]));
    await put(dir, "m-00002-of-00002.gguf", shard(1, 2, 2, ["a"]));
    await assertOpenFails(
      first,
      SyntaxError,
      /tensor "a" is in both ".*m-00001-of-00002\.gguf" and ".*m-00002-of-00002\.gguf"/,
    );
  }));

Deno.test("the tensor total must equal split.tensors.count", () =>
  withTempDir(async (dir) => {
    const first = await put(dir, "m-00001-of-00002.gguf", shard(0, 2, 4, ["a"]));
    await put(dir, "m-00002-of-00002.gguf", shard(1, 2, 4, ["b", "c"]));
    await assertOpenFails(first, SyntaxError, /hold 3 tensors but "split\.tensors\.count" is 4/);
    const single = await put(dir, "one.gguf", shard(0, 1, 2, ["a"]));
    await assertOpenFails(single, SyntaxError, /hold 1 tensors but "split\.tensors\.count" is 2/);
  }));

Deno.test("opening a later shard points at the first", () =>
  withTempDir(async (dir) => {
    const paths = await writeModel(`${dir}/m.gguf`, 3, 3);
    await assertOpenFails(
      paths[1],
      SyntaxError,
      /it is shard 2 of 3; open ".*m-00001-of-00003\.gguf" instead/,
    );
  }));

Deno.test("a first shard whose name does not follow gguf-split is refused", () =>
  withTempDir(async (dir) => {
    const paths = await writeModel(`${dir}/m.gguf`, 2, 2);
    const renamed = `${dir}/model.gguf`;
    await Deno.rename(paths[0], renamed);
    await assertOpenFails(
      renamed,
      SyntaxError,
      /other shards of ".*model\.gguf": .*name must end in "-00001-of-00002\.gguf"/,
    );
  }));

Deno.test("split keys of the wrong type or out of range are refused", () =>
  withTempDir(async (dir) => {
    const noAbove = await put(dir, "m-00001-of-00002.gguf", shard(2, 2, 0, []));
    await assertOpenFails(noAbove, SyntaxError, /"split\.no" 2 is not below "split\.count" 2/);
    const stringCount = new Bytes().header(0, 3)
      .str("split.no").u32(2).u16(0)
      .str("split.count").u32(8).str("2")
      .str("split.tensors.count").u32(5).u32(0);
    await assertOpenFails(
      await put(dir, "s.gguf", stringCount.bytes()),
      SyntaxError,
      /"split\.count" is "2", expected an integer 0\.\.65535/,
    );
  }));

Deno.test("a later shard with malformed split keys is refused and closed", () =>
  withTempDir(async (dir) => {
    const first = await put(dir, "m-00001-of-00002.gguf", shard(0, 2, 1, ["a"]));
    const badNo = new Bytes().header(0, 3)
      .str("split.no").u32(8).str("one")
      .str("split.count").u32(2).u16(2)
      .str("split.tensors.count").u32(5).u32(1);
    await put(dir, "m-00002-of-00002.gguf", badNo.bytes());
    await assertOpenFails(
      first,
      SyntaxError,
      /".*m-00002-of-00002\.gguf" as a GGUF split: "split\.no" is "one", expected an integer/,
    );
  }));

Deno.test("a split in the Hugging Face cache opens through its links, or as the files they resolve to", () =>
  withTempDir(async (dir) => {
    const written = await writeModel(`${dir}/m.gguf`, 5, 3);
    const repo = `${dir}/models--org--m`;
    await Deno.mkdir(`${repo}/blobs`, { recursive: true });
    await Deno.mkdir(`${repo}/snapshots/rev`, { recursive: true });
    const links = written.map((p, i) => {
      // Blobs are named by content: nothing in their names says which shard they hold.
      Deno.renameSync(p, `${repo}/blobs/${"fedcba"[i]}`);
      const link = `${repo}/snapshots/rev/${p.slice(dir.length + 1)}`;
      Deno.symlinkSync(`../../blobs/${"fedcba"[i]}`, link);
      return link;
    });
    const files = resolveModelFiles(links[0]);
    for (const source of [links[0], files]) {
      const model = await openGguf(source);
      try {
        // Named as given, wherever the bytes are.
        assert.equal(model.path, links[0]);
        assert.deepEqual(model.shardPaths, links);
        assert.deepEqual([...model.tensors.values()].map((t) => t.shard), [0, 1, 1, 2, 2]);
        assert.deepEqual(await model.readTensor("t4"), new Uint8Array(32).fill(4));
      } finally {
        model.close();
      }
    }
    // The resolved files are what is opened: a shard's link replaced after resolving is not read.
    await Deno.remove(links[1]);
    const model = await openGguf(files);
    model.close();
    await assertOpenFails(
      links[0],
      Deno.errors.NotFound,
      /"[^"]*m-00002-of-00003\.gguf" does not exist/,
    );
  }));
