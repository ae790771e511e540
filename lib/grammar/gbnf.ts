// llama.cpp's GBNF grammar text (`/completion`'s `grammar`) → grammar rules for lib/grammar/grammar.ts:
// rules, strings, character classes, `.`, groups, alternation, * + ? and {m,n} repetition, comments.

import { CharSet } from "./charset.ts";
import { type Element, Grammar, GrammarError, MAX_ELEMENTS, type Rule } from "./grammar.ts";

/** Largest count of a {m,n} repetition. */
const MAX_REPEAT = 10_000;

const NAME = /[A-Za-z0-9_-]/;

class GbnfParser {
  pos = 0;
  readonly rules = new Map<string, Rule>();
  readonly defined = new Set<string>();
  #anonymous = 0;
  #elements = 0;

  constructor(readonly src: string) {}

  fail(what: string): never {
    const line = this.src.slice(0, this.pos).split("\n").length;
    throw new GrammarError(`${what} (line ${line})`);
  }

  /** Skips spaces, tabs, comments and, when `newlines`, line breaks. */
  space(newlines: boolean): void {
    while (this.pos < this.src.length) {
      const c = this.src[this.pos];
      if (c === "#") {
        while (this.pos < this.src.length && this.src[this.pos] !== "\n") this.pos++;
      } else if (c === " " || c === "\t" || c === "\r" || (newlines && c === "\n")) this.pos++;
      else break;
    }
  }

  name(): string {
    const start = this.pos;
    while (this.pos < this.src.length && NAME.test(this.src[this.pos])) this.pos++;
    if (this.pos === start) {
      this.fail(`expected a rule name at "${this.src.slice(start, start + 12)}"`);
    }
    return this.src.slice(start, this.pos);
  }

  rule(name: string): Rule {
    let r = this.rules.get(name);
    if (!r) {
      r = { name, alts: [] };
      this.rules.set(name, r);
    }
    return r;
  }

  count(n: number): void {
    this.#elements += n;
    if (this.#elements > MAX_ELEMENTS) {
      this.fail(`the grammar expands to more than ${MAX_ELEMENTS} elements`);
    }
  }

  parse(): Rule {
    this.space(true);
    while (this.pos < this.src.length) {
      const name = this.name();
      this.space(false);
      if (!this.src.startsWith("::=", this.pos)) this.fail(`expected "::=" after rule "${name}"`);
      this.pos += 3;
      this.space(true);
      if (this.defined.has(name)) this.fail(`rule "${name}" is defined twice`);
      this.defined.add(name);
      this.rule(name).alts = this.alternatives(false);
      this.space(true);
    }
    for (const name of this.rules.keys()) {
      if (!this.defined.has(name)) throw new GrammarError(`rule "${name}" is used but not defined`);
    }
    if (!this.defined.has("root")) throw new GrammarError(`the grammar has no "root" rule`);
    return this.rules.get("root")!;
  }

  /** Alternatives up to the end of the rule (a line break outside parentheses) or a ')'. */
  alternatives(nested: boolean): Element[][] {
    const alts = [this.sequence(nested)];
    while (this.src[this.pos] === "|") {
      this.pos++;
      this.space(true);
      alts.push(this.sequence(nested));
    }
    return alts;
  }

  sequence(nested: boolean): Element[] {
    const out: Element[] = [];
    for (;;) {
      this.space(nested);
      const c = this.src[this.pos];
      if (c === undefined || c === "|" || c === ")" || c === "\n") return out;
      const start = out.length;
      this.atom(out);
      this.repeat(out, start);
      this.count(out.length - start);
    }
  }

  atom(out: Element[]): void {
    const c = this.src[this.pos];
    if (c === '"') {
      this.pos++;
      while (this.src[this.pos] !== '"') {
        if (this.pos >= this.src.length) this.fail("an unterminated string");
        out.push({ kind: "chars", set: CharSet.of(this.char()) });
      }
      this.pos++;
    } else if (c === "[") out.push({ kind: "chars", set: this.charClass() });
    else if (c === ".") {
      this.pos++;
      out.push({ kind: "chars", set: CharSet.ANY });
    } else if (c === "(") {
      this.pos++;
      this.space(true);
      const group = this.rule(`(group ${++this.#anonymous})`);
      this.defined.add(group.name);
      group.alts = this.alternatives(true);
      if (this.src[this.pos] !== ")") this.fail("a missing ')'");
      this.pos++;
      out.push({ kind: "ref", rule: group });
    } else if (c === "<") this.fail("token references (<…>) are not supported");
    else if (NAME.test(c)) {
      const at = this.pos;
      const name = this.name();
      this.space(false);
      if (this.src.startsWith("::=", this.pos)) {
        this.pos = at; // The next rule starts here.
        this.fail(`rule "${name}" must start on its own line`);
      }
      out.push({ kind: "ref", rule: this.rule(name) });
    } else this.fail(`an unexpected "${c}"`);
  }

  /** Applies a postfix repetition to the elements of out from `start` (one atom). */
  repeat(out: Element[], start: number): void {
    const c = this.src[this.pos];
    let min: number;
    let max: number;
    if (c === "*") [min, max] = [0, Infinity];
    else if (c === "+") [min, max] = [1, Infinity];
    else if (c === "?") [min, max] = [0, 1];
    else if (c === "{") {
      const m = /^\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}/.exec(this.src.slice(this.pos));
      if (!m) this.fail("an invalid {m,n} repetition");
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === "" ? Infinity : Number(m[3]);
      if (min > MAX_REPEAT || (max !== Infinity && max > MAX_REPEAT) || max < min) {
        this.fail(`a repetition {${m[1]},${m[3] ?? ""}} outside 0..${MAX_REPEAT} or out of order`);
      }
      this.pos += m[0].length - 1;
    } else return;
    this.pos++;
    const atom = out.splice(start);
    const item: Element = atom.length === 1 ? atom[0] : { kind: "ref", rule: this.#wrap(atom) };
    for (let i = 0; i < min; i++) out.push(item);
    if (max === Infinity) {
      const loop = this.#anon();
      loop.alts = [[item, { kind: "ref", rule: loop }], []];
      out.push({ kind: "ref", rule: loop });
    } else if (max > min) {
      // opt(k) ::= item opt(k-1) | ε, nested so at most max − min more items fit.
      let tail: Rule | undefined;
      for (let k = 0; k < max - min; k++) {
        const opt = this.#anon();
        opt.alts = [tail ? [item, { kind: "ref", rule: tail }] : [item], []];
        tail = opt;
      }
      out.push({ kind: "ref", rule: tail! });
    }
    this.count(min + 2 * (max === Infinity ? 1 : max - min));
  }

  #anon(): Rule {
    const r = this.rule(`(repeat ${++this.#anonymous})`);
    this.defined.add(r.name);
    return r;
  }

  #wrap(elements: Element[]): Rule {
    const r = this.#anon();
    r.alts = [elements];
    return r;
  }

  /** One character of a string or class, escapes decoded. */
  char(): number {
    const c = this.src.codePointAt(this.pos);
    if (c === undefined) this.fail("unexpected end of grammar");
    if (c !== 0x5c) {
      this.pos += c > 0xffff ? 2 : 1;
      return c;
    }
    const e = this.src[this.pos + 1];
    this.pos += 2;
    const simple: Record<string, number> = {
      n: 10,
      t: 9,
      r: 13,
      "\\": 0x5c,
      '"': 0x22,
      "[": 0x5b,
      "]": 0x5d,
      "-": 0x2d,
      "^": 0x5e,
    };
    if (e in simple) return simple[e];
    const digits = e === "x" ? 2 : e === "u" ? 4 : e === "U" ? 8 : 0;
    const hex = this.src.slice(this.pos, this.pos + digits);
    if (!digits || !/^[0-9A-Fa-f]+$/.test(hex) || hex.length !== digits) {
      this.fail(`an invalid escape "\\${e}"`);
    }
    this.pos += digits;
    const cp = parseInt(hex, 16);
    if (cp > 0x10ffff) this.fail("a code point above U+10FFFF");
    return cp;
  }

  charClass(): CharSet {
    this.pos++;
    const negated = this.src[this.pos] === "^";
    if (negated) this.pos++;
    const ranges: number[] = [];
    while (this.src[this.pos] !== "]") {
      if (this.pos >= this.src.length) this.fail("an unterminated character class");
      const lo = this.char();
      let hi = lo;
      if (this.src[this.pos] === "-" && this.src[this.pos + 1] !== "]") {
        this.pos++;
        hi = this.char();
        if (hi < lo) this.fail("a character range out of order");
      }
      ranges.push(lo, hi);
    }
    this.pos++;
    const set = CharSet.fromRanges(ranges);
    return negated ? set.negate() : set;
  }
}

/** Compiles GBNF text; a GrammarError names the problem and its line. */
export function parseGbnf(text: string): Grammar {
  return new Grammar(new GbnfParser(text).parse());
}
