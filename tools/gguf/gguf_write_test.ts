// Tests for tools/gguf/gguf_write.ts: byte layout, metadata and tensor round trips through openGguf,
// alignment, gguf-split output, and refusal of plans the reader could not read back.

import assert from "node:assert/strict";
import { GgmlType } from "../../engine/quant/ggml_types.ts";
import { Bytes, withTempDir } from "../../engine/gguf/_gguf_bytes.ts";
import { readHeader } from "../../engine/gguf/header.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import type { GgufValue } from "../../engine/gguf/gguf_model.ts";
import { type GgufMetaEntry, type GgufTensorPlan, metaEntryOf, writeGguf } from "./gguf_write.ts";

/** Deterministic bytes so every tensor's content differs. */
function pattern(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = seed * 2654435761 >>> 0;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    out[i] = x >>> 24;
  }
  return out;
}

Deno.test("writeGguf writes the GGUF v3 layout byte for byte", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/tiny.gguf`;
    const data = Uint8Array.from([1, 2, 3, 4, 5, 6, 7, 8]);
    await writeGguf(
      path,
      [{ key: "a", type: "u16", value: 513 }, {
        key: "b",
        type: "array",
        itemType: "string",
        value: ["x"],
      }],
      [{ name: "t", shape: [2], type: GgmlType.F32 }],
      () => data,
    );
    const expected = new Bytes().header(1, 2)
      .str("a").u32(2).raw([1, 2])
      .str("b").u32(9).u32(8).u64(1).str("x")
      .tensor("t", [2], 0, 0).pad(32)
      .raw(data).pad(32).bytes();
    assert.deepEqual(await Deno.readFile(path), expected);
  }));

Deno.test("every metadata type round-trips, including nested arrays and 64-bit extremes", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/meta.gguf`;
    const big = 2n ** 60n + 1n;
    const meta: GgufMetaEntry[] = [
      { key: "u8", type: "u8", value: 255 },
      { key: "i8", type: "i8", value: -128 },
      { key: "u16", type: "u16", value: 65535 },
      { key: "i16", type: "i16", value: -32768 },
      { key: "u32", type: "u32", value: 4294967295 },
      { key: "i32", type: "i32", value: -2147483648 },
      { key: "u64.small", type: "u64", value: 7n },
      { key: "u64.safe", type: "u64", value: Number.MAX_SAFE_INTEGER },
      { key: "u64.big", type: "u64", value: big },
      { key: "u64.max", type: "u64", value: 2n ** 64n - 1n },
      { key: "i64.neg", type: "i64", value: -5 },
      { key: "i64.min", type: "i64", value: -(2n ** 63n) },
      { key: "f32", type: "f32", value: 0.1 },
      { key: "f64", type: "f64", value: 0.1 },
      { key: "f64.nan", type: "f64", value: NaN },
      { key: "bool.t", type: "bool", value: true },
      { key: "bool.f", type: "bool", value: false },
      { key: "string", type: "string", value: "héllo ✓ 𝄞" },
      { key: "string.empty", type: "string", value: "" },
      { key: "arr.u8", type: "array", itemType: "u8", value: [0, 1, 255] },
      { key: "arr.i16", type: "array", itemType: "i16", value: [-1, 2] },
      { key: "arr.i32", type: "array", itemType: "i32", value: [-7, 1 << 30] },
      { key: "arr.u64", type: "array", itemType: "u64", value: [1, big] },
      { key: "arr.f32", type: "array", itemType: "f32", value: [1.5, 0.1] },
      { key: "arr.bool", type: "array", itemType: "bool", value: [true, false] },
      { key: "arr.string", type: "array", itemType: "string", value: ["a", "", "ü"] },
      { key: "arr.empty", type: "array", itemType: "f64", value: [] },
      {
        key: "arr.nested",
        type: "array",
        itemType: "array",
        value: [
          { itemType: "u32", value: [1, 2] },
          { itemType: "string", value: ["z"] },
          { itemType: "array", value: [{ itemType: "bool", value: [true] }] },
        ],
      },
    ];
    // Eight levels, the deepest the reader accepts.
    let deep: GgufValue = [3];
    let deepEntry: { itemType: "array"; value: never[] } | { itemType: "i8"; value: number[] } = {
      itemType: "i8",
      value: [3],
    };
    for (let level = 2; level < 8; level++) {
      deep = [deep];
      deepEntry = { itemType: "array", value: [deepEntry as never] };
    }
    meta.push({ key: "arr.deep", type: "array", itemType: "array", value: [deepEntry as never] });
    deep = [deep];

    await writeGguf(path, meta, [], () => new Uint8Array());
    const model = await openGguf(path);
    try {
      const expected: [string, GgufValue][] = [
        ["u8", 255],
        ["i8", -128],
        ["u16", 65535],
        ["i16", -32768],
        ["u32", 4294967295],
        ["i32", -2147483648],
        ["u64.small", 7],
        ["u64.safe", Number.MAX_SAFE_INTEGER],
        ["u64.big", big],
        ["u64.max", 2n ** 64n - 1n],
        ["i64.neg", -5],
        ["i64.min", -(2n ** 63n)],
        ["f32", Math.fround(0.1)],
        ["f64", 0.1],
        ["f64.nan", NaN],
        ["bool.t", true],
        ["bool.f", false],
        ["string", "héllo ✓ 𝄞"],
        ["string.empty", ""],
        ["arr.u8", [0, 1, 255]],
        ["arr.i16", [-1, 2]],
        ["arr.i32", [-7, 1 << 30]],
        ["arr.u64", [1, big]],
        ["arr.f32", [1.5, Math.fround(0.1)]],
        ["arr.bool", [true, false]],
        ["arr.string", ["a", "", "ü"]],
        ["arr.empty", []],
        ["arr.nested", [[1, 2], ["z"], [[true]]]],
        ["arr.deep", deep],
      ];
      assert.deepEqual([...model.metadata.entries()], expected);
      assert.equal(model.version, 3);
      assert.equal(model.tensors.size, 0);
      // Written back with the types it was read with, the file is the same byte for byte.
      const copy = [...model.metadata].map(([key, value]) =>
        metaEntryOf(key, value, model.metadataTypes.get(key)!)
      );
      await writeGguf(`${dir}/copy.gguf`, copy, [], () => new Uint8Array());
      assert.deepEqual(await Deno.readFile(`${dir}/copy.gguf`), await Deno.readFile(path));
    } finally {
      model.close();
    }
  }));

const PLAN: GgufTensorPlan[] = [
  { name: "token_embd.weight", shape: [64, 5], type: GgmlType.F16 },
  { name: "blk.0.attn_norm.weight", shape: [64], type: GgmlType.F32 },
  { name: "blk.0.ffn_gate_exps.weight", shape: [512, 3, 2], type: GgmlType.Q4_K },
  { name: "blk.0.ffn_down_exps.weight", shape: [256, 2, 2], type: GgmlType.IQ4_XS },
  { name: "blk.0.attn_q.weight", shape: [96, 3], type: GgmlType.Q8_0 },
  { name: "blk.0.ssm_a", shape: [7], type: GgmlType.I32 },
  { name: "output.weight", shape: [256, 4], type: GgmlType.Q6_K },
];
/** Byte sizes worked out by hand from the block geometry in docs/model_arch.md §6. */
const PLAN_BYTES = [64 * 5 * 2, 64 * 4, 2 * 144 * 3 * 2, 136 * 2 * 2, 3 * 34 * 3, 7 * 4, 210 * 4];
const PLAN_META: GgufMetaEntry[] = [
  { key: "general.architecture", type: "string", value: "qwen3next" },
  { key: "qwen3next.block_count", type: "u32", value: 1 },
];

for (const alignment of [32, 64]) {
  Deno.test(`tensors of several types round-trip with alignment ${alignment}`, () =>
    withTempDir(async (dir) => {
      const path = `${dir}/m.gguf`;
      const calls: number[] = [];
      const paths = await writeGguf(path, PLAN_META, PLAN, (t, i) => {
        calls.push(i);
        assert.equal(t, PLAN[i]);
        return pattern(PLAN_BYTES[i], i);
      }, { alignment });
      assert.deepEqual(paths, [path]);
      assert.deepEqual(calls, [0, 1, 2, 3, 4, 5, 6]);
      const model = await openGguf(path);
      try {
        assert.equal(model.metadata.get("general.alignment"), alignment === 32 ? undefined : 64);
        assert.deepEqual([...model.tensors.keys()], PLAN.map((t) => t.name));
        for (const [i, plan] of PLAN.entries()) {
          const info = model.tensors.get(plan.name)!;
          assert.deepEqual(info.shape, plan.shape);
          assert.equal(info.type, plan.type);
          assert.equal(info.nbytes, PLAN_BYTES[i]);
          assert.equal(info.shard, 0);
          assert.equal(info.fileOffset % alignment, 0);
          assert.deepEqual(await model.readTensor(plan.name), pattern(PLAN_BYTES[i], i));
        }
        const last = model.tensors.get("output.weight")!;
        const fileSize = (await Deno.stat(path)).size;
        assert.equal(fileSize, Math.ceil((last.fileOffset + last.nbytes) / alignment) * alignment);
        const rows = await model.readTensorBytes("blk.0.ffn_gate_exps.weight", 864, 288);
        assert.deepEqual(rows, pattern(PLAN_BYTES[2], 2).subarray(864, 864 + 288));
      } finally {
        model.close();
      }
    }));
}

for (const shards of [1, 2, 3]) {
  Deno.test(`a model split into ${shards} shard(s) reads back like the single file`, () =>
    withTempDir(async (dir) => {
      await writeGguf(`${dir}/one.gguf`, PLAN_META, PLAN, (_, i) => pattern(PLAN_BYTES[i], i));
      const paths = await writeGguf(
        `${dir}/split.gguf`,
        PLAN_META,
        PLAN,
        (_, i) => pattern(PLAN_BYTES[i], i),
        { shards, alignment: 64 },
      );
      const names = shards === 1
        ? ["split.gguf"]
        : Array.from({ length: shards }, (_, i) => `split-0000${i + 1}-of-0000${shards}.gguf`);
      assert.deepEqual(paths, names.map((n) => `${dir}/${n}`));

      const one = await openGguf(`${dir}/one.gguf`);
      const split = await openGguf(paths[0]);
      try {
        assert.deepEqual(split.shardPaths, paths);
        const splitKeys = ["split.no", "split.count", "split.tensors.count"];
        const meta = [...split.metadata].filter(([k]) => !splitKeys.includes(k));
        assert.deepEqual(meta, [...one.metadata, ["general.alignment", 64]]);
        if (shards > 1) {
          assert.deepEqual(splitKeys.map((k) => split.metadata.get(k)), [0, shards, PLAN.length]);
        }
        assert.deepEqual([...split.tensors.keys()], [...one.tensors.keys()]);
        const perShard = Array.from(
          { length: shards },
          (_, s) => [...split.tensors.values()].filter((t) => t.shard === s).length,
        );
        const even = Array.from(
          { length: shards },
          (_, s) => Math.floor((s + 1) * 7 / shards) - Math.floor(s * 7 / shards),
        );
        assert.deepEqual(perShard, even);
        for (const name of one.tensors.keys()) {
          assert.deepEqual(await split.readTensor(name), await one.readTensor(name));
        }
      } finally {
        one.close();
        split.close();
      }
      for (const [s, p] of paths.entries()) {
        if (s === 0) continue;
        const file = await Deno.open(p);
        try {
          const h = await readHeader(file, p);
          assert.deepEqual([...h.metadata], [
            ["split.no", s],
            ["split.count", shards],
            ["split.tensors.count", PLAN.length],
            ["general.alignment", 64],
          ]);
        } finally {
          file.close();
        }
      }
    }));
}

Deno.test("writeGguf refuses data of the wrong size, naming the tensor", () =>
  withTempDir(async (dir) => {
    await assert.rejects(
      writeGguf(
        `${dir}/m.gguf`,
        [],
        PLAN,
        (_, i) => new Uint8Array(PLAN_BYTES[i] + (i === 2 ? 1 : 0)),
      ),
      (e: unknown) =>
        e instanceof RangeError &&
        /"blk\.0\.ffn_gate_exps\.weight".*1729 bytes, expected 1728/.test(e.message),
    );
  }));

Deno.test("writeGguf refuses plans and metadata the reader could not read back", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/bad.gguf`;
    const none = () => new Uint8Array();
    const cases: [GgufMetaEntry[], GgufTensorPlan[], object, ErrorConstructor, RegExp][] = [
      [
        [{ key: "k", type: "u8", value: 256 }],
        [],
        {},
        RangeError,
        /"k" as u8: 256 is outside 0\.\.255/,
      ],
      [[{ key: "k", type: "i32", value: 1.5 }], [], {}, TypeError, /not an integer/],
      [[{ key: "k", type: "u64", value: -1n }], [], {}, RangeError, /outside 0\.\./],
      [[{ key: "k", type: "bool", value: 1 }], [], {}, TypeError, /not a boolean/],
      [[{ key: "k", type: "string", value: 3 }], [], {}, TypeError, /not a string/],
      [[{ key: "k", type: "u128" as "u8", value: 3 }], [], {}, TypeError, /"u128" is not a GGUF/],
      [
        [{ key: "k", type: "u8", value: 1 }, { key: "k", type: "u8", value: 1 }],
        [],
        {},
        TypeError,
        /"k".*repeated/,
      ],
      [
        [{ key: "split.count", type: "u16", value: 2 }],
        [],
        { shards: 2 },
        TypeError,
        /split\.\* key/,
      ],
      [
        [{ key: "general.alignment", type: "u32", value: 64 }],
        [],
        { alignment: 32 },
        RangeError,
        /agree/,
      ],
      [[], [], { alignment: 48 }, RangeError, /power of two/],
      [[], [], { shards: 0 }, RangeError, /0 shards/],
      [
        [],
        [{ name: "a", shape: [4], type: GgmlType.F32 }, {
          name: "a",
          shape: [4],
          type: GgmlType.F32,
        }],
        {},
        TypeError,
        /"a" is missing or repeated/,
      ],
      [
        [],
        [{ name: "q", shape: [33], type: GgmlType.Q8_0 }],
        {},
        RangeError,
        /not a multiple of the block size 32/,
      ],
      [
        [],
        [{ name: "q", shape: [1, 1, 1, 1, 1], type: GgmlType.F32 }],
        {},
        RangeError,
        /5 dimensions/,
      ],
      [[], [{ name: "q", shape: [4, 0], type: GgmlType.F32 }], {}, RangeError, /dimension 0/],
      [[], [{ name: "q", shape: [4], type: 16 as GgmlType }], {}, RangeError, /IQ2_XXS|type 16/],
    ];
    for (const [i, [meta, tensors, options, kind, pattern]] of cases.entries()) {
      await assert.rejects(
        writeGguf(path, meta, tensors, none, options),
        (e: unknown) => e instanceof kind && pattern.test(e.message),
        `case ${i}`,
      );
    }
    let tooDeep: { itemType: "u8"; value: number[] } | { itemType: "array"; value: never[] } = {
      itemType: "u8",
      value: [],
    };
    // Nine levels: one more than the reader accepts.
    for (let level = 1; level < 9; level++) {
      tooDeep = { itemType: "array", value: [tooDeep as never] };
    }
    await assert.rejects(
      writeGguf(path, [{ key: "d", type: "array", ...tooDeep }], [], none),
      (e: unknown) => e instanceof RangeError && /deeper than 8/.test(e.message),
    );
  }));

Deno.test("a vocabulary-sized header round-trips across header buffer growth", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/vocab.gguf`;
    const tokens = Array.from({ length: 30000 }, (_, i) => `Ġtok${i}`);
    const types = Array.from({ length: 30000 }, (_, i) => i % 7 - 3);
    const meta: GgufMetaEntry[] = [
      { key: "tokenizer.ggml.tokens", type: "array", itemType: "string", value: tokens },
      { key: "tokenizer.ggml.token_type", type: "array", itemType: "i32", value: types },
      { key: "after", type: "u64", value: 2n ** 60n },
      { key: "f", type: "f64", value: -2.5 },
    ];
    await writeGguf(path, meta, PLAN, (_, i) => pattern(PLAN_BYTES[i], i));
    const model = await openGguf(path);
    try {
      assert.deepEqual(model.metadata.get("tokenizer.ggml.tokens"), tokens);
      assert.deepEqual(model.metadata.get("tokenizer.ggml.token_type"), types);
      assert.equal(model.metadata.get("after"), 2n ** 60n);
      assert.equal(model.metadata.get("f"), -2.5);
      assert.deepEqual(await model.readTensor("output.weight"), pattern(PLAN_BYTES[6], 6));
    } finally {
      model.close();
    }
  }));

Deno.test("tensors larger than the write buffer stay in order with small ones around them", () =>
  withTempDir(async (dir) => {
    const path = `${dir}/large.gguf`;
    const plan: GgufTensorPlan[] = [
      { name: "a", shape: [3], type: GgmlType.F32 },
      { name: "big", shape: [1024, 1300], type: GgmlType.F32 },
      { name: "b", shape: [5], type: GgmlType.F32 },
    ];
    const sizes = [12, 1024 * 1300 * 4, 20];
    await writeGguf(path, [], plan, (_, i) => pattern(sizes[i], i));
    const bytes = await Deno.readFile(path);
    const model = await openGguf(path);
    try {
      for (const [i, t] of plan.entries()) {
        const info = model.tensors.get(t.name)!;
        assert.deepEqual(
          bytes.subarray(info.fileOffset, info.fileOffset + sizes[i]),
          pattern(sizes[i], i),
        );
      }
    } finally {
      model.close();
    }
  }));
