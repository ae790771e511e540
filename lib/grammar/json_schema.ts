// JSON Schema as tools, response formats and /completion send it: keyword vocabulary, $ref and allOf
// resolution, and checking a value (a model's tool call). Used by json_grammar.ts and lib/server/output.ts.

import { describeJson, isObject, type Json, type JsonObject } from "../server/fields.ts";
import type { CharSet } from "./charset.ts";
import { compilePattern, type Pattern, PatternError } from "./regex.ts";

/** A schema that cannot be used, with the path of the offending part (dots from its root). */
export class SchemaError extends Error {
  override name = "SchemaError";
  constructor(readonly path: string, readonly problem: string) {
    super(`${path ? `${path}: ` : ""}${problem}`);
  }
}

/** Keywords that constrain values and that generation and checking both honour. */
export const SUPPORTED_KEYWORDS: readonly string[] = [
  "type",
  "enum",
  "const",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "additionalItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "anyOf",
  "oneOf",
  "allOf",
  "$ref",
  "nullable",
];

/** Vocabulary keywords that constrain values in ways this server cannot generate. */
const UNSUPPORTED_KEYWORDS: ReadonlySet<string> = new Set([
  "not",
  "if",
  "then",
  "else",
  "dependentSchemas",
  "dependentRequired",
  "dependencies",
  "unevaluatedProperties",
  "unevaluatedItems",
  "contains",
  "minContains",
  "maxContains",
  "propertyNames",
  "patternProperties",
  "minProperties",
  "maxProperties",
  "multipleOf",
  "$dynamicRef",
  "$recursiveRef",
]);

/** `format` values generation enforces, as patterns over the string; others are annotations. */
export const FORMAT_PATTERNS: Readonly<Record<string, string>> = {
  date: "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$",
  time: "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  "date-time": "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d" +
    "(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  uuid: "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
};

export const TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"] as const;
export type JsonType = typeof TYPES[number];

/** The UTF-8 bytes the cheapest member of `set` takes inside a JSON string (escapes included). */
export function jsonStringCost(set: CharSet): number {
  if (set.meets(0x20, 0x21) || set.meets(0x23, 0x5b) || set.meets(0x5d, 0x7f)) return 1;
  if ([0x22, 0x5c, 8, 9, 10, 12, 13].some((c) => set.has(c))) return 2;
  if (set.meets(0, 0x1f)) return 6;
  return set.minUtf8Bytes();
}

const patterns = new Map<string, Pattern | PatternError>();

/**
 * A pattern compiled once (tool schemas repeat on every turn of an agent). A pattern this engine
 * cannot run (lookaround, backreferences, too large) is a SchemaError when `strict` (it is to be
 * generated); otherwise it is null when ECMAScript accepts it (it goes unchecked) and a
 * SchemaError only when it is not a valid pattern at all.
 */
export function schemaPattern(source: string, path: string, strict: boolean): Pattern | null {
  let p = patterns.get(source);
  if (!p) {
    try {
      p = compilePattern(source, jsonStringCost);
    } catch (e) {
      if (!(e instanceof PatternError)) throw e;
      p = e;
    }
    if (patterns.size >= 256) patterns.delete(patterns.keys().next().value!);
    patterns.set(source, p);
  }
  if (!(p instanceof PatternError)) return p;
  if (!strict && validEcmaScript(source)) return null;
  throw new SchemaError(path, `cannot use the pattern ${JSON.stringify(source)}: ${p.message}`);
}

/** Whether ECMAScript compiles the pattern (compiling runs no match, so it cannot blow up). */
function validEcmaScript(source: string): boolean {
  try {
    new RegExp(source, "u");
    return true;
  } catch {
    return false;
  }
}

function join(path: string, key: string | number): string {
  return path ? `${path}.${key}` : String(key);
}

/** A subschema with the document it belongs to (for `$ref`) and its path. */
export interface Located {
  readonly schema: Json;
  readonly path: string;
}

/** Resolves `$ref`s of one schema document (local JSON pointers only). */
export class SchemaDocument {
  constructor(readonly root: Json) {}

  /** `schema` with `$ref` followed (siblings of a `$ref` merged in), as a plain object or boolean. */
  resolve(schema: Json, path: string, depth = 0): Located {
    if (!isObject(schema) || typeof schema.$ref !== "string") return { schema, path };
    if (depth > 32) throw new SchemaError(path, "$ref chains deeper than 32 are not supported");
    const target = this.#pointer(schema.$ref, join(path, "$ref"));
    const { $ref: _, ...siblings } = schema;
    const resolved = this.resolve(target.schema, target.path, depth + 1);
    if (!hasConstraints(siblings)) return resolved;
    return { schema: mergeSchemas(resolved.schema, siblings, path), path };
  }

  #pointer(ref: string, path: string): Located {
    if (!ref.startsWith("#")) {
      throw new SchemaError(path, `only local references ("#/…") are supported, got "${ref}"`);
    }
    let node: Json | undefined = this.root;
    let at = "";
    for (const raw of ref.slice(1).split("/").slice(1)) {
      const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
      node = Array.isArray(node) ? node[Number(key)] : isObject(node) ? node[key] : undefined;
      at = join(at, key);
      if (node === undefined) throw new SchemaError(path, `"${ref}" points to nothing`);
    }
    return { schema: node, path: at };
  }
}

/** Whether a schema object has any keyword that constrains values. */
export function hasConstraints(schema: JsonObject): boolean {
  return Object.keys(schema).some((k) =>
    SUPPORTED_KEYWORDS.includes(k) || UNSUPPORTED_KEYWORDS.has(k)
  );
}

/**
 * The keywords of `schema` this server cannot honour (vocabulary keywords outside
 * SUPPORTED_KEYWORDS, and `uniqueItems: true`). Unknown keywords are annotations, as JSON
 * Schema defines them.
 */
export function unsupportedKeywords(schema: JsonObject): string[] {
  const out = Object.keys(schema).filter((k) => UNSUPPORTED_KEYWORDS.has(k));
  if (schema.uniqueItems === true) out.push("uniqueItems");
  return out;
}

/** Types `schema` allows (all seven when it names none); a 400 for unknown type names. */
export function typesOf(schema: JsonObject, path: string): JsonType[] {
  const t = schema.type;
  if (t === undefined) return [...TYPES];
  const list = Array.isArray(t) ? t : [t];
  if (list.length === 0) {
    throw new SchemaError(join(path, "type"), "an empty type list allows nothing");
  }
  for (const x of list) {
    if (typeof x !== "string" || !TYPES.includes(x as JsonType)) {
      throw new SchemaError(join(path, "type"), `unknown type ${JSON.stringify(x)}`);
    }
  }
  const types = list as JsonType[];
  if (schema.nullable === true && !types.includes("null")) types.push("null");
  return types;
}

/**
 * The intersection of two schemas where it is a plain merge: properties merged (a property in
 * both gets allOf of the two), required joined, types intersected, every other keyword equal in
 * both or set in one. Anything else is a SchemaError naming the keyword.
 */
export function mergeSchemas(a: Json, b: Json, path: string): Json {
  if (a === false || b === false) return false;
  if (a === true) return b;
  if (b === true) return a;
  if (!isObject(a) || !isObject(b)) {
    throw new SchemaError(path, "a schema must be an object or a boolean");
  }
  const out: JsonObject = { ...a };
  for (const [k, v] of Object.entries(b)) {
    if (!(k in out)) {
      out[k] = v;
      continue;
    }
    const w = out[k];
    if (k === "properties" && isObject(w) && isObject(v)) {
      const props: JsonObject = { ...w };
      for (const [name, s] of Object.entries(v)) {
        props[name] = name in props ? { allOf: [props[name], s] } : s;
      }
      out[k] = props;
    } else if (k === "required" && Array.isArray(w) && Array.isArray(v)) {
      out[k] = [...new Set([...w, ...v])];
    } else if (k === "type") {
      const both = typesOf(a, path).filter((t) => typesOf(b, path).includes(t));
      if (both.length === 0) {
        throw new SchemaError(join(path, "allOf"), "its members allow no common type");
      }
      out[k] = both;
    } else if (
      ["minimum", "minLength", "minItems", "exclusiveMinimum"].includes(k) &&
      typeof w === "number" && typeof v === "number"
    ) {
      out[k] = Math.max(w, v);
    } else if (
      ["maximum", "maxLength", "maxItems", "exclusiveMaximum"].includes(k) &&
      typeof w === "number" && typeof v === "number"
    ) {
      out[k] = Math.min(w, v);
    } else if (JSON.stringify(w) !== JSON.stringify(v) && SUPPORTED_KEYWORDS.includes(k)) {
      throw new SchemaError(
        join(path, k),
        `schemas combined by allOf (or beside $ref/anyOf) set "${k}" differently; this ` +
          `combination is not supported`,
      );
    }
  }
  return out;
}

function equal(a: Json, b: Json): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

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
    default:
      return value === null;
  }
}

/** Lower and upper bounds of a number schema, with both JSON Schema spellings of exclusivity. */
export function numberBounds(
  s: JsonObject,
): { lo: number; loIn: boolean; hi: number; hiIn: boolean } {
  let lo = -Infinity;
  let loIn = true;
  let hi = Infinity;
  let hiIn = true;
  if (typeof s.minimum === "number") [lo, loIn] = [s.minimum, s.exclusiveMinimum !== true];
  if (typeof s.maximum === "number") [hi, hiIn] = [s.maximum, s.exclusiveMaximum !== true];
  if (typeof s.exclusiveMinimum === "number" && s.exclusiveMinimum >= lo) {
    [lo, loIn] = [s.exclusiveMinimum, false];
  }
  if (typeof s.exclusiveMaximum === "number" && s.exclusiveMaximum <= hi) {
    [hi, hiIn] = [s.exclusiveMaximum, false];
  }
  return { lo, loIn, hi, hiIn };
}

/**
 * The first way `value` breaks `schema`, as "path: problem", or null when it fits. Checks the
 * supported keywords (patterns in linear time); unsupported ones are not checked.
 */
export function schemaError(
  value: Json,
  schema: Json,
  doc: SchemaDocument = new SchemaDocument(schema),
  path = "input",
  depth = 0,
): string | null {
  if (depth > 64) return `${path}: the schema nests deeper than 64 levels`;
  let s: Json;
  try {
    s = doc.resolve(schema, "").schema;
  } catch (e) {
    if (e instanceof SchemaError) return `${path}: ${e.problem}`;
    throw e;
  }
  if (s === true) return null;
  if (s === false) return `${path}: no value is allowed here`;
  if (!isObject(s)) return null;
  const sub = (v: Json, subSchema: Json, p: string) => schemaError(v, subSchema, doc, p, depth + 1);
  if (s.type !== undefined) {
    const types = (Array.isArray(s.type) ? s.type : [s.type]).filter((t) => typeof t === "string");
    if (s.nullable === true) types.push("null");
    if (!types.some((t) => typeMatches(value, t as string))) {
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
    const checks = [
      s.pattern,
      typeof s.format === "string" ? FORMAT_PATTERNS[s.format] : undefined,
    ];
    for (const p of checks) {
      if (typeof p !== "string") continue;
      let pattern: Pattern | null;
      try {
        pattern = schemaPattern(p, "pattern", false);
      } catch (e) {
        if (e instanceof SchemaError) return `${path}: ${e.problem}`;
        throw e;
      }
      if (pattern && !pattern.test(value)) {
        return `${path}: ${JSON.stringify(value)} does not match ${p}`;
      }
    }
  }
  if (typeof value === "number") {
    const { lo, loIn, hi, hiIn } = numberBounds(s);
    if (value < lo || (value === lo && !loIn)) {
      return `${path}: expected a number ${loIn ? "≥" : ">"} ${lo}, got ${value}`;
    }
    if (value > hi || (value === hi && !hiIn)) {
      return `${path}: expected a number ${hiIn ? "≤" : "<"} ${hi}, got ${value}`;
    }
  }
  if (Array.isArray(value)) {
    if (typeof s.minItems === "number" && value.length < s.minItems) {
      return `${path}: expected at least ${s.minItems} items, got ${value.length}`;
    }
    if (typeof s.maxItems === "number" && value.length > s.maxItems) {
      return `${path}: expected at most ${s.maxItems} items, got ${value.length}`;
    }
    const prefix = Array.isArray(s.prefixItems)
      ? s.prefixItems
      : Array.isArray(s.items)
      ? s.items
      : [];
    const rest = Array.isArray(s.items) ? s.additionalItems : s.items;
    for (let i = 0; i < value.length; i++) {
      const itemSchema = i < prefix.length ? prefix[i] : rest;
      if (itemSchema === undefined) continue;
      const e = sub(value[i], itemSchema, `${path}.${i}`);
      if (e) return e;
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
        const e = sub(v, props[key], `${path}.${key}`);
        if (e) return e;
      } else if (s.additionalProperties !== undefined) {
        if (s.additionalProperties === false) return `${path}: unexpected property "${key}"`;
        const e = sub(v, s.additionalProperties, `${path}.${key}`);
        if (e) return e;
      }
    }
  }
  if (Array.isArray(s.allOf)) {
    for (const member of s.allOf) {
      const e = sub(value, member, path);
      if (e) return e;
    }
  }
  // oneOf is generated as anyOf (a grammar cannot see that two members overlap), so it is
  // checked as anyOf too: a value the grammar wrote must pass.
  for (const key of ["anyOf", "oneOf"] as const) {
    const members = s[key];
    if (Array.isArray(members)) {
      const errors = members.map((m) => sub(value, m, path));
      if (!errors.includes(null)) return errors[0] ?? `${path}: ${key} has no members`;
    }
  }
  return null;
}
