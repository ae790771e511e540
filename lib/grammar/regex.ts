// JSON Schema `pattern`s (the ECMAScript syntax without backreferences or lookaround) compiled to a
// size-bounded NFA that runs in time linear in the text; lib/grammar/json_grammar.ts and json_schema.ts.

import { CharSet, MAX_CODE_POINT } from "./charset.ts";
import { GrammarError } from "./grammar.ts";

/** Most NFA states one pattern may expand to (counted repetitions are unrolled). */
export const MAX_NFA_STATES = 4096;

/**
 * A pattern this engine refuses: a syntax error or an unsupported construct (with its offset),
 * or, while it runs, an automaton grown past its bound.
 */
export class PatternError extends GrammarError {
  override name = "PatternError";
}

type Node =
  | { readonly k: "set"; readonly set: CharSet }
  | { readonly k: "seq"; readonly items: readonly Node[] }
  | { readonly k: "alt"; readonly items: readonly Node[] }
  | { readonly k: "rep"; readonly node: Node; readonly min: number; readonly max: number }
  | { readonly k: "bol" }
  | { readonly k: "eol" };

const DIGIT = CharSet.range(0x30, 0x39);
const WORD = CharSet.fromRanges([0x30, 0x39, 0x41, 0x5a, 0x5f, 0x5f, 0x61, 0x7a]);
const SPACE = CharSet.fromRanges([
  0x09,
  0x0d,
  0x20,
  0x20,
  0xa0,
  0xa0,
  0x1680,
  0x1680,
  0x2000,
  0x200a,
  0x2028,
  0x2029,
  0x202f,
  0x202f,
  0x205f,
  0x205f,
  0x3000,
  0x3000,
  0xfeff,
  0xfeff,
]);
const LINE_TERMINATORS = CharSet.of(0x0a, 0x0d, 0x2028, 0x2029);
const DOT = LINE_TERMINATORS.negate();
const SYNTAX = "^$\\.*+?()[]{}|/";
const CONTROL_ESCAPES: Readonly<Record<string, number>> = { t: 9, n: 10, v: 11, f: 12, r: 13 };

class Parser {
  pos = 0;
  constructor(readonly src: string) {}

  fail(what: string): never {
    throw new PatternError(`${what} at offset ${this.pos}`);
  }

  peek(): string | undefined {
    return this.src[this.pos];
  }

  eat(c: string): boolean {
    if (this.src.startsWith(c, this.pos)) {
      this.pos += c.length;
      return true;
    }
    return false;
  }

  /** The next code point, consumed. */
  codePoint(): number {
    const cp = this.src.codePointAt(this.pos);
    if (cp === undefined) this.fail("unexpected end of pattern");
    this.pos += cp > 0xffff ? 2 : 1;
    return cp;
  }

  disjunction(): Node {
    const items = [this.alternative()];
    while (this.eat("|")) items.push(this.alternative());
    return items.length === 1 ? items[0] : { k: "alt", items };
  }

  alternative(): Node {
    const items: Node[] = [];
    while (this.pos < this.src.length && this.peek() !== "|" && this.peek() !== ")") {
      items.push(this.term());
    }
    return items.length === 1 ? items[0] : { k: "seq", items };
  }

  term(): Node {
    if (this.eat("^")) return { k: "bol" };
    if (this.eat("$")) return { k: "eol" };
    if (this.src.startsWith("\\b", this.pos) || this.src.startsWith("\\B", this.pos)) {
      this.fail("word-boundary assertions (\\b, \\B) are not supported");
    }
    const atom = this.atom();
    return this.quantified(atom);
  }

  quantified(atom: Node): Node {
    let min: number;
    let max: number;
    const at = this.pos;
    if (this.eat("*")) [min, max] = [0, Infinity];
    else if (this.eat("+")) [min, max] = [1, Infinity];
    else if (this.eat("?")) [min, max] = [0, 1];
    else if (this.peek() === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(this.src.slice(this.pos));
      if (!m) this.fail("a lone '{' (escape it as \\{)");
      this.pos += m[0].length;
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === "" ? Infinity : Number(m[3]);
      if (!Number.isSafeInteger(min) || (max !== Infinity && !Number.isSafeInteger(max))) {
        this.pos = at;
        this.fail("a repetition count too large");
      }
      if (max < min) {
        this.pos = at;
        this.fail(`the repetition {${min},${max}} is out of order`);
      }
    } else return atom;
    this.eat("?"); // Lazy and greedy quantifiers match the same strings.
    if (this.peek() && "*+?{".includes(this.peek()!)) this.fail("a quantifier after a quantifier");
    return { k: "rep", node: atom, min, max };
  }

  atom(): Node {
    const c = this.peek();
    if (c === ".") {
      this.pos++;
      return { k: "set", set: DOT };
    }
    if (c === "(") return this.group();
    if (c === "[") return { k: "set", set: this.charClass() };
    if (c === "\\") {
      this.pos++;
      return { k: "set", set: this.atomEscape(false) };
    }
    if (c === undefined || ")]{}|*+?".includes(c)) {
      this.fail(c === undefined ? "unexpected end of pattern" : `an unexpected '${c}'`);
    }
    return { k: "set", set: CharSet.of(this.codePoint()) };
  }

  group(): Node {
    this.pos++;
    if (this.eat("?")) {
      if (this.eat(":")) {
        /* non-capturing */
      } else if (this.eat("<") && /^[A-Za-z_$]/.test(this.peek() ?? "")) {
        const end = this.src.indexOf(">", this.pos);
        if (end === -1) this.fail("an unterminated group name");
        this.pos = end + 1;
      } else this.fail("lookahead and lookbehind assertions are not supported");
    }
    const inner = this.disjunction();
    if (!this.eat(")")) this.fail("a missing ')'");
    return inner;
  }

  /** An escape after '\'; `inClass`: inside [...], where \b is backspace and '-' may be escaped. */
  atomEscape(inClass: boolean): CharSet {
    const c = this.peek();
    if (c === undefined) this.fail("a '\\' at the end of the pattern");
    this.pos++;
    switch (c) {
      case "d":
        return DIGIT;
      case "D":
        return DIGIT.negate();
      case "w":
        return WORD;
      case "W":
        return WORD.negate();
      case "s":
        return SPACE;
      case "S":
        return SPACE.negate();
      case "b":
        if (inClass) return CharSet.of(8);
        break;
      case "0":
        if (/[0-9]/.test(this.peek() ?? "")) this.fail("octal escapes are not supported");
        return CharSet.of(0);
      case "c": {
        const letter = this.peek();
        if (!letter || !/[A-Za-z]/.test(letter)) this.fail("an invalid \\c escape");
        this.pos++;
        return CharSet.of(letter.charCodeAt(0) % 32);
      }
      case "x": {
        const m = /^[0-9A-Fa-f]{2}/.exec(this.src.slice(this.pos));
        if (!m) this.fail("an invalid \\x escape");
        this.pos += 2;
        return CharSet.of(parseInt(m[0], 16));
      }
      case "u":
        return CharSet.of(this.unicodeEscape());
      case "p":
      case "P":
        this.fail("Unicode property escapes (\\p{…}) are not supported");
        break;
      case "k":
        this.fail("backreferences are not supported");
        break;
      default:
        if (c in CONTROL_ESCAPES) return CharSet.of(CONTROL_ESCAPES[c]);
        if (/[1-9]/.test(c)) this.fail("backreferences are not supported");
        if (SYNTAX.includes(c) || (inClass && c === "-")) return CharSet.of(c.charCodeAt(0));
    }
    this.pos--;
    this.fail(`an unknown escape '\\${c}'`);
  }

  unicodeEscape(): number {
    const rest = this.src.slice(this.pos);
    const braced = /^\{([0-9A-Fa-f]{1,6})\}/.exec(rest);
    if (braced) {
      const cp = parseInt(braced[1], 16);
      if (cp > MAX_CODE_POINT) this.fail("a code point above U+10FFFF");
      this.pos += braced[0].length;
      return cp;
    }
    const m = /^[0-9A-Fa-f]{4}/.exec(rest);
    if (!m) this.fail("an invalid \\u escape");
    this.pos += 4;
    const unit = parseInt(m[0], 16);
    const low = /^\\u(D[C-F][0-9A-F]{2})/i.exec(this.src.slice(this.pos));
    if (unit >= 0xd800 && unit <= 0xdbff && low) {
      this.pos += 6;
      return 0x10000 + ((unit - 0xd800) << 10) + (parseInt(low[1], 16) - 0xdc00);
    }
    return unit;
  }

  charClass(): CharSet {
    this.pos++;
    const negated = this.eat("^");
    let set = CharSet.EMPTY;
    while (!this.eat("]")) {
      if (this.pos >= this.src.length) this.fail("a missing ']'");
      const lo = this.classAtom();
      if (this.peek() === "-" && this.src[this.pos + 1] !== "]" && this.pos + 1 < this.src.length) {
        this.pos++;
        const hi = this.classAtom();
        if (typeof lo !== "number" || typeof hi !== "number") {
          this.fail("a class escape (\\d, \\w, \\s) as a range bound");
        }
        if (hi < lo) this.fail("a character range out of order");
        set = set.union(CharSet.range(lo, hi));
      } else set = set.union(typeof lo === "number" ? CharSet.of(lo) : lo);
    }
    return negated ? set.negate() : set;
  }

  /** One class member: a code point, or a set for \d-style escapes. */
  classAtom(): number | CharSet {
    if (!this.eat("\\")) return this.codePoint();
    const set = this.atomEscape(true);
    return set.ranges.length === 2 && set.ranges[0] === set.ranges[1] ? set.ranges[0] : set;
  }
}

/** States the NFA of `node` takes (saturating above the limit). */
function size(node: Node): number {
  switch (node.k) {
    case "set":
      return 2;
    case "bol":
    case "eol":
      return 0;
    case "seq":
      return node.items.reduce((s, n) => Math.min(s + size(n), 1e9), 0);
    case "alt":
      return node.items.reduce((s, n) => Math.min(s + size(n), 1e9), node.items.length + 1);
    case "rep": {
      const copies = node.max === Infinity ? node.min + 1 : node.max;
      return Math.min((size(node.node) + 1) * copies + 2, 1e9);
    }
  }
}

interface State {
  readonly eps: number[];
  set?: CharSet;
  next?: number;
}

/**
 * Remaining lengths are known one by one up to this many characters (a length check past it goes
 * by fewest and most only).
 */
export const LENGTH_HORIZON = 1023;
export const LENGTH_WORDS = (LENGTH_HORIZON + 1) / 32;

/** Most sets of NFA states (DFA states) one pattern may meet while it runs. */
const MAX_DFA_STATES = 65_536;
/** Most cached transitions per pattern; past it transitions are recomputed, not stored. */
const MAX_TRANSITIONS = 262_144;
/** DFA states that get an ASCII step table (512 bytes each). */
const ASCII_TABLES = 4096;

/**
 * A compiled pattern: an NFA of at most MAX_NFA_STATES states over code points, run as a DFA
 * built on the way: each set of live NFA states it meets gets a number (its DFA state), and each
 * step from a set is cached, so reading a character usually costs one map lookup.
 */
export class Pattern {
  readonly states: readonly State[];
  readonly accept: number;
  /** The DFA state before any text. */
  readonly start: number;
  /** Fewest text units (see `cost`) from each NFA state to the accepting one; Infinity if none. */
  readonly #dist: Float64Array;
  /** Fewest and most characters from each NFA state to the accepting one (see `lengths`). */
  readonly #fewest: Float64Array;
  readonly #most: Float64Array;
  /**
   * The most characters a live state still lacks: a text with more room than this before its
   * maxLength is not held back by it (mask keys need not tell such counts apart).
   */
  readonly slack: number;
  readonly #mark: Uint32Array;
  #generation = 0;
  /** DFA state → its sorted live NFA states; index 0 is the dead (empty) set. */
  readonly #sets: (readonly number[])[] = [[]];
  readonly #ids = new Map<string, number>([["", 0]]);
  readonly #next = new Map<number, number>();
  /** Per DFA state (the first ASCII_TABLES): its steps on ASCII, -1 until taken. */
  readonly #ascii: Int32Array[] = [];
  /** Per DFA state: distance() and reads(), once asked, and alike() by its `within`. */
  readonly #distances: number[] = [];
  readonly #reads: CharSet[] = [];
  readonly #alike: Map<string, CharSet>[] = [];
  readonly #edges: (readonly number[])[] = [];
  /** Per NFA state: the lengths of its paths to the accepting one, as pathLengths() gives them. */
  #paths: Uint32Array | null = null;
  /** Per DFA state: lengthBits(), once asked. */
  readonly #lengthBits: Uint32Array[] = [];
  /**
   * Per DFA state: lengths(), from when it is made (mask walks ask at every character; a dense
   * array stays a fast one where one filled as asked could turn into a dictionary).
   */
  readonly #lengths: (readonly [number, number])[] = [[Infinity, -Infinity]];

  constructor(states: State[], start: number, accept: number, cost: (set: CharSet) => number) {
    this.states = states;
    this.accept = accept;
    this.#mark = new Uint32Array(states.length);
    this.#dist = distances(states, accept, cost);
    this.#fewest = distances(states, accept, (set) => set.empty ? Infinity : 1);
    this.#most = longest(states, accept, this.#fewest);
    this.slack = this.#fewest.reduce((a, b) => b === Infinity ? a : Math.max(a, b), 0);
    this.start = this.#intern(this.#closure([start]));
  }

  /** The DFA state after `id` reads `cp`; 0 (dead) when no completion can match. */
  step(id: number, cp: number): number {
    if (id === 0) return 0;
    if (cp < 0x80 && id < ASCII_TABLES) {
      // Most text is ASCII: a table per state is a plain index where the map hashes a double.
      const table = this.#ascii[id] ??= new Int32Array(0x80).fill(-1);
      if (table[cp] < 0) table[cp] = this.#stepOf(id, cp);
      return table[cp];
    }
    // A character no state reads is dead at once (dead ends are not cached: see #stepOf).
    return this.reads(id).has(cp) ? this.#stepOf(id, cp) : 0;
  }

  #stepOf(id: number, cp: number): number {
    const key = id * 0x110000 + cp;
    const hit = this.#next.get(key);
    if (hit !== undefined) return hit;
    const next: number[] = [];
    for (const s of this.#sets[id]) {
      const st = this.states[s];
      if (st.set?.has(cp)) next.push(st.next!);
    }
    // Dead ends are not cached: a mask walk tries tens of thousands of code points a state reads
    // none of, which would fill the cache and crowd out the transitions text takes.
    if (next.length === 0) return 0;
    const out = this.#intern(this.#closure(next));
    if (this.#next.size < MAX_TRANSITIONS) this.#next.set(key, out);
    return out;
  }

  /**
   * The largest part of `within` whose code points all step `id` alike (to one state, or all to
   * the dead one): each NFA state of `id` reads all of it or none. In `[A-Za-z ]{1,40}\.` that is
   * the loop's class beside its exit, and in `[a-z.]{1,40}\.` the class less its exit, `[a-z]`.
   * EMPTY when `within` is.
   */
  alike(id: number, within: CharSet): CharSet {
    const byWithin = this.#alike[id] ??= new Map();
    const key = within.ranges.join();
    let part = byWithin.get(key);
    if (part === undefined) {
      // Split `within` by each state's set; the parts read by the same states step alike.
      let parts = within.empty ? [] : [within];
      for (const s of this.#sets[id]) {
        const set = this.states[s].set;
        if (!set || set.empty) continue;
        const out = set.negate();
        parts = parts.flatMap((p) =>
          [CharSet.common([p, set]), CharSet.common([p, out])].filter((q) => !q.empty)
        );
      }
      part = parts.reduce((a, b) => (codePoints(b) > codePoints(a) ? b : a), CharSet.EMPTY);
      byWithin.set(key, part);
    }
    return part;
  }

  /** Whether some NFA state of `id` reads a code point in [lo, hi]. */
  meets(id: number, lo: number, hi: number): boolean {
    return this.#sets[id].some((s) => this.states[s].set?.meets(lo, hi) ?? false);
  }

  accepts(id: number): boolean {
    return this.#sets[id].includes(this.accept);
  }

  /** The code points some NFA state of `id` reads (what can come next, or more). */
  reads(id: number): CharSet {
    return this.#reads[id] ??= CharSet.fromRanges(
      this.#sets[id].flatMap((s) => this.states[s].set?.ranges ?? []),
    );
  }

  /**
   * Where what `id` reads changes: the first code point of each range its NFA states read and the
   * one after it, sorted. Between two of them, every code point steps `id` the same way.
   */
  edges(id: number): readonly number[] {
    return this.#edges[id] ??= [
      ...new Set(this.#sets[id].flatMap((s) => {
        const r = this.states[s].set?.ranges ?? [];
        return r.flatMap((x, i) => (i % 2 ? [x + 1] : [x]));
      })),
    ].sort((a, b) => a - b);
  }

  /** Fewest text units until `id` can accept. */
  distance(id: number): number {
    let best = this.#distances[id];
    if (best === undefined) {
      best = Infinity;
      for (const s of this.#sets[id]) best = Math.min(best, this.#dist[s]);
      this.#distances[id] = best;
    }
    return best;
  }

  /** Fewest text units until `id` can accept, once it has read one code point in [lo, hi]. */
  distanceAfter(id: number, lo: number, hi: number): number {
    let best = Infinity;
    for (const s of this.#sets[id]) {
      const st = this.states[s];
      if (st.set?.meets(lo, hi)) best = Math.min(best, this.#dist[st.next!]);
    }
    return best;
  }

  /**
   * Fewest and most characters until `id` can accept (most is Infinity through a loop; the dead
   * state has [Infinity, -Infinity]). The lengths between are not all possible ones: (ab|abcd)
   * gives [2, 4].
   */
  lengths(id: number): readonly [number, number] {
    return this.#lengths[id];
  }

  /**
   * Every number of characters up to LENGTH_HORIZON after which `id` can accept, as bits of
   * 32-bit words (bit l of word l >> 5): between fewest and most, lengths may have gaps.
   */
  lengthBits(id: number): Uint32Array {
    return this.#lengthBits[id] ??= this.#pathsOf(this.#sets[id]);
  }

  /** The lengths `id` can still take, in words: "2 or 6", "3 to 5", "4 or more", "2, 4, 6, …". */
  describeLengths(id: number): string {
    const [fewest, most] = this.lengths(id);
    const bits = this.lengthBits(id);
    const has = (l: number) => ((bits[l >>> 5] >>> (l & 31)) & 1) === 1;
    const runs: string[] = [];
    for (let l = fewest; l <= Math.min(most, LENGTH_HORIZON) && runs.length <= 4; l++) {
      if (!has(l)) continue;
      let end = l;
      while (end < LENGTH_HORIZON && has(end + 1)) end++;
      runs.push(
        end === LENGTH_HORIZON && most === Infinity
          ? `${l} or more`
          : end === l
          ? `${l}`
          : `${l} to ${end}`,
      );
      l = end;
    }
    if (runs.length > 4 || (most === Infinity && !runs.at(-1)!.endsWith("more"))) {
      return `${runs.slice(0, 4).join(", ")}, …`;
    }
    return runs.length === 1 ? runs[0] : `${runs.slice(0, -1).join(", ")} or ${runs.at(-1)}`;
  }

  /** lengthBits() once `id` has read one code point in [lo, hi]. */
  lengthBitsAfter(id: number, lo: number, hi: number): Uint32Array {
    const next = this.#sets[id].flatMap((s) =>
      this.states[s].set?.meets(lo, hi) ? [this.states[s].next!] : []
    );
    return this.#pathsOf(next);
  }

  /** The lengths of the paths from any of `from` to the accepting state, as bits. */
  #pathsOf(from: readonly number[]): Uint32Array {
    const paths = this.#paths ??= pathLengths(this.states, this.accept);
    const out = new Uint32Array(LENGTH_WORDS);
    for (const s of from) {
      for (let w = 0; w < LENGTH_WORDS; w++) out[w] |= paths[s * LENGTH_WORDS + w];
    }
    return out;
  }

  /** lengths() once `id` has read one code point in [lo, hi]; [Infinity, -Infinity] if none. */
  lengthsAfter(id: number, lo: number, hi: number): readonly [number, number] {
    let fewest = Infinity;
    let most = -Infinity;
    for (const s of this.#sets[id]) {
      const st = this.states[s];
      if (!st.set?.meets(lo, hi)) continue;
      fewest = Math.min(fewest, this.#fewest[st.next!]);
      most = Math.max(most, this.#most[st.next!]);
    }
    return [fewest, most];
  }

  /** Whether the whole of `text` matches. Linear in its length. */
  test(text: string): boolean {
    let id = this.start;
    for (const ch of text) {
      id = this.step(id, ch.codePointAt(0)!);
      if (id === 0) return false;
    }
    return this.accepts(id);
  }

  #intern(set: number[]): number {
    const key = set.join(",");
    let id = this.#ids.get(key);
    if (id === undefined) {
      if (this.#sets.length >= MAX_DFA_STATES) {
        throw new PatternError(
          `the pattern's automaton met more than ${MAX_DFA_STATES} state sets; use a simpler pattern`,
        );
      }
      id = this.#sets.length;
      this.#sets.push(set);
      let fewest = Infinity;
      let most = -Infinity;
      for (const s of set) {
        fewest = Math.min(fewest, this.#fewest[s]);
        most = Math.max(most, this.#most[s]);
      }
      this.#lengths.push([fewest, most]);
      this.#ids.set(key, id);
    }
    return id;
  }

  /** The epsilon closure of `seeds`, live states only, sorted. */
  #closure(seeds: readonly number[]): number[] {
    const gen = ++this.#generation;
    const out: number[] = [];
    const stack = [...seeds];
    while (stack.length) {
      const s = stack.pop()!;
      if (this.#mark[s] === gen) continue;
      this.#mark[s] = gen;
      if (this.#dist[s] === Infinity) continue;
      if (this.states[s].set || s === this.accept) out.push(s);
      stack.push(...this.states[s].eps);
    }
    return out.sort((a, b) => a - b);
  }
}

/** How many code points `set` holds. */
function codePoints(set: CharSet): number {
  let n = 0;
  for (let i = 0; i < set.ranges.length; i += 2) n += set.ranges[i + 1] - set.ranges[i] + 1;
  return n;
}

/**
 * The numbers of characters on the paths from each state to `accept`, up to LENGTH_HORIZON: state
 * s's as bits in words s·LENGTH_WORDS on. Layer l holds the states l characters from the end:
 * those that read a character into layer l − 1, and the states that reach them without one.
 */
function pathLengths(states: readonly State[], accept: number): Uint32Array {
  const byEps = states.map((): number[] => []);
  const byChar = states.map((): number[] => []);
  states.forEach((st, s) => {
    for (const e of st.eps) byEps[e].push(s);
    if (st.set && !st.set.empty) byChar[st.next!].push(s);
  });
  const bits = new Uint32Array(states.length * LENGTH_WORDS);
  const mark = new Int32Array(states.length).fill(-1);
  let layer = [accept];
  for (let l = 0; l <= LENGTH_HORIZON && layer.length; l++) {
    // The layer's states and those that reach one of them without reading.
    const stack: number[] = [];
    for (const s of layer) {
      if (mark[s] !== l) {
        mark[s] = l;
        stack.push(s);
      }
    }
    const members: number[] = [];
    while (stack.length) {
      const s = stack.pop()!;
      members.push(s);
      bits[s * LENGTH_WORDS + (l >>> 5)] |= 1 << (l & 31);
      for (const t of byEps[s]) {
        if (mark[t] !== l) {
          mark[t] = l;
          stack.push(t);
        }
      }
    }
    layer = members.flatMap((s) => byChar[s]);
  }
  return bits;
}

/** Shortest weighted paths to `accept` over reversed edges (Dial's buckets: weights are small). */
function distances(
  states: readonly State[],
  accept: number,
  cost: (set: CharSet) => number,
): Float64Array {
  const reverse: [number, number][][] = states.map(() => []);
  states.forEach((st, s) => {
    for (const e of st.eps) reverse[e].push([s, 0]);
    if (st.set) reverse[st.next!].push([s, cost(st.set)]);
  });
  const dist = new Float64Array(states.length).fill(Infinity);
  const buckets: number[][] = [[accept]];
  dist[accept] = 0;
  for (let d = 0; d < buckets.length; d++) {
    for (const u of buckets[d] ?? []) {
      if (dist[u] !== d) continue;
      for (const [v, w] of reverse[u]) {
        if (d + w < dist[v]) {
          dist[v] = d + w;
          (buckets[d + w] ??= []).push(v);
        }
      }
    }
  }
  return dist;
}

/**
 * Most characters on a path from each state to `accept` among the states `fewest` finds a path
 * from: Infinity through a loop that reads a character. Tarjan's components close after every
 * component they lead to, so each is measured once its successors are.
 */
function longest(
  states: readonly State[],
  accept: number,
  fewest: Float64Array,
): Float64Array {
  const most = new Float64Array(states.length).fill(-Infinity);
  const index = new Int32Array(states.length).fill(-1);
  const low = new Int32Array(states.length);
  const onStack = new Uint8Array(states.length);
  const component = new Int32Array(states.length).fill(-1);
  const stack: number[] = [];
  let counter = 0;
  const edges = (s: number): [number, number][] => {
    const st = states[s];
    const out: [number, number][] = st.eps.map((t) => [t, 0]);
    if (st.set && !st.set.empty) out.push([st.next!, 1]);
    return out.filter(([t]) => fewest[t] !== Infinity);
  };
  /** A component's root, once its members are popped: measures them all. */
  const close = (s: number) => {
    const members: number[] = [];
    let t: number;
    do {
      t = stack.pop()!;
      onStack[t] = 0;
      component[t] = s;
      members.push(t);
    } while (t !== s);
    let best = component[accept] === s ? 0 : -Infinity;
    for (const u of members) {
      for (const [v, w] of edges(u)) {
        const inside = component[v] === s;
        best = Math.max(best, inside ? (w ? Infinity : best) : w + most[v]);
      }
    }
    for (const u of members) most[u] = best;
  };
  // Depth-first without recursion (chains of unrolled repetitions run thousands of states deep):
  // each frame is a state and the successors it has yet to visit.
  const visit = (root: number) => {
    const frames: [number, number[]][] = [];
    const enter = (s: number) => {
      index[s] = low[s] = counter++;
      stack.push(s);
      onStack[s] = 1;
      frames.push([s, edges(s).map(([t]) => t)]);
    };
    enter(root);
    while (frames.length) {
      const [s, next] = frames.at(-1)!;
      const t = next.pop();
      if (t === undefined) {
        frames.pop();
        if (low[s] === index[s]) close(s);
        const parent = frames.at(-1);
        if (parent) low[parent[0]] = Math.min(low[parent[0]], low[s]);
      } else if (index[t] < 0) enter(t);
      else if (onStack[t]) low[s] = Math.min(low[s], index[t]);
    }
  };
  states.forEach((_, s) => {
    if (fewest[s] !== Infinity && index[s] < 0) visit(s);
  });
  return most;
}

function build(node: Node, states: State[], from: number): number {
  const add = () => states.push({ eps: [] }) - 1;
  switch (node.k) {
    case "set": {
      const to = add();
      states[from].set = node.set;
      states[from].next = to;
      const out = add();
      states[to].eps.push(out);
      return out;
    }
    case "seq":
      return node.items.reduce((at, item) => build(item, states, at), from);
    case "alt": {
      const out = add();
      for (const item of node.items) {
        const start = add();
        states[from].eps.push(start);
        states[build(item, states, start)].eps.push(out);
      }
      return out;
    }
    case "rep": {
      let at = from;
      for (let i = 0; i < node.min; i++) at = build(node.node, states, at);
      if (node.max === Infinity) {
        const loop = add();
        states[at].eps.push(loop);
        const body = add();
        states[loop].eps.push(body);
        states[build(node.node, states, body)].eps.push(loop);
        return loop;
      }
      const out = add();
      for (let i = node.min; i < node.max; i++) {
        states[at].eps.push(out);
        const body = add();
        states[at].eps.push(body);
        at = build(node.node, states, body);
      }
      states[at].eps.push(out);
      return out;
    }
    case "bol":
    case "eol":
      throw new PatternError("'^' and '$' are supported only at the start and end of the pattern");
  }
}

const ANY_TEXT: Node = { k: "rep", node: { k: "set", set: CharSet.ANY }, min: 0, max: Infinity };

/** A top-level alternative with its anchors turned into (absent) unanchored `.*` ends. */
function anchored(node: Node): Node {
  const items = node.k === "seq" ? [...node.items] : [node];
  const head = items[0]?.k === "bol" ? items.shift() : undefined;
  const tail = items.at(-1)?.k === "eol" ? items.pop() : undefined;
  return { k: "seq", items: [...(head ? [] : [ANY_TEXT]), ...items, ...(tail ? [] : [ANY_TEXT])] };
}

/**
 * Compiles a JSON Schema pattern: it matches a string when it matches some part of it (anchors
 * `^`/`$` pin the ends), as ECMAScript's RegExp.test does. `cost` weighs a transition for
 * distance(). Throws PatternError on syntax errors, unsupported constructs and patterns that
 * expand beyond MAX_NFA_STATES.
 */
export function compilePattern(source: string, cost: (set: CharSet) => number): Pattern {
  const parser = new Parser(source);
  const tree = parser.disjunction();
  if (parser.pos < source.length) parser.fail("an unmatched ')'");
  const top = tree.k === "alt" ? tree.items.map(anchored) : [anchored(tree)];
  const whole: Node = top.length === 1 ? top[0] : { k: "alt", items: top };
  const states = size(whole);
  if (states > MAX_NFA_STATES) {
    throw new PatternError(
      `the pattern expands to ${states >= 1e9 ? "over a billion" : states} states; at most ` +
        `${MAX_NFA_STATES} are supported (use smaller repetition counts)`,
    );
  }
  const list: State[] = [{ eps: [] }];
  const accept = build(whole, list, 0);
  return new Pattern(list, 0, accept, cost);
}
