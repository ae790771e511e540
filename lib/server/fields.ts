// Typed reads of request JSON: each read names the field's path in its 400 when the value is
// missing or of the wrong type. Used by messages.ts (with count_tokens), openai.ts, completion.ts.

import { ApiError, invalidField } from "./api_error.ts";

export type Json = null | boolean | number | string | Json[] | JsonObject;
export interface JsonObject {
  [key: string]: Json;
}

/** "a number", "an array", "null": how a value is named in error messages. */
export function describeJson(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  const type = typeof value;
  return type === "object" ? "an object" : type === "undefined" ? "nothing" : `a ${type}`;
}

export function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Parses a request body as a JSON object; a syntax error or a non-object is a 400. */
export function parseBody(text: string): JsonObject {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ApiError(
      "invalid_request",
      `The request body is not valid JSON: ${(e as Error).message}`,
      { cause: e },
    );
  }
  if (!isObject(value)) {
    throw new ApiError(
      "invalid_request",
      `The request body must be a JSON object, got ${describeJson(value)}`,
    );
  }
  return value;
}

function join(path: string, key: string | number): string {
  return path ? `${path}.${key}` : String(key);
}

/** A field's value and its path, for the typed readers below. */
export class Field {
  constructor(readonly value: Json | undefined, readonly path: string) {}

  static root(body: JsonObject): Field {
    return new Field(body, "");
  }

  get present(): boolean {
    return this.value !== undefined && this.value !== null;
  }

  /** A key of this object (the object itself must have been checked with object()). */
  key(name: string): Field {
    const v = this.value;
    return new Field(isObject(v) ? v[name] : undefined, join(this.path, name));
  }

  fail(problem: string): never {
    throw invalidField(this.path, problem);
  }

  #expected(what: string): never {
    if (this.value === undefined) this.fail(`Field required: expected ${what}`);
    this.fail(`expected ${what}, got ${describeJson(this.value)}`);
  }

  object(): JsonObject {
    return isObject(this.value) ? this.value : this.#expected("an object");
  }

  array(): Field[] {
    if (!Array.isArray(this.value)) this.#expected("an array");
    return (this.value as Json[]).map((v, i) => new Field(v, join(this.path, i)));
  }

  string(): string {
    return typeof this.value === "string" ? this.value : this.#expected("a string");
  }

  boolean(): boolean {
    return typeof this.value === "boolean" ? this.value : this.#expected("a boolean");
  }

  number(range: { min?: number; max?: number; integer?: boolean } = {}): number {
    const v = this.value;
    const what = range.integer ? "an integer" : "a number";
    if (typeof v !== "number" || !Number.isFinite(v)) this.#expected(what);
    const n = v as number;
    if (range.integer && !Number.isSafeInteger(n)) this.fail(`expected an integer, got ${n}`);
    if (range.min !== undefined && n < range.min) {
      this.fail(`expected ${what} ≥ ${range.min}, got ${n}`);
    }
    if (range.max !== undefined && n > range.max) {
      this.fail(`expected ${what} ≤ ${range.max}, got ${n}`);
    }
    return n;
  }

  /** One of `allowed` string values. */
  oneOf<T extends string>(allowed: readonly T[]): T {
    const s = this.string();
    if (!allowed.includes(s as T)) {
      this.fail(`expected one of ${allowed.map((a) => `"${a}"`).join(", ")}, got "${s}"`);
    }
    return s as T;
  }

  optString(): string | undefined {
    return this.present ? this.string() : undefined;
  }

  optBoolean(): boolean | undefined {
    return this.present ? this.boolean() : undefined;
  }

  optNumber(range: { min?: number; max?: number; integer?: boolean } = {}): number | undefined {
    return this.present ? this.number(range) : undefined;
  }

  /** A string, or an array of strings (OpenAI's `stop`). */
  strings(): string[] {
    if (typeof this.value === "string") return [this.value];
    return this.array().map((f) => f.string());
  }
}

/** A seed: a non-negative integer (as llama.cpp, -1 means none), or a decimal string. */
export function readSeed(field: Field): bigint | undefined {
  const v = field.value;
  if (v === undefined || v === null || v === -1) return undefined;
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  if (typeof v === "string" && /^\d{1,20}$/.test(v) && BigInt(v) < 2n ** 64n) return BigInt(v);
  const shown = typeof v === "string" || typeof v === "number"
    ? JSON.stringify(v)
    : describeJson(v);
  field.fail(`expected an integer from 0 to 2^64-1 (or -1 for a random seed), got ${shown}`);
}
