// The grammar leaves of JSON values and reasoning text: a JSON string (escapes, length, pattern, excluded
// names), a JSON number within bounds, and free text up to a marker. Built by json_grammar.ts.

import type { Leaf } from "./grammar.ts";
import { MAX_CODE_POINT } from "./charset.ts";
import { LENGTH_HORIZON, LENGTH_WORDS, type Pattern } from "./regex.ts";

/** Sets of patterns' states whose joint lengths a string leaf keeps (then it starts afresh). */
const JOINT_CACHE = 4096;
/** Most states of patterns read together that one joint-lengths search visits. */
const JOINT_WORK = 20_000;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const SIMPLE_ESCAPES: Readonly<Record<number, number>> = {
  0x22: 0x22,
  0x5c: 0x5c,
  0x2f: 0x2f,
  0x62: 8,
  0x66: 12,
  0x6e: 10,
  0x72: 13,
  0x74: 9,
};

/**
 * The escapes whose letter is a plain character of a string body, by letter: the character each
 * stands for (`\"` and `\\` begin with bytes that are not plain text; `\u` reads hex digits).
 */
export const LETTER_ESCAPES: ReadonlyMap<number, number> = new Map(
  Object.entries(SIMPLE_ESCAPES)
    .map(([letter, c]) => [Number(letter), c] as const)
    .filter(([letter]) => letter !== QUOTE && letter !== BACKSLASH),
);

function hexValue(cp: number): number {
  if (cp >= 0x30 && cp <= 0x39) return cp - 0x30;
  if (cp >= 0x41 && cp <= 0x46) return cp - 0x37;
  if (cp >= 0x61 && cp <= 0x66) return cp - 0x57;
  return -1;
}

export interface StringRules {
  readonly minLength: number;
  readonly maxLength: number;
  /** Patterns the value must match (the schema's `pattern`, a `format`'s pattern). */
  readonly patterns: readonly Pattern[];
  /** Values the string may not take (an object's declared names, for its extra keys). */
  readonly exclude: readonly string[];
}

/**
 * A JSON string, quotes included. `phase`: 0 before the opening quote, 1 in the body, 2 closed.
 * `esc`: 0 none, 1 after '\', 2..5 in \u with esc − 2 hex digits read (value in `hex`).
 */
interface StringState {
  readonly phase: 0 | 1 | 2;
  readonly esc: number;
  readonly hex: number;
  readonly count: number;
  /** Each pattern's DFA state. */
  readonly sets: readonly number[];
  /** The value so far while it is a prefix of an excluded name, else null. */
  readonly prefix: string | null;
}

export class StringLeaf implements Leaf<StringState> {
  readonly id: string;
  readonly start: StringState;
  /** Room before maxLength past which no pattern's length holds a character back (key()). */
  readonly #slack: number;
  /**
   * Whether lengths can strand a live state: not with one pattern and no bounds, where every
   * state the pattern lives in can close (closable() is asked at every character of mask walks,
   * which skip it when this is false).
   */
  readonly bound: boolean;
  /** #jointBits() by the patterns' states. */
  readonly #joint = new Map<string, Uint32Array>();

  constructor(readonly rules: StringRules, id: string) {
    this.id = id;
    this.#slack = Math.max(0, ...rules.patterns.map((p) => p.slack));
    this.bound = rules.patterns.length > 1 || rules.minLength > 0 ||
      rules.maxLength !== Infinity;
    this.start = {
      phase: 0,
      esc: 0,
      hex: 0,
      count: 0,
      sets: rules.patterns.map((p) => p.start),
      prefix: rules.exclude.length ? "" : null,
    };
  }

  step(s: StringState, cp: number): StringState | null {
    if (s.phase === 0) return cp === QUOTE ? { ...s, phase: 1 } : null;
    if (s.phase === 2) return null;
    if (s.esc === 1) {
      if (cp === 0x75) return this.#hexFits(s, 0, 0) ? { ...s, esc: 2, hex: 0 } : null;
      const c = SIMPLE_ESCAPES[cp];
      return c === undefined ? null : this.#char({ ...s, esc: 0 }, c);
    }
    if (s.esc >= 2) {
      const d = hexValue(cp);
      if (d < 0) return null;
      const hex = s.hex * 16 + d;
      if (s.esc < 5) return this.#hexFits(s, hex, s.esc - 1) ? { ...s, esc: s.esc + 1, hex } : null;
      // Surrogate escapes are not generated: a model writes such characters as UTF-8.
      return hex >= 0xd800 && hex <= 0xdfff ? null : this.#char({ ...s, esc: 0, hex: 0 }, hex);
    }
    if (cp === QUOTE) return this.#closable(s) ? { ...s, phase: 2 } : null;
    if (cp === BACKSLASH) {
      const simple = Object.values(SIMPLE_ESCAPES).some((c) => this.fits(s.count, s.sets, c, c));
      return simple || this.#hexFits(s, 0, 0) ? { ...s, esc: 1 } : null;
    }
    if (cp < 0x20) return null;
    return this.#char(s, cp);
  }

  /**
   * Some value character in [lo, hi] can come next after a body of `count` characters, its
   * patterns' states at sets[at], sets[at + 1], …: every pattern reads one, and the string can
   * still close after it (closable()).
   */
  fits(count: number, sets: ArrayLike<number>, lo: number, hi: number, at = 0): boolean {
    if (count >= this.rules.maxLength) return false;
    const { patterns } = this.rules;
    if (!this.bound) return sets.length === 0 || patterns[0].meets(sets[at], lo, hi);
    if (patterns.length < 2) return this.#lengthIn(count + 1, sets, at, lo, hi);
    // Patterns together: each character they may read, one per stretch that steps them alike.
    const from = Array.from(patterns, (_, i) => sets[at + i]);
    return this.#stretches(from, lo, hi).some((cp) => {
      const next = from.map((set, i) => patterns[i].step(set, cp));
      return !next.includes(0) && this.closable(count + 1, next);
    });
  }

  /**
   * The first code point of each stretch of [lo, hi] over which the patterns' states `sets` all
   * step alike.
   */
  #stretches(sets: readonly number[], lo: number, hi: number): number[] {
    const edges = sets.flatMap((set, i) => this.rules.patterns[i].edges(set));
    return [...new Set([lo, ...edges.filter((e) => e > lo && e <= hi)])];
  }

  /**
   * The numbers of characters more after which the patterns' states `sets` all accept at once
   * (as Pattern.lengthBits gives one pattern's): the strings they read together, layer by layer
   * (a format's pattern is short, so these are few). Past JOINT_WORK states each pattern's own
   * lengths stand in, as they did before.
   */
  #jointBits(sets: readonly number[]): Uint32Array {
    const key = sets.join(",");
    let bits = this.#joint.get(key);
    if (bits) return bits;
    const { patterns } = this.rules;
    bits = new Uint32Array(LENGTH_WORDS);
    let layer = [sets];
    for (let l = 0, work = 0; l <= LENGTH_HORIZON && layer.length; l++) {
      const next = new Map<string, number[]>();
      for (const t of layer) {
        if (t.every((set, i) => patterns[i].accepts(set))) bits[l >>> 5] |= 1 << (l & 31);
        for (const cp of this.#stretches(t, 0, MAX_CODE_POINT)) {
          const u = t.map((set, i) => patterns[i].step(set, cp));
          if (!u.includes(0)) next.set(u.join(","), u);
        }
      }
      layer = [...next.values()];
      work += layer.length;
      if (work > JOINT_WORK) {
        bits.fill(-1);
        for (let i = 0; i < patterns.length; i++) {
          const own = patterns[i].lengthBits(sets[i]);
          for (let w = 0; w < LENGTH_WORDS; w++) bits[w] &= own[w];
        }
        break;
      }
    }
    if (this.#joint.size >= JOINT_CACHE) this.#joint.clear();
    this.#joint.set(key, bits);
    return bits;
  }

  /**
   * Whether a body of `count` characters, its patterns' states at sets[at], sets[at + 1], …, can
   * still close within minLength and maxLength: a length every pattern may still take fits the
   * bounds. A pattern and a maxLength that leave no such length would strand the string: no
   * character may lead there.
   */
  closable(count: number, sets: ArrayLike<number>, at = 0): boolean {
    return !this.bound || this.#lengthIn(count, sets, at, -1, -1);
  }

  /**
   * Whether a body of `count` characters, its patterns' states at sets[at], sets[at + 1], …, can
   * take some number of characters more that its patterns may take together within minLength and
   * maxLength: from those states, or (lo ≥ 0, one pattern) once its state has read a character in
   * [lo, hi] (count then includes it). One pattern's fewest and most are lengths it takes, so the
   * lengths between (Pattern.lengthBits) are read only where the bounds cut between them
   * (`(ab|abcdef)` with minLength 3 and maxLength 5); past LENGTH_HORIZON by fewest and most
   * alone. Mask walks ask it at every character, so it reads the states itself: callbacks would
   * be two allocations a call.
   */
  #lengthIn(
    count: number,
    sets: ArrayLike<number>,
    at: number,
    lo: number,
    hi: number,
  ): boolean {
    const { patterns } = this.rules;
    const k = patterns.length;
    let least = Math.max(0, this.rules.minLength - count);
    let room = this.rules.maxLength - count;
    let fewest = 0;
    let most = 0;
    for (let i = 0; i < k; i++) {
      const lengths = lo < 0
        ? patterns[i].lengths(sets[at + i])
        : patterns[i].lengthsAfter(sets[at + i], lo, hi);
      fewest = lengths[0];
      most = lengths[1];
      if (fewest > least) least = fewest;
      if (most < room) room = most;
    }
    if (least > room) return false;
    if (k === 0 || (k === 1 && (fewest === least || most === room))) return true;
    const top = Math.min(room, LENGTH_HORIZON);
    if (least > top) return true;
    const shared = lo >= 0
      ? patterns[0].lengthBitsAfter(sets[at], lo, hi)
      : k === 1
      ? patterns[0].lengthBits(sets[at])
      : this.#jointBits(Array.from(patterns, (_, i) => sets[at + i]));
    for (let w = least >>> 5; w <= top >>> 5; w++) {
      let word = shared[w];
      if (w === least >>> 5) word &= -1 << (least & 31);
      if (w === top >>> 5 && (top & 31) !== 31) word &= (1 << ((top & 31) + 1)) - 1;
      if (word !== 0) return true;
    }
    return room > top;
  }

  /** A \u escape with `digits` hex digits read (value `hex`) can still end in a character. */
  #hexFits(s: StringState, hex: number, digits: number): boolean {
    const span = 16 ** (4 - digits);
    const lo = hex * span;
    const hi = lo + span - 1;
    return (lo < 0xd800 && this.fits(s.count, s.sets, lo, Math.min(hi, 0xd7ff))) ||
      (hi > 0xdfff && this.fits(s.count, s.sets, Math.max(lo, 0xe000), hi));
  }

  /** One more character of the value. */
  #char(s: StringState, cp: number): StringState | null {
    if (s.count >= this.rules.maxLength) return null;
    // Without patterns the (empty) states are kept: mask walks read millions of characters.
    const sets = s.sets.length
      ? s.sets.map((set, i) => this.rules.patterns[i].step(set, cp))
      : s.sets;
    if (sets.includes(0) || (sets.length && !this.closable(s.count + 1, sets))) return null;
    let prefix = s.prefix;
    if (prefix !== null) {
      const next = prefix + String.fromCodePoint(cp);
      prefix = this.rules.exclude.some((x) => x.startsWith(next)) ? next : null;
    }
    return { ...s, count: s.count + 1, sets, prefix };
  }

  #closable(s: StringState): boolean {
    return s.count >= this.rules.minLength &&
      s.sets.every((set, i) => this.rules.patterns[i].accepts(set)) &&
      (s.prefix === null || !this.rules.exclude.includes(s.prefix));
  }

  done(s: StringState): boolean {
    return s.phase === 2;
  }

  /**
   * The body's character count and pattern states when `s` reads plain characters (no '"', '\\',
   * control characters) by count and patterns alone: in the body, outside an escape, with no
   * excluded name in reach. Null otherwise. Token walks step such a body by code point.
   */
  plainBody(s: StringState): { readonly count: number; readonly sets: readonly number[] } | null {
    return s.phase === 1 && s.esc === 0 && s.prefix === null ? s : null;
  }

  /**
   * The body's character count and pattern states right after a backslash, when the escaped
   * character is read by count and patterns alone (no excluded name in reach); null otherwise.
   */
  afterBackslash(
    s: StringState,
  ): { readonly count: number; readonly sets: readonly number[] } | null {
    return s.phase === 1 && s.esc === 1 && s.prefix === null ? s : null;
  }

  /**
   * The state of a body of `count` characters read as plain ones (plainBody() undone), its
   * patterns' states at sets[at], sets[at + 1], ….
   */
  bodyState(count: number, sets: ArrayLike<number>, at: number): StringState {
    const states = Array.from({ length: this.rules.patterns.length }, (_, i) => sets[at + i]);
    return { phase: 1, esc: 0, hex: 0, count, sets: states, prefix: null };
  }

  /**
   * Fewest bytes that close a body of `count` characters, quote included, its patterns' states
   * at sets[at], sets[at + 1], ….
   */
  closeDistance(count: number, sets: ArrayLike<number>, at = 0): number {
    let body = Math.max(0, this.rules.minLength - count);
    for (let i = 0; i < this.rules.patterns.length; i++) {
      body = Math.max(body, this.rules.patterns[i].distance(sets[at + i]));
    }
    return 1 + body;
  }

  meets(s: StringState, lo: number, hi: number): boolean {
    for (const cp of [QUOTE, BACKSLASH]) {
      if (lo <= cp && cp <= hi && this.step(s, cp) !== null) return true;
    }
    if (s.phase !== 1) return false;
    if (s.esc !== 0) {
      // Escapes continue with ASCII letters and digits only.
      for (let cp = Math.max(lo, 0x30); cp <= Math.min(hi, 0x7a); cp++) {
        if (this.step(s, cp) !== null) return true;
      }
      return false;
    }
    // Raw characters: from U+0020 on, but not '"' or '\'.
    const ranges = [[0x20, 0x21], [0x23, 0x5b], [0x5d, 0x10ffff]];
    return ranges.some(([a, b]) => {
      const l = Math.max(a, lo);
      const h = Math.min(b, hi);
      return l <= h && this.fits(s.count, s.sets, l, h);
    });
  }

  distance(s: StringState): number {
    if (s.phase === 2) return 0;
    if (s.esc === 0) return (s.phase === 0 ? 1 : 0) + this.closeDistance(s.count, s.sets);
    // Inside an escape: its remaining bytes, then the rest once its character is read.
    if (s.esc === 1) {
      const simple = Object.values(SIMPLE_ESCAPES).map((c) => 1 + this.#after(s, c, c));
      return Math.min(...simple, 5 + this.#after(s, 0, 0xd7ff), 5 + this.#after(s, 0xe000, 0xffff));
    }
    const digits = s.esc - 2;
    const span = 16 ** (4 - digits);
    const lo = s.hex * span;
    return 4 - digits +
      Math.min(
        this.#after(s, lo, Math.min(lo + span - 1, 0xd7ff)),
        this.#after(s, Math.max(lo, 0xe000), lo + span - 1),
      );
  }

  /** Bytes to close the string after one more value character in [lo, hi] (Infinity: none). */
  #after(s: StringState, lo: number, hi: number): number {
    if (lo > hi || s.count >= this.rules.maxLength) return Infinity;
    const body = Math.max(
      0,
      this.rules.minLength - s.count - 1,
      ...s.sets.map((set, i) => this.rules.patterns[i].distanceAfter(set, lo, hi)),
    );
    return 1 + body;
  }

  key(s: StringState, horizon?: number): string {
    // For a mask, counts that no token can tell apart share a key: past minLength and more than
    // a token's characters (and its patterns' slack) from maxLength, a string reads any token the
    // same way.
    const room = this.rules.maxLength - s.count;
    const count = horizon === undefined || s.count < this.rules.minLength ||
        room <= horizon + this.#slack
      ? String(s.count)
      : "free";
    const sets = s.sets.join(",");
    return `${this.id}:${s.phase}:${s.esc}:${s.hex}:${count}:${sets}:${s.prefix ?? ""}`;
  }
}

/** Bounds of a JSON number: lo/hi with inclusiveness, and whether only integers fit. */
export interface NumberRules {
  readonly integer: boolean;
  readonly lo: number;
  readonly loIn: boolean;
  readonly hi: number;
  readonly hiIn: boolean;
}

/** Digits a generated integer part (and fraction) may have: past 2^53 JSON numbers lose digits. */
const MAX_DIGITS = 16;

/** A JSON number as written so far: sign, integer digits, and the fraction (null before '.'). */
interface NumberState {
  readonly neg: boolean;
  readonly int: string;
  readonly frac: string | null;
}

/** An interval of values with inclusive or open ends. */
interface Span {
  readonly lo: number;
  readonly loIn: boolean;
  readonly hi: number;
  readonly hiIn: boolean;
}

export class NumberLeaf implements Leaf<NumberState> {
  readonly id: string;
  readonly start: NumberState = { neg: false, int: "", frac: null };

  constructor(readonly rules: NumberRules, id: string) {
    this.id = id;
  }

  step(s: NumberState, cp: number): NumberState | null {
    let next: NumberState;
    if (cp === 0x2d) {
      if (s.neg || s.int !== "") return null;
      next = { ...s, neg: true };
    } else if (cp === 0x2e) {
      if (this.rules.integer || s.int === "" || s.frac !== null) return null;
      next = { ...s, frac: "" };
    } else if (cp >= 0x30 && cp <= 0x39) {
      const d = String.fromCharCode(cp);
      if (s.frac !== null) {
        if (s.frac.length >= MAX_DIGITS) return null;
        next = { ...s, frac: s.frac + d };
      } else {
        if (s.int === "0" || s.int.length >= MAX_DIGITS) return null;
        next = { ...s, int: s.int + d };
      }
    } else return null;
    return this.#feasible(next) ? next : null;
  }

  done(s: NumberState): boolean {
    if (s.int === "" || s.frac === "") return false;
    const v = this.#value(s);
    return this.#meets({ lo: v, loIn: true, hi: v, hiIn: true });
  }

  meets(s: NumberState, lo: number, hi: number): boolean {
    for (let cp = Math.max(lo, 0x2d); cp <= Math.min(hi, 0x39); cp++) {
      if (this.step(s, cp) !== null) return true;
    }
    return false;
  }

  /** Whole integer digits appended, the fewest that reach a value in bounds; a fraction's 2 else. */
  distance(s: NumberState): number {
    if (this.done(s)) return 0;
    if (s.frac !== null) return 1;
    const sign = s.neg ? -1 : 1;
    for (let extra = 1; s.int !== "0" && s.int.length + extra <= MAX_DIGITS; extra++) {
      // Integers with `extra` more digits: their magnitudes span [lo, hi].
      const lo = s.int === "" ? (extra === 1 ? 0 : 10 ** (extra - 1)) : Number(s.int) * 10 ** extra;
      const hi = s.int === "" ? 10 ** extra - 1 : (Number(s.int) + 1) * 10 ** extra - 1;
      const span = sign > 0
        ? { lo, loIn: true, hi, hiIn: true }
        : { lo: -hi, loIn: true, hi: -lo, hiIn: true };
      if (this.#integerIn(span)) return extra;
    }
    return 2; // "." and a digit, at least.
  }

  /** Whether an integer in `span` lies within the bounds. */
  #integerIn(span: Span): boolean {
    const r = this.rules;
    const lo = Math.max(span.lo, r.loIn ? Math.ceil(r.lo) : Math.floor(r.lo) + 1);
    const hi = Math.min(span.hi, r.hiIn ? Math.floor(r.hi) : Math.ceil(r.hi) - 1);
    return lo <= hi;
  }

  key(s: NumberState): string {
    return `${this.id}:${s.neg ? "-" : ""}${s.int}${s.frac === null ? "" : `.${s.frac}`}`;
  }

  #value(s: NumberState): number {
    return Number(`${s.neg ? "-" : ""}${s.int || "0"}${s.frac ? `.${s.frac}` : ""}`);
  }

  /** Whether some number this prefix can still become lies within the bounds. */
  #feasible(s: NumberState): boolean {
    if (s.int === "") {
      return s.neg ? this.#meets({ lo: -Infinity, loIn: true, hi: 0, hiIn: true }) : true;
    }
    const spans: Span[] = [];
    const abs = Number(s.int);
    const exact = s.frac !== null || this.rules.integer;
    if (s.frac !== null) {
      const base = Number(`${s.int}.${s.frac || "0"}`);
      spans.push({ lo: base, loIn: true, hi: base + 10 ** -s.frac.length, hiIn: false });
    } else {
      spans.push(
        exact
          ? { lo: abs, loIn: true, hi: abs, hiIn: true }
          : { lo: abs, loIn: true, hi: abs + 1, hiIn: false },
      );
      if (s.int !== "0") {
        for (let extra = 1; s.int.length + extra <= MAX_DIGITS; extra++) {
          const scale = 10 ** extra;
          spans.push({ lo: abs * scale, loIn: true, hi: (abs + 1) * scale, hiIn: false });
        }
      }
    }
    return spans.some((span) =>
      this.#meets(
        s.neg ? { lo: -span.hi, loIn: span.hiIn, hi: -span.lo, hiIn: span.loIn } : span,
      )
    );
  }

  /** Whether `span` holds an allowed value (an integer one when only integers fit). */
  #meets(span: Span): boolean {
    const r = this.rules;
    let lo = span.lo;
    let loIn = span.loIn;
    let hi = span.hi;
    let hiIn = span.hiIn;
    if (r.lo > lo || (r.lo === lo && !r.loIn)) [lo, loIn] = [r.lo, r.loIn];
    if (r.hi < hi || (r.hi === hi && !r.hiIn)) [hi, hiIn] = [r.hi, r.hiIn];
    if (r.integer) {
      const first = loIn ? Math.ceil(lo) : Math.floor(lo) + 1;
      const last = hiIn ? Math.floor(hi) : Math.ceil(hi) - 1;
      return first <= last;
    }
    return lo < hi || (lo === hi && loIn && hiIn);
  }
}

/** Any text up to and including `marker` (reasoning before `</think>`); state: chars matched. */
export class UntilLeaf implements Leaf<number> {
  readonly id: string;
  readonly start = 0;
  readonly #marker: readonly number[];
  readonly #fail: number[];

  constructor(marker: string) {
    this.id = `until:${marker}`;
    this.#marker = [...marker].map((c) => c.codePointAt(0)!);
    // KMP failure links, so a false start inside the marker is not lost.
    this.#fail = [0];
    for (let i = 1, k = 0; i < this.#marker.length; i++) {
      while (k > 0 && this.#marker[i] !== this.#marker[k]) k = this.#fail[k - 1];
      if (this.#marker[i] === this.#marker[k]) k++;
      this.#fail.push(k);
    }
  }

  step(matched: number, cp: number): number | null {
    if (matched === this.#marker.length) return null;
    let k = matched;
    while (k > 0 && cp !== this.#marker[k]) k = this.#fail[k - 1];
    return cp === this.#marker[k] ? k + 1 : 0;
  }

  done(matched: number): boolean {
    return matched === this.#marker.length;
  }

  meets(matched: number): boolean {
    return matched < this.#marker.length;
  }

  distance(matched: number): number {
    return this.#marker.length - matched;
  }

  key(matched: number): string {
    return `${this.id}:${matched}`;
  }
}
