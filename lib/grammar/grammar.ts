// Grammars for constrained decoding: rules of alternatives over code-point sets, rule references and
// leaves (JSON strings, numbers), run as a pushdown automaton over UTF-8 bytes by token_mask.ts.

import type { CharSet } from "./charset.ts";
import { type Utf8Partial, utf8Range, utf8Step } from "./utf8.ts";

/** A grammar this module refuses to build or to run, with the reason. */
export class GrammarError extends Error {
  override name = "GrammarError";
}

/**
 * A terminal with its own state machine: it reads code points until done() holds, after which
 * the grammar may go on (a number may also read more digits). States must be immutable.
 */
export interface Leaf<S = unknown> {
  /** Identifies the leaf's definition inside state keys. */
  readonly id: string;
  readonly start: S;
  /** The state after `cp`, or null when `cp` cannot come next. */
  step(state: S, cp: number): S | null;
  /** The leaf may end here. */
  done(state: S): boolean;
  /** Some code point in [lo, hi] can come next. */
  meets(state: S, lo: number, hi: number): boolean;
  /** Fewest UTF-8 bytes that end the leaf from `state` (a lower bound). */
  distance(state: S): number;
  /**
   * Identifies `state`: exactly, or (given `horizon`, the most characters a token holds) up to
   * what the next token can tell apart, so that states with equal mask keys allow the same tokens.
   */
  key(state: S, horizon?: number): string;
}

export type Element =
  | { readonly kind: "chars"; readonly set: CharSet }
  | { readonly kind: "ref"; readonly rule: Rule }
  | { readonly kind: "leaf"; readonly leaf: Leaf };

export interface Rule {
  readonly name: string;
  alts: Element[][];
}

/** Most elements a compiled grammar may hold. */
export const MAX_ELEMENTS = 200_000;
/** Most parse stacks one position may keep alive (an ambiguous grammar grows them). */
const MAX_STACKS = 4096;
/** Deepest rule nesting one stack may reach. */
const MAX_DEPTH = 10_000;

/** A position inside an alternative, with the continuation (`up`) to take after it. */
interface Frame {
  readonly alt: readonly Element[];
  readonly altId: number;
  readonly i: number;
  readonly leafState: unknown;
  readonly up: Frame | null;
  readonly depth: number;
  key?: string;
  /** Fewest bytes from this position to the end of the grammar. */
  rest?: number;
}

type Partial = Utf8Partial;

/** A compiled grammar: rules, its root, and the per-alternative tables its automaton uses. */
export class Grammar {
  readonly root: Rule;
  readonly #altIds = new Map<readonly Element[], number>();
  readonly #suffix = new Map<readonly Element[], Float64Array>();
  readonly #ruleMin = new Map<Rule, number>();

  constructor(root: Rule) {
    this.root = root;
    const rules = reachable(root);
    const elements = rules.reduce((n, r) => n + r.alts.reduce((m, a) => m + a.length + 1, 0), 0);
    if (elements > MAX_ELEMENTS) {
      throw new GrammarError(
        `the grammar has ${elements} elements; at most ${MAX_ELEMENTS} are supported`,
      );
    }
    pruneUnproductive(rules);
    if (root.alts.length === 0) throw new GrammarError("the grammar matches no text at all");
    checkLeftRecursion(rules);
    for (const r of rules) for (const a of r.alts) this.#altIds.set(a, this.#altIds.size);
    minLengths(rules, this.#ruleMin);
    for (const r of rules) {
      for (const a of r.alts) {
        const suffix = new Float64Array(a.length + 1);
        for (let i = a.length - 1; i >= 0; i--) suffix[i] = suffix[i + 1] + this.#minOf(a[i]);
        this.#suffix.set(a, suffix);
      }
    }
  }

  /** The leaves the grammar can reach (each once), for work done before its first text. */
  leaves(): Leaf[] {
    const leaves = new Set<Leaf>();
    for (const r of reachable(this.root)) {
      for (const a of r.alts) for (const e of a) if (e.kind === "leaf") leaves.add(e.leaf);
    }
    return [...leaves];
  }

  /** The state before any text. */
  start(): ParseState {
    const out = new Closure();
    for (const alt of this.root.alts) this.#expand(this.#frame(alt, 0, null), out);
    return out.state(this, null);
  }

  #minOf(e: Element): number {
    if (e.kind === "chars") return e.set.minUtf8Bytes();
    if (e.kind === "ref") return this.#ruleMin.get(e.rule)!;
    return e.leaf.distance(e.leaf.start);
  }

  /** A frame at element i of `alt`, or the continuation when i is past its end. */
  #frame(alt: readonly Element[], i: number, up: Frame | null): Frame | null {
    if (i === alt.length) return up;
    const e = alt[i];
    const depth = (up?.depth ?? 0) + 1;
    if (depth > MAX_DEPTH) throw new GrammarError(`the grammar nests deeper than ${MAX_DEPTH}`);
    return {
      alt,
      altId: this.#altIds.get(alt)!,
      i,
      leafState: e.kind === "leaf" ? e.leaf.start : undefined,
      up,
      depth,
    };
  }

  /** Adds the frames whose next element reads text, reached from `f` without reading any. */
  #expand(f: Frame | null, out: Closure): void {
    if (f === null) {
      out.accepting = true;
      return;
    }
    const e = f.alt[f.i];
    switch (e.kind) {
      case "chars":
        out.add(f);
        return;
      case "leaf":
        // A finished leaf that reads nothing more (a closed string) leaves no open parse.
        if (e.leaf.meets(f.leafState, 0, 0x10ffff)) out.add(f);
        if (e.leaf.done(f.leafState)) this.#expand(this.#frame(f.alt, f.i + 1, f.up), out);
        return;
      case "ref": {
        const up = this.#frame(f.alt, f.i + 1, f.up);
        for (const alt of e.rule.alts) this.#expand(this.#frame(alt, 0, up), out);
      }
    }
  }

  /** The state after `cp` (null: the grammar cannot read it here). */
  advance(state: ParseState, cp: number): ParseState | null {
    const out = new Closure();
    for (const f of state.frames) {
      const e = f.alt[f.i];
      if (e.kind === "chars") {
        if (e.set.has(cp)) this.#expand(this.#frame(f.alt, f.i + 1, f.up), out);
      } else if (e.kind === "leaf") {
        const next = e.leaf.step(f.leafState, cp);
        if (next !== null) {
          this.#expand({ ...f, leafState: next, key: undefined, rest: undefined }, out);
        }
      }
    }
    return out.size === 0 && !out.accepting ? null : out.state(this, null);
  }

  /** The state after one byte of UTF-8 text (null: no continuation of the grammar has it). */
  feed(state: ParseState, byte: number): ParseState | null {
    if (state.frames.length === 0) return null;
    const next = utf8Step(state.partial, byte);
    if (next === null) return null;
    if (typeof next === "number") return this.advance(state.withPartial(null), next);
    return this.#partial(state, next);
  }

  /** `state` inside a character, if some code point it may become can come next. */
  #partial(state: ParseState, p: Partial): ParseState | null {
    const [lo, hi] = utf8Range(p);
    if (lo > hi) return null;
    const ok = state.frames.some((f) => {
      const e = f.alt[f.i];
      return e.kind === "chars"
        ? e.set.meets(lo, hi)
        : e.kind === "leaf" && e.leaf.meets(f.leafState, lo, hi);
    });
    return ok ? state.withPartial(p) : null;
  }

  /**
   * The open leaf when `state` is inside one and nothing else: its one parse reads a leaf next
   * and no character is half read. Token walks then step the leaf itself (LeafCursor).
   */
  leafCursor(state: ParseState): LeafCursor | null {
    if (state.frames.length !== 1 || state.partial !== null || state.accepting) return null;
    const f = state.frames[0];
    const e = f.alt[f.i];
    if (e.kind !== "leaf") return null;
    const after = this.#suffix.get(f.alt)![f.i + 1] + (f.up ? this.#rest(f.up) : 0);
    return {
      leaf: e.leaf,
      state: f.leafState,
      after,
      resume: (leafState) => {
        const out = new Closure();
        this.#expand({ ...f, leafState, key: undefined, rest: undefined }, out);
        return out.state(this, null);
      },
    };
  }

  /** Fewest bytes from `state` to a complete text. */
  distance(state: ParseState): number {
    let best = state.accepting ? 0 : Infinity;
    for (const f of state.frames) best = Math.min(best, this.#rest(f));
    return best + (state.partial?.need ?? 0);
  }

  /** Fewest bytes from frame `f` (its element partly read, for a leaf) to the end. */
  #rest(f: Frame): number {
    if (f.rest === undefined) {
      const e = f.alt[f.i];
      const here = e.kind === "leaf" ? e.leaf.distance(f.leafState) : this.#minOf(e);
      f.rest = here + this.#suffix.get(f.alt)![f.i + 1] + (f.up ? this.#rest(f.up) : 0);
    }
    return f.rest;
  }

  /** Whether `text` is a whole sentence of the grammar, a prefix of one, or neither. */
  match(text: string): "complete" | "partial" | "invalid" {
    let state: ParseState | null = this.start();
    for (const byte of new TextEncoder().encode(text)) {
      state = this.feed(state, byte);
      if (state === null) return "invalid";
    }
    return state.accepting && state.partial === null ? "complete" : "partial";
  }
}

/** A parse inside one leaf, for walks that step the leaf directly. */
export interface LeafCursor {
  readonly leaf: Leaf;
  readonly state: unknown;
  /** Fewest bytes the grammar needs after the leaf ends. */
  readonly after: number;
  /** The parse state with the leaf at `leafState` (to go on with Grammar.feed). */
  resume(leafState: unknown): ParseState;
}

/** The frames one step reaches, deduplicated by their keys. */
class Closure {
  readonly #frames = new Map<string, Frame>();
  accepting = false;

  get size(): number {
    return this.#frames.size;
  }

  add(f: Frame): void {
    const key = frameKey(f);
    if (this.#frames.has(key)) return;
    if (this.#frames.size >= MAX_STACKS) {
      throw new GrammarError(
        `the grammar is too ambiguous: more than ${MAX_STACKS} parses stay open at once`,
      );
    }
    this.#frames.set(key, f);
  }

  state(g: Grammar, partial: Partial | null): ParseState {
    return new ParseState(g, [...this.#frames.values()], this.accepting, partial);
  }
}

function frameKey(f: Frame): string {
  if (f.key === undefined) {
    const e = f.alt[f.i];
    const leaf = e.kind === "leaf" ? `/${e.leaf.key(f.leafState)}` : "";
    f.key = `${f.altId}.${f.i}${leaf}>${f.up ? frameKey(f.up) : ""}`;
  }
  return f.key;
}

/** frameKey with the top leaf's state up to what a token of `horizon` characters can tell apart. */
function maskKey(f: Frame, horizon: number): string {
  const e = f.alt[f.i];
  if (e.kind !== "leaf") return frameKey(f);
  return `${f.altId}.${f.i}/${e.leaf.key(f.leafState, horizon)}>${f.up ? frameKey(f.up) : ""}`;
}

/** Where the automaton stands: the open parses, whether the text so far is complete, a partial char. */
export class ParseState {
  #key: string | undefined;
  #keyHorizon = 0;

  constructor(
    readonly grammar: Grammar,
    readonly frames: readonly Frame[],
    /** The text so far is a whole sentence. */
    readonly accepting: boolean,
    readonly partial: Partial | null,
  ) {}

  /** Nothing more can follow: the text is complete and final. */
  get final(): boolean {
    return this.accepting && this.frames.length === 0 && this.partial === null;
  }

  withPartial(partial: Partial | null): ParseState {
    return new ParseState(this.grammar, this.frames, this.accepting, partial);
  }

  /**
   * Equal keys, equal next-token masks over a vocabulary whose tokens hold at most `horizon`
   * characters: what a mask cache is keyed by.
   */
  maskKey(horizon: number): string {
    if (this.#key === undefined || this.#keyHorizon !== horizon) {
      this.#keyHorizon = horizon;
      const frames = [...new Set(this.frames.map((f) => maskKey(f, horizon)))].sort().join(" ");
      const p = this.partial;
      this.#key = `${this.accepting ? "A" : ""}${p ? `${p.cp}:${p.need}:${p.min}` : ""}|${frames}`;
    }
    return this.#key;
  }
}

function reachable(root: Rule): Rule[] {
  const seen = new Set<Rule>([root]);
  const list = [root];
  for (let i = 0; i < list.length; i++) {
    for (const alt of list[i].alts) {
      for (const e of alt) {
        if (e.kind === "ref" && !seen.has(e.rule)) {
          seen.add(e.rule);
          list.push(e.rule);
        }
      }
    }
  }
  return list;
}

/**
 * The rules with an alternative whose every element `holds`, where a reference holds when its
 * rule is in the set: the least fixpoint, grown until nothing changes.
 */
function rulesWhere(
  rules: readonly Rule[],
  holds: (e: Element, set: Set<Rule>) => boolean,
): Set<Rule> {
  const set = new Set<Rule>();
  for (let changed = true; changed;) {
    changed = false;
    for (const r of rules) {
      if (!set.has(r) && r.alts.some((a) => a.every((e) => holds(e, set)))) {
        set.add(r);
        changed = true;
      }
    }
  }
  return set;
}

/** Drops alternatives that can never finish (empty sets, rules without a finite text). */
function pruneUnproductive(rules: readonly Rule[]): void {
  const ok = (e: Element, productive: Set<Rule>) =>
    e.kind === "chars"
      ? !e.set.empty
      : e.kind === "leaf"
      ? e.leaf.distance(e.leaf.start) < Infinity
      : productive.has(e.rule);
  const productive = rulesWhere(rules, ok);
  for (const r of rules) r.alts = r.alts.filter((a) => a.every((e) => ok(e, productive)));
}

/** Refuses rules that can reach themselves without reading text: their expansion never ends. */
function checkLeftRecursion(rules: readonly Rule[]): void {
  const empty = (e: Element, set: Set<Rule>) =>
    e.kind === "ref" ? set.has(e.rule) : e.kind === "leaf" && e.leaf.done(e.leaf.start);
  const nullable = rulesWhere(rules, empty);
  const canBeEmpty = (e: Element) => empty(e, nullable);
  const firsts = new Map<Rule, Rule[]>();
  for (const r of rules) {
    const list: Rule[] = [];
    for (const a of r.alts) {
      for (const e of a) {
        if (e.kind === "ref") list.push(e.rule);
        if (!canBeEmpty(e)) break;
      }
    }
    firsts.set(r, list);
  }
  const state = new Map<Rule, "open" | "done">();
  const visit = (r: Rule) => {
    state.set(r, "open");
    for (const s of firsts.get(r)!) {
      if (state.get(s) === "open") {
        throw new GrammarError(
          `rule "${s.name}" can reach itself without reading any text (left recursion, or a ` +
            `repetition of something that can be empty)`,
        );
      }
      if (!state.has(s)) visit(s);
    }
    state.set(r, "done");
  };
  for (const r of rules) if (!state.has(r)) visit(r);
}

/** Each rule's fewest UTF-8 bytes (a fixpoint from Infinity down). */
function minLengths(rules: readonly Rule[], out: Map<Rule, number>): void {
  for (const r of rules) out.set(r, Infinity);
  const of = (e: Element) =>
    e.kind === "chars"
      ? e.set.minUtf8Bytes()
      : e.kind === "ref"
      ? out.get(e.rule)!
      : e.leaf.distance(e.leaf.start);
  for (let changed = true; changed;) {
    changed = false;
    for (const r of rules) {
      const best = Math.min(...r.alts.map((a) => a.reduce((s, e) => s + of(e), 0)));
      if (best < out.get(r)!) {
        out.set(r, best);
        changed = true;
      }
    }
  }
}
