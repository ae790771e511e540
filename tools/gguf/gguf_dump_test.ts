// Tests for tools/gguf/gguf_dump.ts: value abbreviation and the tensor table of a small written model.
// Runs the formatter on a file made by tools/gguf/gguf_write.ts, as the tool would on a real model.

import assert from "node:assert/strict";
import { GgmlType } from "../../engine/quant/ggml_types.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import { writeGguf } from "./gguf_write.ts";
import { formatModel, formatValue } from "./gguf_dump.ts";

Deno.test("formatValue abbreviates long arrays and marks bigints", () => {
  assert.equal(formatValue([1, 2, 3, 4], 2), "[1, 2, … (4 items)]");
  assert.equal(formatValue([["a"], [true]], 8), '[["a"], [true]]');
  assert.equal(formatValue(2n ** 60n, 8), "1152921504606846976n");
});

Deno.test("formatModel lists metadata and one aligned row per tensor", async () => {
  const dir = await Deno.makeTempDir({ prefix: "gguf_dump_test_" });
  try {
    const path = `${dir}/m.gguf`;
    await writeGguf(
      path,
      [{ key: "tokens", type: "array", itemType: "string", value: ["a", "b", "c"] }],
      [
        { name: "token_embd.weight", shape: [32, 2], type: GgmlType.Q8_0 },
        { name: "norm", shape: [4], type: GgmlType.F32 },
      ],
      (t) => new Uint8Array(t.type === GgmlType.F32 ? 16 : 68),
    );
    const model = await openGguf(path);
    const text = formatModel(model, 2);
    model.close();
    const lines = text.split("\n");
    assert.equal(lines[0], `${path}: GGUF v3, 1 file(s), 1 keys, 2 tensors`);
    assert.equal(lines[1], '  tokens = ["a", "b", … (3 items)]');
    assert.deepEqual(lines.slice(2).map((l) => l.split(/\s+/).filter(Boolean)), [
      ["name", "type", "shape", "bytes", "shard", "offset"],
      ["token_embd.weight", "Q8_0", "[32,", "2]", "68", "0", "192"],
      ["norm", "F32", "[4]", "16", "0", "288"],
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
