// engine/gguf/gguf_model.ts: a metadata value as an error message shows it, exactly as stored and
// at most 80 characters, however large the value.

import assert from "node:assert/strict";
import { describeValue } from "./gguf_model.ts";

Deno.test("values are shown as stored: bigints in full, non-finite numbers by name, text quoted", () => {
  assert.equal(describeValue(undefined), "missing");
  assert.equal(describeValue(2n ** 64n - 1n), "18446744073709551615");
  assert.equal(describeValue(NaN), "NaN");
  assert.equal(describeValue(-Infinity), "-Infinity");
  assert.equal(describeValue(1e-45), "1e-45");
  assert.equal(describeValue(true), "true");
  assert.equal(describeValue('a "b"'), '"a \\"b\\""');
  assert.equal(describeValue([3, -901458906, 2, 0]), "[3,-901458906,2,0]");
  assert.equal(describeValue([[1, NaN], ["x"]]), '[[1,NaN],["x"]]');
  assert.equal(describeValue([]), "[]");
});

Deno.test("a long value is cut to 80 characters without writing it whole", () => {
  const huge = Array.from({ length: 1_000_000 }, (_, i) => i);
  const shown = describeValue(huge);
  assert.equal(shown, `${JSON.stringify(huge).slice(0, 80)}…`);
  assert.equal(describeValue("y".repeat(10_000_000)), `"${"y".repeat(79)}…`);
});
