// Tests for engine/gguf/read.ts and header.ts on single files: hostile and broken headers, tensor
// placement, truncation at every byte, random corruption, lazy reads and argument range checks.

import assert from "node:assert/strict";
import { GgmlType } from "../quant/ggml_types.ts";
import { assertOpenFails, Bytes, openFilesUnder, put, withTempDir } from "./_gguf_bytes.ts";
import { MAX_HEADER_BYTES } from "./format.ts";
import { openGguf } from "./read.ts";
import { writeGguf } from "../../tools/gguf/gguf_write.ts";

const F32 = GgmlType.F32;

/** A valid file: one string key and one [4] f32 tensor of 16 bytes. */
function validFile(version = 3): Bytes {
  return new Bytes().header(1, 1, version)
    .str("general.architecture").u32(8).str("qwen3next")
    .tensor("t", [4], F32, 0).pad(32)
    .raw([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]);
}

Deno.test("versions 2 and 3 open and read lazily", () =>
  withTempDir(async (dir) => {
    for (const version of [2, 3]) {
      const path = await put(dir, `v${version}.gguf`, validFile(version).bytes());
      const model = await openGguf(path);
      try {
        assert.equal(model.version, version);
        assert.equal(model.metadata.get("general.architecture"), "qwen3next");
        assert.deepEqual(model.tensors.get("t"), {
          name: "t",
          shape: [4],
          type: F32,
          nbytes: 16,
          shard: 0,
          fileOffset: 128,
        });
        assert.deepEqual(
          await model.readTensorBytes("t", 4, 8),
          Uint8Array.from([2, 0, 0, 0, 3, 0, 0, 0]),
        );
        assert.deepEqual(model.shardPaths, [path]);
      } finally {
        model.close();
      }
    }
  }));

/** Each case: the bytes, and what the SyntaxError must say (including the byte offset). */
const HOSTILE: [string, Bytes, RegExp][] = [
  [
    "bad magic",
    new Bytes().raw([0x67, 0x67, 0x6a, 0x74]).u32(3).u64(0).u64(0),
    /first 4 bytes are "ggjt", expected "GGUF" \(at byte 0\)/,
  ],
  ["empty file", new Bytes(), /file ends at byte 0, inside the magic/],
  [
    "version 1",
    new Bytes().header(0, 0, 1),
    /version 1 is not supported.*32-bit counts.*\(at byte 4\)/,
  ],
  [
    "version 4",
    new Bytes().header(0, 0, 4),
    /version 4 is not supported \(supported: 2, 3\) \(at byte 4\)/,
  ],
  ["big-endian", new Bytes().header(0, 0, 0x03000000), /big-endian/],
  [
    "tensor count beyond the file",
    new Bytes().header(2n ** 40n, 0),
    /tensor count 1099511627776 needs at least 35184372088832 bytes but only 8 remain.*\(at byte 8\)/,
  ],
  [
    "tensor count beyond 2^64/2",
    new Bytes().header(2n ** 63n, 0),
    /tensor count 9223372036854775808 needs/,
  ],
  [
    "kv count beyond the file",
    new Bytes().header(0, 1000),
    /metadata key count 1000 needs at least 13000 bytes but only 0 remain in the file \(at byte 16\)/,
  ],
  [
    "key length beyond the file",
    new Bytes().header(0, 1).u64(2n ** 40n).zeros(20),
    /metadata key 0 has length 1099511627776 bytes but only 20 remain in the file \(at byte 24\)/,
  ],
  [
    "key length beyond 2^53",
    new Bytes().header(0, 1).u64(2n ** 62n).zeros(20),
    /has length 4611686018427387904 bytes but only 20/,
  ],
  [
    "string value beyond the file",
    new Bytes().header(0, 1).str("k").u32(8).u64(100).zeros(10),
    /the value of "k" has length 100 bytes but only 10 remain in the file \(at byte 37\)/,
  ],
  [
    "array count beyond the file",
    new Bytes().header(0, 1).str("k").u32(9).u32(4).u64(2n ** 40n).zeros(40),
    /the value of "k" item count 1099511627776 needs at least 4398046511104 bytes but only 40 remain in the file \(at byte 41\)/,
  ],
  [
    "string array count beyond the file",
    new Bytes().header(0, 1).str("k").u32(9).u32(8).u64(10).zeros(40),
    /item count 10 needs at least 80 bytes but only 40 remain/,
  ],
  [
    "unknown value type",
    new Bytes().header(0, 1).str("k").u32(13).zeros(8),
    /"k" has unknown value type 13 \(at byte 33\)/,
  ],
  [
    "unknown array item type",
    new Bytes().header(0, 1).str("k").u32(9).u32(99).u64(0),
    /the value of "k" has unknown item type 99 \(at byte 37\)/,
  ],
  [
    "duplicate key",
    new Bytes().header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2),
    /metadata key "k" appears twice \(at byte 38\)/,
  ],
  [
    "invalid UTF-8 key",
    new Bytes().header(0, 1).u64(2).raw([0xc3, 0x28]).u32(0).u8(1),
    /metadata key 0 is not valid UTF-8.*\(at byte 32\)/,
  ],
  [
    "alignment not a power of two",
    new Bytes().header(0, 1).str("general.alignment").u32(4).u32(48),
    /"general.alignment" is 48; it must be a power of two \(at byte 53\)/,
  ],
  [
    "alignment zero",
    new Bytes().header(0, 1).str("general.alignment").u32(4).u32(0),
    /"general.alignment" is 0/,
  ],
  [
    "alignment a string",
    new Bytes().header(0, 1).str("general.alignment").u32(8).str("32"),
    /"general.alignment" is 32; it must be a power of two/,
  ],
  [
    "0 dims",
    new Bytes().header(1, 0).str("t").u32(0).u32(0).u64(0),
    /tensor "t" has 0 dimensions; GGUF allows 1 to 4 \(at byte 24\)/,
  ],
  [
    "5 dims",
    new Bytes().header(1, 0).tensor("t", [1, 1, 1, 1, 1], F32, 0).pad(32).zeros(4),
    /tensor "t" has 5 dimensions/,
  ],
  [
    "huge n_dims",
    new Bytes().header(1, 0).str("t").u32(0xffffffff).zeros(64),
    /has 4294967295 dimensions/,
  ],
  [
    "zero dimension",
    new Bytes().header(1, 0).tensor("t", [4, 0], F32, 0).pad(32),
    /tensor "t" cannot be stored: dimension 0 of \[4,0\] is not a positive integer \(at byte 24\)/,
  ],
  [
    "dimension beyond 2^53",
    new Bytes().header(1, 0).tensor("t", [2n ** 60n], F32, 0).pad(32),
    /tensor "t" has dimension 1152921504606846976, beyond 2\^53/,
  ],
  [
    "element count beyond 2^53",
    new Bytes().header(1, 0).tensor("t", [2 ** 30, 2 ** 30, 2 ** 30], F32, 0).pad(32),
    /more than 2\^53 elements/,
  ],
  [
    "absurd size",
    new Bytes().header(1, 0).tensor("t", [2 ** 40, 2 ** 10], F32, 0).pad(32),
    /occupies bytes 96\.\.4503599627370592 but the file ends at byte 96/,
  ],
  [
    "rows not whole blocks",
    new Bytes().header(1, 0).tensor("q", [48, 2], GgmlType.Q8_0, 0).pad(32).zeros(102),
    /rows of 48 Q8_0 values are not a multiple of the block size 32/,
  ],
  [
    "unknown tensor type",
    new Bytes().header(1, 0).tensor("t", [256], 99, 0).pad(32).zeros(256),
    /tensor "t" has type type 99, which this engine cannot read/,
  ],
  [
    "unsupported tensor type",
    new Bytes().header(1, 0).tensor("t", [256], 16, 0).pad(32).zeros(256),
    /has type type 16/,
  ],
  [
    "data past the end",
    new Bytes().header(1, 0).tensor("t", [4], F32, 0).pad(32).zeros(15),
    /"t" occupies bytes 64\.\.80 but the file ends at byte 79; the file is truncated/,
  ],
  [
    "offset past the end",
    new Bytes().header(1, 0).tensor("t", [4], F32, 2 ** 40).pad(32).zeros(16),
    /occupies bytes 1099511627840\.\./,
  ],
  [
    "offset beyond 2^53",
    new Bytes().header(1, 0).tensor("t", [4], F32, 2n ** 60n).pad(32),
    /data offset 1152921504606846976, beyond 2\^53/,
  ],
  [
    "misaligned offset",
    new Bytes().header(2, 0).tensor("a", [4], F32, 0).tensor("b", [4], F32, 16).pad(32).zeros(64),
    /tensor "b" has data offset 16, not a multiple of the alignment 32 \(at byte 57\)/,
  ],
  [
    "overlapping tensors",
    new Bytes().header(2, 0).tensor("a", [16], F32, 0).tensor("b", [4], F32, 32).pad(32).zeros(64),
    /tensor "b" at byte 128 overlaps tensor "a" \(bytes 96\.\.160\)/,
  ],
  [
    "same offset",
    new Bytes().header(2, 0).tensor("a", [4], F32, 0).tensor("b", [4], F32, 0).pad(32).zeros(16),
    /overlaps tensor "a"/,
  ],
  [
    "duplicate tensor name",
    new Bytes().header(2, 0).tensor("a", [4], F32, 0).tensor("a", [4], F32, 32).pad(32).zeros(48),
    /tensor "a" appears twice \(at byte 57\)/,
  ],
];

Deno.test("hostile headers fail with a SyntaxError naming the path, problem and byte", () =>
  withTempDir(async (dir) => {
    for (const [i, [what, bytes, pattern]] of HOSTILE.entries()) {
      const path = await put(dir, `case${i}.gguf`, bytes.bytes());
      await assert.rejects(openGguf(path), (e: unknown) => {
        assert.ok(e instanceof SyntaxError, `${what}: expected a SyntaxError, got ${String(e)}`);
        assert.ok(e.message.startsWith(`Cannot read "${path}" as GGUF: `), `${what}: ${e.message}`);
        assert.match(e.message, pattern, what);
        return true;
      });
    }
    assert.equal(await openFilesUnder(dir), 0, "a refused file was left open");
  }));

Deno.test("arrays nested nine deep are refused; eight deep are read", () =>
  withTempDir(async (dir) => {
    const nested = (levels: number) => {
      const b = new Bytes().header(0, 1).str("k").u32(9);
      for (let i = 1; i < levels; i++) b.u32(9).u64(1);
      return b.u32(0).u64(1).u8(7);
    };
    const ok = await openGguf(await put(dir, "eight.gguf", nested(8).bytes()));
    assert.deepEqual(ok.metadata.get("k"), [[[[[[[[7]]]]]]]]);
    ok.close();
    await assertOpenFails(
      await put(dir, "nine.gguf", nested(9).bytes()),
      SyntaxError,
      /the value of "k" nests arrays deeper than 8 levels \(at byte 133\)/,
    );
  }));

Deno.test("a header running past the header limit is refused without reading or allocating it", () =>
  withTempDir(async (dir) => {
    const path = await put(
      dir,
      "huge_key.gguf",
      new Bytes().header(0, 1).u64(MAX_HEADER_BYTES).bytes(),
    );
    // Sparse: the file claims its size without the disk holding it.
    await Deno.truncate(path, 2 * MAX_HEADER_BYTES);
    await assertOpenFails(
      path,
      SyntaxError,
      /metadata key 0 has length 67108864 bytes but the header may take only 67108832 more/,
    );
    // A count the file could hold but the header limit cannot: refused before allocating.
    const manyItems = await put(
      dir,
      "many_items.gguf",
      new Bytes().header(0, 1).str("k").u32(9).u32(0).u64(100_000_000).bytes(),
    );
    await Deno.truncate(manyItems, 2 * MAX_HEADER_BYTES);
    await assertOpenFails(
      manyItems,
      SyntaxError,
      /item count 100000000 needs at least 100000000 bytes but the header may take only 67108815 more \(limit 67108864 bytes\) \(at byte 41\)/,
    );
  }));

Deno.test("a file cut anywhere before its last tensor byte is refused as truncated", () =>
  withTempDir(async (dir) => {
    const full = `${dir}/full.gguf`;
    await writeGguf(full, [
      { key: "s", type: "string", value: "abc" },
      { key: "a", type: "array", itemType: "string", value: ["x", "yz"] },
      { key: "n", type: "array", itemType: "array", value: [{ itemType: "u16", value: [1, 2] }] },
      { key: "f", type: "f64", value: 1.5 },
    ], [
      { name: "w", shape: [32, 2], type: GgmlType.Q8_0 },
      { name: "b", shape: [3], type: F32 },
    ], (t) => new Uint8Array(t.type === F32 ? 12 : 68).fill(5));
    const bytes = await Deno.readFile(full);
    const model = await openGguf(full);
    const last = model.tensors.get("b")!;
    model.close();
    const end = last.fileOffset + last.nbytes;
    const cut = `${dir}/cut.gguf`;
    for (let n = 0; n < end; n++) {
      await Deno.writeFile(cut, bytes.subarray(0, n));
      await assert.rejects(openGguf(cut), (e: unknown) => {
        assert.ok(e instanceof SyntaxError, `cut at ${n}: ${String(e)}`);
        assert.match(e.message, /\(at byte \d+\)$/, `cut at ${n}`);
        return true;
      });
    }
    await Deno.writeFile(cut, bytes.subarray(0, end));
    const exact = await openGguf(cut);
    assert.deepEqual(await exact.readTensor("b"), new Uint8Array(12).fill(5));
    exact.close();
  }));

Deno.test("random corruption gives a SyntaxError or a consistent model, never another failure", () =>
  withTempDir(async (dir) => {
    const src = `${dir}/src.gguf`;
    await writeGguf(src, [
      { key: "general.alignment", type: "u32", value: 32 },
      { key: "v", type: "array", itemType: "i32", value: [1, -2, 3] },
      { key: "s", type: "array", itemType: "string", value: ["a", "b"] },
    ], [
      { name: "x", shape: [32], type: GgmlType.Q4_0 },
      { name: "y", shape: [2, 2], type: GgmlType.F16 },
    ], (t) => new Uint8Array(t.type === GgmlType.Q4_0 ? 18 : 8));
    const original = await Deno.readFile(src);
    const headerEnd = 200;
    let seed = 12345;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return seed % n;
    };
    const path = `${dir}/mutant.gguf`;
    let opened = 0;
    for (let round = 0; round < 300; round++) {
      const bytes = original.slice();
      for (let k = 1 + rand(3); k > 0; k--) bytes[rand(headerEnd)] = rand(256);
      await Deno.writeFile(path, bytes);
      try {
        const model = await openGguf(path);
        opened++;
        for (const [name, t] of model.tensors) {
          assert.ok(t.fileOffset + t.nbytes <= bytes.length, name);
          assert.equal((await model.readTensor(name)).length, t.nbytes);
        }
        model.close();
      } catch (e) {
        assert.ok(e instanceof SyntaxError, `round ${round}: ${String(e)}`);
      }
    }
    // Some mutations land in string bytes or values and leave a valid file.
    assert.ok(opened > 0 && opened < 300, `${opened} of 300 mutants opened`);
  }));

Deno.test("a 40 GB model opens from its header alone and reads its last bytes", () =>
  withTempDir(async (dir) => {
    const n = 40e9;
    const header = new Bytes().header(1, 1).str("k").u32(4).u32(1)
      .tensor("big", [n], GgmlType.I8, 0).pad(32);
    const path = await put(dir, "sparse.gguf", header.bytes());
    await Deno.truncate(path, header.length + n);
    const file = await Deno.open(path, { write: true });
    await file.seek(header.length + n - 4, Deno.SeekMode.Start);
    await file.write(Uint8Array.from([9, 8, 7, 6]));
    file.close();

    const t0 = performance.now();
    const model = await openGguf(path);
    // Reading the 40 GB would take minutes; the header is under 100 bytes.
    assert.ok(performance.now() - t0 < 1000, `open took ${performance.now() - t0} ms`);
    try {
      assert.equal(model.tensors.get("big")!.nbytes, n);
      assert.deepEqual(await model.readTensorBytes("big", n - 4, 4), Uint8Array.from([9, 8, 7, 6]));
      assert.deepEqual(await model.readTensorBytes("big", 1e9, 3), new Uint8Array(3));
    } finally {
      model.close();
    }
  }));

Deno.test("concurrent tensor reads each get their own bytes", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/many.gguf`;
    const plan = Array.from(
      { length: 20 },
      (_, i) => ({ name: `t${i}`, shape: [i + 1], type: F32 }),
    );
    await writeGguf(path, [], plan, (_, i) => new Uint8Array(4 * (i + 1)).fill(i));
    const model = await openGguf(path);
    try {
      const all = await Promise.all(plan.map((t) => model.readTensor(t.name)));
      all.forEach((bytes, i) => assert.deepEqual(bytes, new Uint8Array(4 * (i + 1)).fill(i)));
    } finally {
      model.close();
    }
  }));

Deno.test("reads outside a tensor, of unknown tensors, or after close are refused", () =>
  withTempDir(async (dir) => {
    const model = await openGguf(await put(dir, "m.gguf", validFile().bytes()));
    const cases: [string, number, number, RegExp][] = [
      ["nope", 0, 1, /Cannot read tensor "nope": ".*m\.gguf" has no tensor of that name/],
      ["t", 0, 17, /bytes 0\.\.17 of tensor "t": it has 16 bytes/],
      ["t", 16, 1, /bytes 16\.\.17/],
      ["t", -1, 2, /bytes -1\.\.1/],
      ["t", 0.5, 1, /bytes 0\.5\.\.1\.5/],
      ["t", 0, NaN, /bytes 0\.\.NaN/],
    ];
    for (const [name, start, length, pattern] of cases) {
      await assert.rejects(model.readTensorBytes(name, start, length), (e: unknown) => {
        assert.ok(e instanceof RangeError, String(e));
        assert.match(e.message, pattern);
        return true;
      });
    }
    await assert.rejects(model.readTensor("nope"), RangeError);
    assert.deepEqual(await model.readTensorBytes("t", 16, 0), new Uint8Array());
    model.close();
    await assert.rejects(model.readTensor("t"), Deno.errors.BadResource);
  }));

Deno.test("a missing file is reported by Deno as NotFound", async () => {
  await assert.rejects(openGguf("/nonexistent/model.gguf"), Deno.errors.NotFound);
});
