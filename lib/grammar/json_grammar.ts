// JSON Schema → grammar rules that generate exactly the JSON texts the schema allows, written as
// Python's json.dumps writes them (", " and ": "); for lib/server/tool_grammar.ts.

import { isObject, type Json, type JsonObject } from "../server/fields.ts";
import { CharSet } from "./charset.ts";
import type { Element, Rule } from "./grammar.ts";
import { NumberLeaf, StringLeaf, UntilLeaf } from "./json_leaves.ts";
import {
  FORMAT_PATTERNS,
  hasConstraints,
  type JsonType,
  mergeSchemas,
  numberBounds,
  SchemaDocument,
  SchemaError,
  schemaError,
  schemaPattern,
  SUPPORTED_KEYWORDS,
  typesOf,
  unsupportedKeywords,
} from "./json_schema.ts";
import type { Pattern } from "./regex.ts";

/** Most array positions (past minItems) or required leading items a schema may spell out. */
const MAX_POSITIONS = 4096;
/** Deepest nesting of allOf merges and schemas within one value. */
const MAX_SCHEMA_DEPTH = 64;

/** The elements that read exactly `text`. */
export function literal(text: string): Element[] {
  return [...text].map((c) => ({ kind: "chars", set: CharSet.of(c.codePointAt(0)!) }));
}

export function ref(rule: Rule): Element {
  return { kind: "ref", rule };
}

export function rule(name: string, alts: Element[][] = []): Rule {
  return { name, alts };
}

function join(path: string, key: string | number): string {
  return path ? `${path}.${key}` : String(key);
}

function count(s: JsonObject, key: string, path: string, fallback: number): number {
  const v = s[key];
  if (v === undefined) return fallback;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new SchemaError(
      join(path, key),
      `expected a non-negative integer, got ${JSON.stringify(v)}`,
    );
  }
  return v;
}

/**
 * Compiles schemas of one document into rules. `strict`: a keyword that cannot be generated is a
 * SchemaError naming it; otherwise that part of the schema generates any JSON value (for schemas
 * that are only checked, never generated).
 */
export class JsonGrammarBuilder {
  readonly #doc: SchemaDocument;
  readonly #strict: boolean;
  readonly #memo = new Map<JsonObject, Rule>();
  #any: Rule | undefined;
  #leaves = 0;

  constructor(root: Json, options: { readonly strict: boolean }) {
    this.#doc = new SchemaDocument(root);
    this.#strict = options.strict;
  }

  /** The rule of the values `schema` allows. */
  value(schema: Json, path: string, depth = 0): Rule {
    if (depth > MAX_SCHEMA_DEPTH) {
      throw new SchemaError(
        path,
        `schemas nested deeper than ${MAX_SCHEMA_DEPTH} are not supported`,
      );
    }
    const { schema: s, path: p } = this.#doc.resolve(schema, path);
    if (s === true) return this.any();
    if (s === false) return rule("nothing");
    if (!isObject(s)) throw new SchemaError(p, "a schema must be an object or a boolean");
    const known = this.#memo.get(s);
    if (known) return known;
    const r = rule(p || "root");
    this.#memo.set(s, r);
    r.alts = this.#alternatives(s, p, depth);
    return r;
  }

  #alternatives(s: JsonObject, p: string, depth: number): Element[][] {
    const bad = unsupportedKeywords(s);
    if (bad.length) {
      if (!this.#strict) return [[ref(this.any())]];
      throw new SchemaError(
        join(p, bad[0]),
        `the keyword "${bad[0]}" is not supported by this server (it supports ` +
          `${SUPPORTED_KEYWORDS.join(", ")}; other keywords are annotations)`,
      );
    }
    if (Array.isArray(s.allOf)) {
      const { allOf, ...rest } = s;
      let merged: Json = rest;
      allOf.forEach((m, i) => {
        merged = mergeSchemas(merged, this.#doc.resolve(m, join(p, `allOf.${i}`)).schema, p);
      });
      return [[ref(this.value(merged, p, depth + 1))]];
    } else if (s.allOf !== undefined) throw new SchemaError(join(p, "allOf"), "expected an array");
    const union = s.anyOf ?? s.oneOf;
    if (union !== undefined) {
      const key = s.anyOf !== undefined ? "anyOf" : "oneOf";
      if (s.anyOf !== undefined && s.oneOf !== undefined) {
        throw new SchemaError(join(p, "oneOf"), "anyOf and oneOf together are not supported");
      }
      if (!Array.isArray(union) || union.length === 0) {
        throw new SchemaError(join(p, key), "expected a non-empty array of schemas");
      }
      const { anyOf: _a, oneOf: _o, ...siblings } = s;
      const constrained = hasConstraints(siblings);
      return union.map((m, i) => {
        const at = join(p, `${key}.${i}`);
        const member = constrained
          ? mergeSchemas(siblings, this.#doc.resolve(m, at).schema, at)
          : m;
        return [ref(this.value(member, at, depth + 1))];
      });
    }
    if (s.const !== undefined || s.enum !== undefined) return this.#enum(s, p);
    const types = typesOf(s, p);
    const alts: Element[][] = [];
    for (const t of types) {
      if (t === "integer" && types.includes("number")) continue;
      alts.push(...this.#typed(t, s, p, depth));
    }
    return alts;
  }

  #enum(s: JsonObject, p: string): Element[][] {
    const { enum: list, const: single, ...rest } = s;
    if (single === undefined && !Array.isArray(list)) {
      throw new SchemaError(join(p, "enum"), "expected an array of values");
    }
    const values = single !== undefined ? [single] : list as Json[];
    const key = single !== undefined ? "const" : "enum";
    if (values.length === 0) throw new SchemaError(join(p, key), "an empty enum allows no value");
    if (
      single !== undefined && Array.isArray(list) &&
      !list.some((v) => JSON.stringify(v) === JSON.stringify(single))
    ) {
      throw new SchemaError(join(p, "const"), "the const value is not in the enum");
    }
    const fits = values.filter((v) => schemaError(v, rest, this.#doc) === null);
    if (fits.length === 0) {
      throw new SchemaError(
        join(p, key),
        `no value of the ${key} fits the schema's other keywords`,
      );
    }
    return fits.map((v) => literal(JSON.stringify(v)));
  }

  #typed(t: JsonType, s: JsonObject, p: string, depth: number): Element[][] {
    switch (t) {
      case "null":
        return [literal("null")];
      case "boolean":
        return [literal("true"), literal("false")];
      case "string":
        return [[this.#string(s, p, [])]];
      case "integer":
      case "number": {
        const b = numberBounds(s);
        for (const k of ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) {
          const v = s[k];
          if (v !== undefined && typeof v !== "number" && typeof v !== "boolean") {
            throw new SchemaError(join(p, k), `expected a number, got ${JSON.stringify(v)}`);
          }
        }
        const leaf = new NumberLeaf({ integer: t === "integer", ...b }, `n${this.#leaves++}`);
        if (leaf.distance(leaf.start) === Infinity || !this.#numberFeasible(leaf)) {
          throw new SchemaError(
            p,
            `no ${t} fits between its bounds (${b.loIn ? "≥" : ">"} ${b.lo} and ${
              b.hiIn ? "≤" : "<"
            } ${b.hi})`,
          );
        }
        return [[{ kind: "leaf", leaf }]];
      }
      case "object":
        return [this.#object(s, p, depth)];
      case "array":
        return this.#array(s, p, depth);
    }
  }

  /** Some number can be written within the leaf's bounds: '-' or a digit starts one. */
  #numberFeasible(leaf: NumberLeaf): boolean {
    return leaf.meets(leaf.start, 0x2d, 0x39);
  }

  #string(s: JsonObject, p: string, exclude: readonly string[]): Element {
    const minLength = count(s, "minLength", p, 0);
    const maxLength = count(s, "maxLength", p, Infinity);
    if (minLength > maxLength) {
      throw new SchemaError(p, `minLength ${minLength} is above maxLength ${maxLength}`);
    }
    // Each pattern with the keyword it comes from, to name it when they contradict.
    const named: [string, Pattern | null][] = [];
    if (s.pattern !== undefined) {
      if (typeof s.pattern !== "string") {
        throw new SchemaError(join(p, "pattern"), "expected a string");
      }
      named.push([
        `pattern ${JSON.stringify(s.pattern)}`,
        schemaPattern(s.pattern, join(p, "pattern"), this.#strict),
      ]);
    }
    if (typeof s.format === "string" && FORMAT_PATTERNS[s.format]) {
      named.push([
        `format "${s.format}"`,
        schemaPattern(FORMAT_PATTERNS[s.format], join(p, "format"), true),
      ]);
    }
    const used = named.filter((x): x is [string, Pattern] => x[1] !== null);
    const leaf = new StringLeaf(
      { minLength, maxLength, patterns: used.map(([, pattern]) => pattern), exclude },
      `s${this.#leaves++}`,
    );
    if (leaf.distance(leaf.start) === Infinity) {
      throw new SchemaError(join(p, "pattern"), "the pattern matches no string");
    }
    if (!leaf.closable(0, leaf.start.sets)) {
      // Say each keyword's lengths: with one pattern, they are what contradicts.
      const parts = used.map(([name, pattern]) =>
        `${name} (${pattern.describeLengths(pattern.start)} characters)`
      );
      if (minLength > 0) parts.push(`minLength ${minLength}`);
      if (maxLength !== Infinity) parts.push(`maxLength ${maxLength}`);
      // Two patterns may agree on lengths and still not on characters.
      const clash = used.length > 1 ? " (their characters or lengths clash)" : "";
      throw new SchemaError(
        p,
        `no string fits ${parts.join(" and ")} at once${clash}; loosen one of them`,
      );
    }
    return { kind: "leaf", leaf };
  }

  #object(s: JsonObject, p: string, depth: number): Element[] {
    const props = s.properties ?? {};
    if (!isObject(props)) throw new SchemaError(join(p, "properties"), "expected an object");
    const required = s.required ?? [];
    if (!Array.isArray(required) || required.some((k) => typeof k !== "string")) {
      throw new SchemaError(join(p, "required"), "expected an array of property names");
    }
    const extra = s.additionalProperties;
    const declared = Object.keys(props);
    // A bare object schema allows any keys; with properties, only the declared ones are written
    // unless additionalProperties asks for more.
    const extras: Json | undefined = extra === undefined
      ? (declared.length ? undefined : true)
      : extra === false
      ? undefined
      : extra;
    const entries: { key: string; schema: Json; required: boolean; at: string }[] = declared.map((
      key,
    ) => ({
      key,
      schema: props[key],
      required: required.includes(key),
      at: join(p, `properties.${key}`),
    }));
    for (const key of required as string[]) {
      if (key in props) continue;
      if (extra === false) {
        throw new SchemaError(
          join(p, "required"),
          `"${key}" is required, but it is not in properties and additionalProperties is false`,
        );
      }
      entries.push({
        key,
        schema: extra ?? true,
        required: true,
        at: join(p, "additionalProperties"),
      });
    }
    const values = entries.map((e) => this.value(e.schema, e.at, depth + 1));
    const extraKv = extras === undefined ? undefined : [
      this.#string({}, join(p, "additionalProperties"), entries.map((e) => e.key)),
      ...literal(": "),
      ref(this.value(extras, join(p, "additionalProperties"), depth + 1)),
    ];
    const more = extraKv && rule(`${p}{more}`);
    if (more && extraKv) more.alts = [literal("}"), [...literal(", "), ...extraKv, ref(more)]];
    // after[i][first]: the rest of the object from entry i; `first` when nothing was written yet.
    const after = new Map<string, Rule>();
    const rest = (i: number, first: boolean): Rule => {
      const k = `${i}:${first}`;
      let r = after.get(k);
      if (r) return r;
      r = rule(`${p}{${i}}`);
      after.set(k, r);
      if (i === entries.length) {
        r.alts = [literal("}")];
        if (extraKv && more) r.alts.push([...literal(first ? "" : ", "), ...extraKv, ref(more)]);
        return r;
      }
      const e = entries[i];
      r.alts = [[
        ...literal(`${first ? "" : ", "}${JSON.stringify(e.key)}: `),
        ref(values[i]),
        ref(rest(i + 1, false)),
      ]];
      if (!e.required) r.alts.push([ref(rest(i + 1, first))]);
      return r;
    };
    return [...literal("{"), ref(rest(0, true))];
  }

  #array(s: JsonObject, p: string, depth: number): Element[][] {
    const prefix = Array.isArray(s.prefixItems)
      ? s.prefixItems
      : Array.isArray(s.items)
      ? s.items
      : [];
    const restSchema: Json | undefined = Array.isArray(s.prefixItems) || Array.isArray(s.items)
      ? (Array.isArray(s.items) ? s.additionalItems : s.items)
      : s.items;
    const min = count(s, "minItems", p, 0);
    let max = count(s, "maxItems", p, Infinity);
    if (restSchema === false) max = Math.min(max, prefix.length);
    if (min > max) throw new SchemaError(p, `minItems ${min} is above the ${max} items allowed`);
    const fixed = Math.max(prefix.length, min);
    if (fixed > MAX_POSITIONS || (max !== Infinity && max - fixed > MAX_POSITIONS)) {
      throw new SchemaError(
        p,
        `arrays spelling out more than ${MAX_POSITIONS} positions are not supported`,
      );
    }
    const item = (j: number) =>
      j < prefix.length
        ? this.value(
          prefix[j],
          join(p, `${Array.isArray(s.prefixItems) ? "prefixItems" : "items"}.${j}`),
          depth + 1,
        )
        : this.value(restSchema ?? true, join(p, "items"), depth + 1);
    // tail[j]: what may follow j written items.
    const tails = new Map<number, Rule>();
    const tail = (j: number): Rule => {
      const k = max === Infinity && j >= fixed ? fixed : j;
      let r = tails.get(k);
      if (r) return r;
      r = rule(`${p}[${k}]`);
      tails.set(k, r);
      if (k >= min) r.alts.push(literal("]"));
      if (k < max) r.alts.push([...literal(", "), ref(item(k)), ref(tail(k + 1))]);
      return r;
    };
    const alts: Element[][] = [];
    if (min === 0) alts.push(literal("[]"));
    if (max >= 1) alts.push([...literal("["), ref(item(0)), ref(tail(1))]);
    return alts;
  }

  /** Any JSON value (nested objects and arrays, strings, numbers, true, false, null). */
  any(): Rule {
    if (this.#any) return this.#any;
    const value = rule("any value");
    this.#any = value;
    const string = (): Element => ({
      kind: "leaf",
      leaf: new StringLeaf(
        { minLength: 0, maxLength: Infinity, patterns: [], exclude: [] },
        `s${this.#leaves++}`,
      ),
    });
    const number: Element = {
      kind: "leaf",
      leaf: new NumberLeaf(
        { integer: false, lo: -Infinity, loIn: true, hi: Infinity, hiIn: true },
        `n${this.#leaves++}`,
      ),
    };
    const members = rule("any members");
    members.alts = [literal("}"), [
      ...literal(", "),
      string(),
      ...literal(": "),
      ref(value),
      ref(members),
    ]];
    const items = rule("any items");
    items.alts = [literal("]"), [...literal(", "), ref(value), ref(items)]];
    value.alts = [
      literal("{}"),
      [...literal("{"), string(), ...literal(": "), ref(value), ref(members)],
      literal("[]"),
      [...literal("["), ref(value), ref(items)],
      [string()],
      [number],
      literal("true"),
      literal("false"),
      literal("null"),
    ];
    return value;
  }

  /** Any JSON object (OpenAI's json_object response format). */
  anyObject(): Rule {
    return this.value({ type: "object" }, "");
  }
}

/** Free reasoning text up to `</think>` and the blank line the chat templates put after it. */
export function reasoningPrefix(): Element[] {
  return [{ kind: "leaf", leaf: new UntilLeaf("</think>") }, ...literal("\n\n")];
}
