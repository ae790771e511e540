// JSON Schemas the structured-output tests constrain replies with, shared with the grammar
// engines' comparison (bench/grammar_specs.ts), so that it compares on the schemas the tests use.

import type { Json, JsonObject } from "../lib/server/fields.ts";

/**
 * A schema as Pydantic writes one: $defs, $ref, anyOf with null, enum, bounds, a pattern
 * (tests/http_structured_test.ts).
 */
export const ORDER: JsonObject = {
  $defs: {
    Line: {
      type: "object",
      title: "Line",
      properties: {
        sku: { type: "string", pattern: "^[A-Z]{2}\\d{2}$", title: "Sku" },
        qty: { type: "integer", minimum: 1, maximum: 9, title: "Qty" },
      },
      required: ["sku", "qty"],
      additionalProperties: false,
    },
  },
  type: "object",
  title: "Order",
  properties: {
    kind: { enum: ["buy", "sell"], title: "Kind" },
    note: { anyOf: [{ type: "string", maxLength: 6 }, { type: "null" }], default: null },
    lines: { type: "array", items: { $ref: "#/$defs/Line" }, minItems: 1, maxItems: 2 },
    rush: { type: "boolean" },
  },
  required: ["kind", "lines", "rush"],
  additionalProperties: false,
};

/**
 * Schemas as MCP servers and Pydantic write them, each leaning on different keywords
 * (lib/grammar/json_grammar_walk_test.ts).
 */
export const WALK_SCHEMAS: Readonly<Record<string, Json>> = {
  "$defs, $ref, anyOf with null, enum, pattern, integer bounds, additionalProperties false": {
    $defs: {
      Line: {
        type: "object",
        properties: {
          sku: { type: "string", pattern: "^[A-Z]{2}\\d{2}$" },
          qty: { type: "integer", minimum: 1, maximum: 9 },
        },
        required: ["sku", "qty"],
        additionalProperties: false,
      },
    },
    type: "object",
    properties: {
      kind: { enum: ["buy", "sell"] },
      note: { anyOf: [{ type: "string", maxLength: 6 }, { type: "null" }], default: null },
      lines: { type: "array", items: { $ref: "#/$defs/Line" }, minItems: 1, maxItems: 2 },
    },
    required: ["kind", "lines"],
    additionalProperties: false,
  },
  "oneOf of disjoint objects told apart by const, exclusive decimal bounds": {
    oneOf: [
      {
        type: "object",
        properties: {
          shape: { const: "circle" },
          r: { type: "number", exclusiveMinimum: 0, exclusiveMaximum: 2.5 },
        },
        required: ["shape", "r"],
        additionalProperties: false,
      },
      {
        type: "object",
        properties: {
          shape: { const: "rect" },
          w: { type: "integer", minimum: -3, maximum: 300 },
          h: { type: "number", minimum: -0.5, maximum: 0.5 },
        },
        required: ["shape", "w"],
        additionalProperties: false,
      },
    ],
  },
  "nested objects and arrays, string lengths, additionalProperties as a schema": {
    type: "object",
    properties: {
      user: {
        type: "object",
        properties: {
          name: { type: "string", minLength: 2, maxLength: 5 },
          tags: {
            type: "array",
            items: { type: "string", enum: ["a", 'b"', "é"] },
            maxItems: 3,
          },
        },
        required: ["name"],
      },
      scores: { type: "object", additionalProperties: { type: "integer", maximum: 5 } },
      flags: { type: "array", prefixItems: [{ type: "boolean" }, { type: "null" }], items: false },
    },
    required: ["user", "scores"],
  },
  "recursion through $ref, type lists, allOf, const values": {
    $defs: {
      node: {
        type: "object",
        properties: {
          v: { type: ["integer", "string"], maxLength: 3 },
          kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 },
        },
        required: ["v"],
        additionalProperties: false,
      },
    },
    allOf: [
      { $ref: "#/$defs/node" },
      { properties: { v: { const: 7 } } },
    ],
  },
  "a free object (json_object)": { type: "object" },
};

/** A Pydantic-like order, with a pattern, a format and decimal bounds (lib/grammar/token_mask_test.ts). */
export const PYDANTIC_LIKE: JsonObject = {
  $defs: {
    Item: {
      type: "object",
      properties: {
        sku: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
        qty: { type: "integer", minimum: 1, maximum: 99 },
        price: { type: "number", exclusiveMinimum: 0, maximum: 1000 },
      },
      required: ["sku", "qty"],
      additionalProperties: false,
    },
  },
  type: "object",
  properties: {
    kind: { enum: ["order", "quote"] },
    when: { type: "string", format: "date" },
    note: { anyOf: [{ type: "string", maxLength: 8 }, { type: "null" }] },
    items: { type: "array", items: { $ref: "#/$defs/Item" }, minItems: 1, maxItems: 3 },
    flags: { type: "array", items: { type: "boolean" }, maxItems: 2 },
  },
  required: ["kind", "items"],
  additionalProperties: false,
};
