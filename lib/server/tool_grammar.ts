// The grammars a reply may be held to: a forced tool call in the template's format
// (<tool_call>{"name", "arguments"}</tool_call>), JSON of a response format, or GBNF; admit.ts applies them.

import { type Element, Grammar, GrammarError, type Rule } from "../grammar/grammar.ts";
import { parseGbnf } from "../grammar/gbnf.ts";
import { Lru } from "../grammar/lru.ts";
import {
  JsonGrammarBuilder,
  literal,
  reasoningPrefix,
  ref,
  rule,
} from "../grammar/json_grammar.ts";
import { SchemaError } from "../grammar/json_schema.ts";
import { invalidField } from "./api_error.ts";
import type { Json } from "./fields.ts";
import type { ToolSpec } from "./output.ts";

/** What a reply must be; `path` names the request field a bad schema is reported under. */
export type ReplyFormat =
  | { readonly type: "json_object" }
  | { readonly type: "json_schema"; readonly schema: Json; readonly path: string }
  | { readonly type: "gbnf"; readonly grammar: string; readonly path: string };

/** Compiled grammars by request shape: agents resend the same tools and formats every turn. */
const cache = new Lru<Grammar>(32);

/** Runs a grammar build, turning its refusals into 400s that name the request field. */
function checked<T>(path: string, build: () => T): T {
  try {
    return build();
  } catch (e) {
    if (e instanceof SchemaError) {
      throw invalidField(e.path ? `${path}.${e.path}` : path, e.problem);
    }
    if (e instanceof GrammarError) throw invalidField(path, e.message);
    throw e;
  }
}

/** The rule of the JSON values `schema` allows; a 400 under `path` when it allows none. */
function schemaRule(schema: Json, path: string, strict: boolean): Rule {
  return checked(path, () => {
    const r = new JsonGrammarBuilder(schema, { strict }).value(schema, "");
    try {
      new Grammar(r);
    } catch (e) {
      if (e instanceof GrammarError) {
        throw new SchemaError("", `no JSON value fits this schema: ${e.message}`);
      }
      throw e;
    }
    return r;
  });
}

/** A tool call's elements: `<tool_call>\n{"name": "n", "arguments": {…}}\n</tool_call>`. */
function toolCall(tools: readonly ToolSpec[]): Element[] {
  const calls = rule(
    "tool call",
    tools.map((t) => [
      ...literal(`${JSON.stringify(t.name)}, "arguments": `),
      ref(schemaRule(t.inputSchema, t.schemaPath, true)),
    ]),
  );
  return [...literal('<tool_call>\n{"name": '), ref(calls), ...literal("}\n</tool_call>")];
}

function formatElements(format: ReplyFormat): Element[] {
  switch (format.type) {
    case "json_object":
      return [ref(new JsonGrammarBuilder({ type: "object" }, { strict: true }).anyObject())];
    case "json_schema":
      return [ref(schemaRule(format.schema, format.path, true))];
    case "gbnf":
      return [ref(checked(format.path, () => parseGbnf(format.grammar)).root)];
  }
}

export interface ReplyGrammarOptions {
  /** Tools the reply must call one of (tool_choice any or a named tool). */
  readonly forced?: readonly ToolSpec[];
  /** Tools the reply may call instead of answering in `format`. */
  readonly optional?: readonly ToolSpec[];
  readonly format?: ReplyFormat;
  /** The prompt left a <think> open: free reasoning and </think> come first. */
  readonly reasoning: boolean;
}

/** The grammar of a constrained reply, or undefined when nothing constrains it. */
export function replyGrammar(options: ReplyGrammarOptions): Grammar | undefined {
  const { forced, optional, format, reasoning } = options;
  if (!forced?.length && !format) return undefined;
  const key = JSON.stringify({
    forced: forced?.map((t) => [t.name, t.inputSchema, t.schemaPath]),
    optional: format ? optional?.map((t) => [t.name, t.inputSchema, t.schemaPath]) : undefined,
    format,
    reasoning,
  });
  return cache.getOrBuild(key, () => {
    const alts: Element[][] = [];
    if (forced?.length) alts.push(toolCall(forced));
    else if (format) {
      alts.push(formatElements(format));
      if (optional?.length) alts.push(toolCall(optional));
    }
    const body = rule("reply", alts);
    const root = rule("root", [[...(reasoning ? reasoningPrefix() : []), ref(body)]]);
    return new Grammar(root);
  });
}

/**
 * Checks every tool's input_schema before anything runs: a pattern that does not compile, bounds
 * that allow no value, a $ref to nothing are 400s naming the field. Keywords this server cannot
 * generate are allowed here: such a tool is only checked against what the model writes.
 */
export function checkToolSchemas(tools: readonly ToolSpec[]): void {
  for (const t of tools) {
    cache.getOrBuild(
      `check ${JSON.stringify([t.inputSchema, t.schemaPath])}`,
      () => new Grammar(schemaRule(t.inputSchema, t.schemaPath, false)),
    );
  }
}
