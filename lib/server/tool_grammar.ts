// Forces one tool call in the template's format (<tool_call>{"name", "arguments"}</tool_call>),
// arguments per input_schema: built for tool_choice any/tool, applied per token by sequence.ts.

import type { TopEntry } from "../../engine/stage.ts";
import type { TokenConstraint } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { isObject, type Json } from "./fields.ts";
import type { ToolSpec } from "./output.ts";

/** Thrown when the text ends where the grammar needs more. */
const MORE = Symbol("more");
/** Thrown when the text leaves the grammar. */
const INVALID = Symbol("invalid");

/** Caps that keep every forced value finite (a random model never closes a string otherwise). */
const LIMITS = {
  stringChars: 2048,
  keyChars: 32,
  freeStringChars: 64,
  arrayItems: 8,
  freeProperties: 4,
  intDigits: 15,
  fractionDigits: 6,
  depth: 3,
} as const;

class Reader {
  pos = 0;
  constructor(readonly text: string) {}

  peek(): string {
    if (this.pos >= this.text.length) throw MORE;
    return this.text[this.pos];
  }

  next(): string {
    const c = this.peek();
    this.pos++;
    return c;
  }
}

/** Matches one of `options` exactly (none may be ambiguous at the end of the text). */
function literals(r: Reader, options: readonly string[]): string {
  let live = options;
  for (let i = 0;; i++) {
    const whole = live.find((o) => o.length === i);
    const longer = live.filter((o) => o.length > i);
    if (longer.length === 0) {
      if (whole === undefined) throw INVALID;
      return whole;
    }
    const c = r.peek();
    const next = longer.filter((o) => o[i] === c);
    if (next.length === 0) {
      if (whole === undefined) throw INVALID;
      return whole;
    }
    r.pos++;
    live = next;
  }
}

type Node =
  | { readonly kind: "literals"; readonly options: readonly string[] }
  | { readonly kind: "string"; readonly min: number; readonly max: number }
  | {
    readonly kind: "number";
    readonly integer: boolean;
    readonly min: number;
    readonly max: number;
  }
  | { readonly kind: "array"; readonly items: Node; readonly min: number; readonly max: number }
  | {
    readonly kind: "object";
    readonly props: readonly { key: string; node: Node; required: boolean }[];
  }
  | { readonly kind: "free_object"; readonly depth: number }
  | { readonly kind: "any"; readonly depth: number }
  | { readonly kind: "union"; readonly options: readonly Node[] };

function num(value: Json | undefined, fallback: number): number {
  return typeof value === "number" && Number.isFinite(value) ? value : fallback;
}

/** The grammar node for a JSON Schema (the subset json_schema.ts checks). */
export function compileSchema(schema: Json | undefined, depth = 0): Node {
  if (!isObject(schema)) return { kind: "any", depth };
  const s = schema;
  if (s.const !== undefined) return { kind: "literals", options: [JSON.stringify(s.const)] };
  if (Array.isArray(s.enum)) {
    return { kind: "literals", options: s.enum.map((v) => JSON.stringify(v)) };
  }
  const alternatives = Array.isArray(s.anyOf) ? s.anyOf : Array.isArray(s.oneOf) ? s.oneOf : null;
  if (alternatives) {
    return { kind: "union", options: alternatives.map((a) => compileSchema(a, depth)) };
  }
  const type = s.type ??
    (isObject(s.properties) ? "object" : s.items !== undefined ? "array" : undefined);
  if (Array.isArray(type)) {
    return { kind: "union", options: type.map((t) => compileSchema({ ...s, type: t }, depth)) };
  }
  switch (type) {
    case "string":
      return {
        kind: "string",
        min: num(s.minLength, 0),
        max: Math.min(num(s.maxLength, LIMITS.stringChars), LIMITS.stringChars),
      };
    case "integer":
    case "number": {
      const bounded = [s.minimum, s.maximum, s.exclusiveMinimum, s.exclusiveMaximum].some((b) =>
        typeof b === "number"
      );
      const min = Math.max(num(s.minimum, -Infinity), num(s.exclusiveMinimum, -Infinity) + 1);
      const max = Math.min(num(s.maximum, Infinity), num(s.exclusiveMaximum, Infinity) - 1);
      // Bounded numbers are written as integers, whose prefixes can be checked against bounds.
      return {
        kind: "number",
        integer: type === "integer" || bounded,
        min: Math.ceil(min),
        max: Math.floor(max),
      };
    }
    case "boolean":
      return { kind: "literals", options: ["true", "false"] };
    case "null":
      return { kind: "literals", options: ["null"] };
    case "array":
      return {
        kind: "array",
        items: compileSchema(s.items, depth + 1),
        min: num(s.minItems, 0),
        max: Math.min(num(s.maxItems, LIMITS.arrayItems), LIMITS.arrayItems),
      };
    case "object": {
      if (!isObject(s.properties) || Object.keys(s.properties).length === 0) {
        return { kind: "free_object", depth };
      }
      const required = new Set(Array.isArray(s.required) ? s.required : []);
      const props = Object.entries(s.properties).map(([key, sub]) => ({
        key,
        node: compileSchema(sub, depth + 1),
        required: required.has(key),
      }));
      return { kind: "object", props };
    }
    default:
      return { kind: "any", depth };
  }
}

const DIGITS = "0123456789";

function anyOptions(depth: number): Node[] {
  const scalars: Node[] = [
    { kind: "string", min: 0, max: LIMITS.freeStringChars },
    { kind: "number", integer: false, min: -Infinity, max: Infinity },
    { kind: "literals", options: ["true", "false", "null"] },
  ];
  if (depth >= LIMITS.depth) return scalars;
  return [
    ...scalars,
    { kind: "array", items: { kind: "any", depth: depth + 1 }, min: 0, max: LIMITS.arrayItems },
    { kind: "free_object", depth: depth + 1 },
  ];
}

/** Whether `c` can start a value of `node`. */
function starts(node: Node, c: string): boolean {
  switch (node.kind) {
    case "literals":
      return node.options.some((o) => o[0] === c);
    case "string":
      return c === '"';
    case "number":
      return c === "-" || DIGITS.includes(c);
    case "array":
      return c === "[";
    case "object":
    case "free_object":
      return c === "{";
    case "any":
      return anyOptions(node.depth).some((o) => starts(o, c));
    case "union":
      return node.options.some((o) => starts(o, c));
  }
}

/** The string body after its opening quote, through the closing quote. */
function stringBody(r: Reader, min: number, max: number): void {
  let chars = 0;
  while (true) {
    const c = r.next();
    if (c === '"') {
      if (chars < min) throw INVALID;
      return;
    }
    if (chars >= max) throw INVALID;
    if (c === "\\") {
      const e = r.next();
      if (e === "u") {
        for (let i = 0; i < 4; i++) if (!/[0-9a-fA-F]/.test(r.next())) throw INVALID;
      } else if (!'"\\/bfnrt'.includes(e)) throw INVALID;
    } else if (c < " ") throw INVALID;
    chars++;
  }
}

/** Whether some integer of at most `maxDigits` digits that starts with `sign digits` fits. */
function integerPrefixFits(neg: boolean, digits: string, min: number, max: number): boolean {
  const fits = (lo: number, hi: number) => Math.max(lo, min) <= Math.min(hi, max);
  if (digits === "0") return fits(0, 0);
  if (digits === "") return neg ? fits(-Infinity, -1) : true;
  const d = Number(digits);
  for (let len = digits.length; len <= LIMITS.intDigits; len++) {
    const scale = 10 ** (len - digits.length);
    const lo = d * scale;
    const hi = (d + 1) * scale - 1;
    if (neg ? fits(-hi, -lo) : fits(lo, hi)) return true;
  }
  return false;
}

function number(r: Reader, node: Extract<Node, { kind: "number" }>): void {
  const neg = r.peek() === "-";
  if (neg) r.pos++;
  let digits = "";
  const check = () => {
    if (!integerPrefixFits(neg, digits, node.min, node.max)) throw INVALID;
  };
  check();
  const first = r.next();
  if (!DIGITS.includes(first)) throw INVALID;
  digits += first;
  check();
  if (first !== "0") {
    while (DIGITS.includes(r.peek()) && digits.length < LIMITS.intDigits) {
      digits += r.next();
      check();
    }
  }
  if (node.integer || r.peek() !== ".") return;
  r.pos++;
  let fraction = 0;
  while (fraction < LIMITS.fractionDigits && DIGITS.includes(r.peek())) {
    r.pos++;
    fraction++;
  }
  if (fraction === 0) throw INVALID;
}

function array(r: Reader, node: Extract<Node, { kind: "array" }>): void {
  literals(r, ["["]);
  let n = 0;
  if (r.peek() === "]" && n >= node.min) {
    r.pos++;
    return;
  }
  while (true) {
    if (n >= node.max) throw INVALID;
    value(r, node.items);
    n++;
    const options = [];
    if (n >= node.min) options.push("]");
    if (n < node.max) options.push(", ");
    if (literals(r, options) === "]") return;
  }
}

function object(r: Reader, node: Extract<Node, { kind: "object" }>): void {
  literals(r, ["{"]);
  let next = 0;
  let first = true;
  while (true) {
    // Keys come in schema order; optional ones may be skipped up to the next required one.
    const choices: number[] = [];
    for (let j = next; j < node.props.length; j++) {
      choices.push(j);
      if (node.props[j].required) break;
    }
    const mayClose = !node.props.slice(next).some((p) => p.required);
    const options = choices.map((j) =>
      `${first ? "" : ", "}${JSON.stringify(node.props[j].key)}: `
    );
    if (mayClose) options.push("}");
    const picked = literals(r, options);
    if (picked === "}") return;
    const j = choices[options.indexOf(picked)];
    value(r, node.props[j].node);
    next = j + 1;
    first = false;
    if (next === node.props.length) {
      literals(r, ["}"]);
      return;
    }
  }
}

function freeObject(r: Reader, depth: number): void {
  literals(r, ["{"]);
  for (let n = 0;; n++) {
    const options = n >= LIMITS.freeProperties ? ["}"] : ["}", n === 0 ? '"' : ', "'];
    if (literals(r, options) === "}") return;
    stringBody(r, 1, LIMITS.keyChars);
    literals(r, [": "]);
    value(r, { kind: "any", depth: depth + 1 });
  }
}

function value(r: Reader, node: Node): void {
  switch (node.kind) {
    case "literals":
      literals(r, node.options);
      return;
    case "string":
      literals(r, ['"']);
      stringBody(r, node.min, node.max);
      return;
    case "number":
      number(r, node);
      return;
    case "array":
      array(r, node);
      return;
    case "object":
      object(r, node);
      return;
    case "free_object":
      freeObject(r, node.depth);
      return;
    case "any":
    case "union": {
      const options = node.kind === "any" ? anyOptions(node.depth) : node.options;
      const c = r.peek();
      const pick = options.find((o) => starts(o, c));
      if (!pick) throw INVALID;
      value(r, pick);
    }
  }
}

export type Match = "complete" | "partial" | "invalid";

/** The grammar of one forced tool call among `tools`. */
export class ToolCallGrammar {
  readonly #names: readonly string[];
  readonly #nodes: ReadonlyMap<string, Node>;

  constructor(tools: readonly ToolSpec[]) {
    if (tools.length === 0) throw new RangeError("Cannot force a tool call: no tools were given");
    this.#names = tools.map((t) => JSON.stringify(t.name));
    this.#nodes = new Map(tools.map((t) => [JSON.stringify(t.name), compileSchema(t.inputSchema)]));
  }

  /** Whether `text` is the whole call, a start of one, or neither. */
  match(text: string): Match {
    const r = new Reader(text);
    try {
      literals(r, ['<tool_call>\n{"name": ']);
      const name = literals(r, this.#names);
      literals(r, [', "arguments": ']);
      value(r, this.#nodes.get(name)!);
      literals(r, ["}\n</tool_call>"]);
      return r.pos === text.length ? "complete" : "invalid";
    } catch (e) {
      if (e === MORE) return "partial";
      if (e === INVALID) return "invalid";
      throw e;
    }
  }
}

/** Characters tried, in order, when no candidate the stage sent fits: closers first. */
const FALLBACK_CHARS = [
  '"',
  "}",
  "]",
  "\n",
  ...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)),
];

/**
 * Applies a ToolCallGrammar to generation: only tokens whose text keeps the output a prefix
 * of a valid call are viable; control tokens (and end of generation) never are.
 */
export class ToolCallConstraint implements TokenConstraint {
  readonly #grammar: ToolCallGrammar;
  readonly #tokenizer: TextTokenizer;
  readonly #texts = new Map<number, string | null>();
  readonly #fatal = new TextDecoder("utf-8", { fatal: true });
  #text = "";
  #done = false;

  constructor(tokenizer: TextTokenizer, tools: readonly ToolSpec[]) {
    this.#tokenizer = tokenizer;
    this.#grammar = new ToolCallGrammar(tools);
  }

  get done(): boolean {
    return this.#done;
  }

  /** The text generated under the grammar so far. */
  get text(): string {
    return this.#text;
  }

  viable(ranked: readonly TopEntry[], limit: number): TopEntry[] {
    const out: TopEntry[] = [];
    for (const c of ranked) {
      const t = this.#tokenText(c.id);
      if (t !== null && this.#grammar.match(this.#text + t) !== "invalid") {
        out.push(c);
        if (out.length >= limit) break;
      }
    }
    return out;
  }

  fallback(): number {
    for (const c of FALLBACK_CHARS) {
      if (this.#grammar.match(this.#text + c) === "invalid") continue;
      const ids = this.#tokenizer.encode(c, { specials: false });
      if (ids.length === 1) return ids[0];
    }
    throw new RangeError(
      `Cannot continue the forced tool call after ${JSON.stringify(this.#text)}: no single ` +
        `character fits the grammar`,
    );
  }

  accept(id: number): void {
    this.#text += this.#tokenText(id) ?? "";
    this.#done = this.#grammar.match(this.#text) === "complete";
  }

  /** A token's text, or null when it is not whole UTF-8 text (control tokens, byte pieces). */
  #tokenText(id: number): string | null {
    let text = this.#texts.get(id);
    if (text === undefined) {
      const bytes = this.#tokenizer.tokenBytes(id, { specials: false });
      try {
        text = bytes.length ? this.#fatal.decode(bytes) : null;
      } catch (e) {
        if (!(e instanceof TypeError)) throw e;
        text = null; // Part of a multi-byte character: not text on its own.
      }
      this.#texts.set(id, text);
    }
    return text;
  }
}
