// Checks a tool call's arguments against the tool's input_schema (the JSON Schema keywords tool
// definitions use). Used by output.ts before a <tool_call> becomes a tool_use block.

import { describeJson, isObject, type Json } from "./fields.ts";

function typeMatches(value: Json, type: string): boolean {
  switch (type) {
    case "object":
      return isObject(value);
    case "array":
      return Array.isArray(value);
    case "string":
      return typeof value === "string";
    case "number":
      return typeof value === "number";
    case "integer":
      return typeof value === "number" && Number.isInteger(value);
    case "boolean":
      return typeof value === "boolean";
    case "null":
      return value === null;
    default:
      return true; // An unknown type name constrains nothing we can check.
  }
}

function equal(a: Json, b: Json): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

function at(path: string, key: string | number): string {
  return `${path}.${key}`;
}

/**
 * The first way `value` breaks `schema`, as "path: problem", or null when it fits. Supports
 * type, enum, const, properties, required, additionalProperties, items, min/maxItems,
 * min/maxLength, pattern, minimum, maximum, exclusiveMinimum/Maximum, anyOf, oneOf, allOf;
 * other keywords (format, description, …) are not checked.
 */
export function schemaError(value: Json, schema: Json, path = "input"): string | null {
  if (schema === true || schema === undefined) return null;
  if (schema === false) return `${path}: no value is allowed here`;
  if (!isObject(schema)) return null;
  const s = schema;
  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (!types.some((t) => typeof t === "string" && typeMatches(value, t))) {
      return `${path}: expected ${types.join(" or ")}, got ${describeJson(value)}`;
    }
  }
  if (Array.isArray(s.enum) && !s.enum.some((e) => equal(e, value))) {
    return `${path}: expected one of ${JSON.stringify(s.enum)}, got ${JSON.stringify(value)}`;
  }
  if (s.const !== undefined && !equal(s.const, value)) {
    return `${path}: expected ${JSON.stringify(s.const)}, got ${JSON.stringify(value)}`;
  }
  if (typeof value === "string") {
    const length = [...value].length;
    if (typeof s.minLength === "number" && length < s.minLength) {
      return `${path}: expected at least ${s.minLength} characters, got ${length}`;
    }
    if (typeof s.maxLength === "number" && length > s.maxLength) {
      return `${path}: expected at most ${s.maxLength} characters, got ${length}`;
    }
    if (typeof s.pattern === "string" && !new RegExp(s.pattern, "u").test(value)) {
      return `${path}: ${JSON.stringify(value)} does not match ${s.pattern}`;
    }
  }
  if (typeof value === "number") {
    const bounds: [Json | undefined, (n: number, b: number) => boolean, string][] = [
      [s.minimum, (n, b) => n >= b, "≥"],
      [s.maximum, (n, b) => n <= b, "≤"],
      [s.exclusiveMinimum, (n, b) => n > b, ">"],
      [s.exclusiveMaximum, (n, b) => n < b, "<"],
    ];
    for (const [bound, ok, sign] of bounds) {
      if (typeof bound === "number" && !ok(value, bound)) {
        return `${path}: expected a number ${sign} ${bound}, got ${value}`;
      }
    }
  }
  if (Array.isArray(value)) {
    if (typeof s.minItems === "number" && value.length < s.minItems) {
      return `${path}: expected at least ${s.minItems} items, got ${value.length}`;
    }
    if (typeof s.maxItems === "number" && value.length > s.maxItems) {
      return `${path}: expected at most ${s.maxItems} items, got ${value.length}`;
    }
    if (s.items !== undefined && !Array.isArray(s.items)) {
      for (let i = 0; i < value.length; i++) {
        const e = schemaError(value[i], s.items, at(path, i));
        if (e) return e;
      }
    }
  }
  if (isObject(value)) {
    const props = isObject(s.properties) ? s.properties : {};
    if (Array.isArray(s.required)) {
      for (const key of s.required) {
        if (typeof key === "string" && !(key in value)) {
          return `${path}: missing required property "${key}"`;
        }
      }
    }
    for (const [key, v] of Object.entries(value)) {
      if (key in props) {
        const e = schemaError(v, props[key], at(path, key));
        if (e) return e;
      } else if (s.additionalProperties === false) {
        return `${path}: unexpected property "${key}"`;
      } else if (isObject(s.additionalProperties)) {
        const e = schemaError(v, s.additionalProperties, at(path, key));
        if (e) return e;
      }
    }
  }
  if (Array.isArray(s.allOf)) {
    for (const sub of s.allOf) {
      const e = schemaError(value, sub, path);
      if (e) return e;
    }
  }
  for (const key of ["anyOf", "oneOf"] as const) {
    const subs = s[key];
    if (Array.isArray(subs)) {
      const errors = subs.map((sub) => schemaError(value, sub, path));
      const fits = errors.filter((e) => e === null).length;
      if (fits === 0) return errors[0] ?? `${path}: ${key} has no alternatives`;
      if (key === "oneOf" && fits > 1) return `${path}: matches ${fits} oneOf alternatives`;
    }
  }
  return null;
}
