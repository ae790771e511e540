// Tests of lib/grammar/json_schema.ts: checking a model's tool-call arguments against a schema
// (paths and keywords in the messages, $ref, linear-time patterns), and allOf merging.

import assert from "node:assert/strict";
import type { Json, JsonObject } from "../server/fields.ts";
import { mergeSchemas, schemaError } from "./json_schema.ts";

const schema: JsonObject = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 2, maxLength: 6, pattern: "^[A-Z]" },
    days: { type: "integer", minimum: 1, maximum: 14 },
    unit: { enum: ["c", "f"] },
    tags: { type: "array", items: { type: "string", maxLength: 3 }, maxItems: 2 },
    exact: { type: ["boolean", "null"] },
    where: { $ref: "#/$defs/place" },
  },
  required: ["city", "days"],
  additionalProperties: false,
  $defs: {
    place: { type: "object", properties: { lat: { type: "number", exclusiveMaximum: 90 } } },
  },
};

Deno.test("schemaError names the path and the broken keyword", () => {
  assert.equal(schemaError({ city: "Rome", days: 3, where: { lat: 45 } }, schema), null);
  const cases: [Json, string][] = [
    [{ days: 3 }, 'input: missing required property "city"'],
    [{ city: "Rome", days: 3.5 }, "input.days: expected integer, got a number"],
    [{ city: "Rome", days: 30 }, "input.days: expected a number ≤ 14, got 30"],
    [{ city: "R", days: 1 }, "input.city: expected at least 2 characters, got 1"],
    [{ city: "rome", days: 1 }, 'input.city: "rome" does not match ^[A-Z]'],
    [{ city: "Rome", days: 1, unit: "k" }, 'input.unit: expected one of ["c","f"], got "k"'],
    [
      { city: "Rome", days: 1, tags: ["a", "b", "c"] },
      "input.tags: expected at most 2 items, got 3",
    ],
    [{ city: "Rome", days: 1, other: 1 }, 'input: unexpected property "other"'],
    [
      { city: "Rome", days: 1, exact: "yes" },
      "input.exact: expected boolean or null, got a string",
    ],
    [
      { city: "Rome", days: 1, where: { lat: 90 } },
      "input.where.lat: expected a number < 90, got 90",
    ],
  ];
  for (const [value, message] of cases) assert.equal(schemaError(value, schema), message);
  assert.equal(schemaError(1, { anyOf: [{ type: "string" }, { type: "integer" }] }), null);
  // oneOf is generated as anyOf, so it is checked as anyOf.
  assert.equal(schemaError(1, { oneOf: [{ type: "number" }, { type: "integer" }] }), null);
  assert.match(schemaError("x", { oneOf: [{ type: "number" }] })!, /expected number/);
});

Deno.test("a hostile pattern is checked in linear time; one this engine cannot run is skipped", () => {
  const hostile = { type: "string", pattern: "^(.+)+\\u0000$", minLength: 40 };
  const t0 = performance.now();
  assert.match(schemaError("a".repeat(5000), hostile)!, /does not match/);
  assert.ok(performance.now() - t0 < 1000);
  assert.equal(schemaError("ab", { type: "string", pattern: "(?<=a)b" }), null);
  assert.match(schemaError("ab", { type: "string", pattern: "(" })!, /cannot use the pattern/);
});

Deno.test("allOf members merge: properties, required, types and bounds", () => {
  const merged = mergeSchemas(
    {
      type: ["object", "null"],
      properties: { a: { type: "integer" } },
      required: ["a"],
      maxLength: 5,
    },
    { type: "object", properties: { a: { minimum: 1 }, b: {} }, required: ["b"], maxLength: 3 },
    "",
  );
  assert.deepEqual(merged, {
    type: ["object"],
    properties: { a: { allOf: [{ type: "integer" }, { minimum: 1 }] }, b: {} },
    required: ["a", "b"],
    maxLength: 3,
  });
  assert.throws(
    () => mergeSchemas({ pattern: "a" }, { pattern: "b" }, "x"),
    /x\.pattern: .* set "pattern" differently/,
  );
  assert.throws(
    () => mergeSchemas({ type: "string" }, { type: "integer" }, ""),
    /allow no common type/,
  );
});
