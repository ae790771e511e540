// The constrained requests the mask bench and the engine comparison run, as each engine takes them:
// a response_format schema, a forced tool call or GBNF, built for lib/grammar by tool_grammar.ts.

import type { Grammar } from "../lib/grammar/grammar.ts";
import type { Json, JsonObject } from "../lib/server/fields.ts";
import { replyGrammar } from "../lib/server/tool_grammar.ts";
import { ORDER, PYDANTIC_LIKE, WALK_SCHEMAS } from "../tests/_structured_schemas.ts";

export type GrammarSpec =
  | { readonly kind: "schema"; readonly schema: Json }
  | {
    readonly kind: "tool";
    readonly tools: readonly { readonly name: string; readonly inputSchema: JsonObject }[];
  }
  | { readonly kind: "gbnf"; readonly grammar: string };

/** lib/grammar's grammar of `spec`, as the server builds it (cached per request shape). */
export function ourGrammar(spec: GrammarSpec): Grammar {
  const grammar = spec.kind === "tool"
    ? replyGrammar({
      forced: spec.tools.map((t, i) => ({ ...t, schemaPath: `tools.${i}.input_schema` })),
      reasoning: false,
    })
    : replyGrammar({
      format: spec.kind === "schema"
        ? { type: "json_schema", schema: spec.schema, path: "schema" }
        : { type: "gbnf", grammar: spec.grammar, path: "grammar" },
      reasoning: false,
    });
  return grammar!;
}

/**
 * `spec` as a schema or grammar neither engine has seen: the same language, another text (a
 * description or a comment), so that compile caches keyed by text miss.
 */
export function fresh(spec: GrammarSpec, n: number): GrammarSpec {
  switch (spec.kind) {
    case "schema":
      return { kind: "schema", schema: { ...spec.schema as JsonObject, description: `#${n}` } };
    case "tool":
      return {
        kind: "tool",
        tools: spec.tools.map((t) => ({
          ...t,
          inputSchema: { ...t.inputSchema, $comment: `#${n}` },
        })),
      };
    case "gbnf":
      return { kind: "gbnf", grammar: `# ${n}\n${spec.grammar}` };
  }
}

/** An object of `properties`, all required and no others. */
const objectOf = (properties: Record<string, Json>): GrammarSpec => ({
  kind: "schema",
  schema: {
    type: "object",
    properties,
    required: Object.keys(properties),
    additionalProperties: false,
  },
});

/** The bench's grammars: what structured-output requests commonly ask for. */
export const BENCH_SPECS: Readonly<Record<string, GrammarSpec>> = {
  "free-strings": objectOf({
    name: { type: "string" },
    city: { type: "string" },
    bio: { type: "string" },
  }),
  "bounded-strings": objectOf({
    name: { type: "string", maxLength: 40 },
    bio: { type: "string", minLength: 10, maxLength: 300 },
  }),
  pattern: objectOf({
    sku: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
    slug: { type: "string", pattern: "^[a-z0-9]+(-[a-z0-9]+)*$" },
    title: { type: "string", pattern: "^[A-Za-z ,.]{1,40}$" },
    when: { type: "string", format: "date" },
  }),
  "counted-pattern": objectOf({
    title: { type: "string", pattern: "^[A-Za-z ,.]{1,40}$" },
    handle: { type: "string", pattern: "^[a-z0-9_]{3,16}$" },
    note: { type: "string", pattern: "^.{0,80}$", minLength: 5 },
  }),
  "loop-exit": objectOf({
    sentence: { type: "string", pattern: "^[A-Za-z ]{1,40}\\.$" },
    name: { type: "string", pattern: "^[A-Z][a-z]{1,30}$" },
    user: { type: "string", pattern: "^[a-z0-9_]{3,16}(@[a-z]{2,8})?$" },
  }),
  enum: objectOf({
    color: { enum: ["red", "green", "blue", "dark purple"] },
    size: { enum: ["small", "medium", "large"] },
    tags: { type: "array", items: { enum: ["new", "sale", "gift"] }, maxItems: 3 },
  }),
  numbers: objectOf({
    qty: { type: "integer", minimum: 1, maximum: 99 },
    price: { type: "number", exclusiveMinimum: 0, maximum: 1000 },
    lat: { type: "number", minimum: -90, maximum: 90 },
    points: { type: "array", items: { type: "integer" }, maxItems: 4 },
  }),
  "tool-call": {
    kind: "tool",
    tools: [{
      name: "get_weather",
      inputSchema: {
        type: "object",
        properties: {
          location: { type: "string", description: "City and country" },
          unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 14 },
        },
        required: ["location", "unit"],
      },
    }],
  },
  gbnf: {
    kind: "gbnf",
    grammar: 'root ::= "Verdict: " verdict "\\n" item ("\\n" item){0,7}\n' +
      'verdict ::= "yes" | "no" | "unsure"\n' +
      'item ::= "- " [A-Z] [a-z]{1,12} (" " [a-z0-9]{1,12}){0,8} ("." | "!")\n',
  },
};

/**
 * The grammars of the structured-output tests, named by the test file each comes from
 * (tests/http_structured_test.ts, lib/grammar/json_grammar_walk_test.ts and token_mask_test.ts,
 * tests/sdk_anthropic_test.ts, tests/http_messages_test.ts): the engines' masks are compared on
 * these.
 */
export const TEST_SPECS: Readonly<Record<string, GrammarSpec>> = {
  "structured-order": { kind: "schema", schema: ORDER },
  "structured-json-object": { kind: "schema", schema: { type: "object" } },
  "structured-numbers": {
    kind: "schema",
    schema: {
      type: "array",
      items: { type: "number", minimum: -1, maximum: 1 },
      minItems: 2,
      maxItems: 4,
    },
  },
  "structured-gbnf": {
    kind: "gbnf",
    grammar: 'root ::= ("yes" | "no") ", " word\nword ::= [a-z]{2,5} "."\n',
  },
  "walk-oneof-bounds": {
    kind: "schema",
    schema: WALK_SCHEMAS["oneOf of disjoint objects told apart by const, exclusive decimal bounds"],
  },
  "walk-nested": {
    kind: "schema",
    schema:
      WALK_SCHEMAS["nested objects and arrays, string lengths, additionalProperties as a schema"],
  },
  "walk-recursion-allof": {
    kind: "schema",
    schema: WALK_SCHEMAS["recursion through $ref, type lists, allOf, const values"],
  },
  "mask-pydantic": { kind: "schema", schema: PYDANTIC_LIKE },
  "mask-pattern-gaps": {
    kind: "schema",
    schema: { type: "string", pattern: "^(ab|abcdef|xyz)$", minLength: 3, maxLength: 5 },
  },
  "mask-pattern-format": {
    kind: "schema",
    schema: { type: "string", pattern: "^(.{9}[a-z]|2024-01-01)$", format: "date" },
  },
  "mask-maxlength-enum": {
    kind: "schema",
    schema: {
      type: "object",
      properties: { a: { type: "string", maxLength: 6 }, b: { enum: [true, 12] } },
    },
  },
  "mask-pattern-minlength": {
    kind: "schema",
    schema: { type: "string", pattern: "^[a-z ]+x$", minLength: 12 },
  },
  "sdk-weather-tool": {
    kind: "tool",
    tools: [{
      name: "get_weather",
      inputSchema: {
        type: "object",
        properties: {
          city: { type: "string", enum: ["Paris", "Tokyo", "Lima"] },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    }],
  },
  "messages-weather-tool": {
    kind: "tool",
    tools: [{
      name: "get_weather",
      inputSchema: {
        type: "object",
        properties: {
          city: { type: "string", enum: ["Paris", "Tokyo", "Lima"] },
          days: { type: "integer", minimum: 1, maximum: 7 },
          unit: { type: "string", maxLength: 12 },
        },
        required: ["city", "days"],
      },
    }],
  },
};
