// A grammar as a token constraint: which vocabulary tokens may come next (a bitmask the last stage
// applies to its logits, engine/stage.ts LogitAdjust), kept in step with the generated tokens.

import type { TokenConstraint } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { type Grammar, GrammarError, type LeafCursor, type ParseState } from "./grammar.ts";
import { StringLeaf } from "./json_leaves.ts";
import { type Utf8Partial, utf8Range, utf8Step } from "./utf8.ts";

/** Tokens sorted bytewise, with the bytes each shares with the one before: walks share prefixes. */
interface SortedTokens {
  readonly ids: Uint32Array;
  readonly shared: Uint16Array;
  readonly bytes: readonly Uint8Array[];
}

function sortTokens(entries: { id: number; bytes: Uint8Array }[]): SortedTokens {
  // Bytes as a Latin-1 string: strings compare by code unit, which is byte order here.
  const keyed = entries.map((e) => ({ e, key: String.fromCharCode(...e.bytes) }));
  keyed.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  entries = keyed.map((k) => k.e);
  const shared = new Uint16Array(entries.length);
  for (let i = 1; i < entries.length; i++) {
    const a = entries[i - 1].bytes;
    const b = entries[i].bytes;
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    shared[i] = n;
  }
  return {
    ids: Uint32Array.from(entries, (e) => e.id),
    shared,
    bytes: entries.map((e) => e.bytes),
  };
}

/**
 * A token that a JSON string body reads as plain text: no '"', '\', control bytes or invalid
 * UTF-8 (a last character may be incomplete). Its characters, and the bytes its last one lacks.
 */
function plainText(bytes: Uint8Array): { chars: number; need: number } | null {
  let chars = 0;
  let p: Utf8Partial | null = null;
  for (const b of bytes) {
    if (b < 0x20 || b === 0x22 || b === 0x5c) return null;
    const next = utf8Step(p, b);
    if (next === null) return null;
    p = typeof next === "number" ? null : next;
    if (p === null) chars++;
  }
  if (p === null) return { chars, need: 0 };
  // An incomplete last character: some completion must still be a character.
  const [lo, hi] = utf8Range(p);
  return lo <= hi ? { chars: chars + 1, need: p.need } : null;
}

/** The vocabulary as the mask walks need it, built once per tokenizer. */
export class VocabIndex {
  readonly vocabSize: number;
  readonly eos: readonly number[];
  /** Every token with bytes (control tokens have none). */
  readonly all: SortedTokens;
  /** The tokens that are not plain string text: what a walk inside a free string still reads. */
  readonly special: SortedTokens;
  /** Plain string text tokens as a mask, and their characters and missing bytes by id. */
  readonly plain: Uint32Array;
  readonly plainIds: Uint32Array;
  readonly plainChars: Uint16Array;
  readonly plainNeed: Uint8Array;
  readonly maxPlainChars: number;
  /** Each id's bytes (empty for control tokens). */
  readonly #bytes: Uint8Array[];

  private constructor(tokenizer: TextTokenizer) {
    this.vocabSize = tokenizer.vocabSize;
    this.eos = [...tokenizer.eosIds];
    this.plain = new Uint32Array(Math.ceil(this.vocabSize / 32));
    this.plainChars = new Uint16Array(this.vocabSize);
    this.plainNeed = new Uint8Array(this.vocabSize);
    this.#bytes = [];
    const all: { id: number; bytes: Uint8Array }[] = [];
    const special: { id: number; bytes: Uint8Array }[] = [];
    const plainIds: number[] = [];
    let maxChars = 0;
    for (let id = 0; id < this.vocabSize; id++) {
      const bytes = tokenizer.tokenBytes(id, { specials: false });
      this.#bytes.push(bytes);
      if (!bytes.length) continue;
      all.push({ id, bytes });
      const text = plainText(bytes);
      if (!text) {
        special.push({ id, bytes });
        continue;
      }
      this.plain[id >>> 5] |= 1 << (id & 31);
      this.plainChars[id] = text.chars;
      this.plainNeed[id] = text.need;
      maxChars = Math.max(maxChars, text.chars);
      plainIds.push(id);
    }
    this.all = sortTokens(all);
    this.special = sortTokens(special);
    this.plainIds = Uint32Array.from(plainIds);
    this.maxPlainChars = maxChars;
  }

  /** The bytes of token `id` (none for control tokens). */
  bytesOf(id: number): Uint8Array {
    return this.#bytes[id] ?? new Uint8Array();
  }

  static #cache = new WeakMap<TextTokenizer, VocabIndex>();

  /** The index of `tokenizer`, built once (start-up builds it before serving). */
  static of(tokenizer: TextTokenizer): VocabIndex {
    let index = VocabIndex.#cache.get(tokenizer);
    if (!index) {
      index = new VocabIndex(tokenizer);
      VocabIndex.#cache.set(tokenizer, index);
    }
    return index;
  }
}

/** A constraint of `grammar` over `tokenizer`'s vocabulary (its index is built once). */
export function grammarConstraint(grammar: Grammar, tokenizer: TextTokenizer): GrammarConstraint {
  return new GrammarConstraint(grammar, VocabIndex.of(tokenizer));
}

interface CachedMask {
  readonly mask: Uint32Array;
  /** The largest distance to the grammar's end after any allowed token. */
  readonly reach: number;
}

/** Masks kept per constraint: a grammar revisits few states (inside a string, between keys). */
const MASK_CACHE = 64;
/**
 * Budgets above this many bytes are not checked token by token: no schema this server generates
 * needs that much text to finish after one token, and the check costs a distance per token.
 */
export const UNCHECKED_BUDGET = 4096;
/** What an unchecked budget counts as: just over the limit, so its mask is reused only then. */
const UNCHECKED_REACH = UNCHECKED_BUDGET + 1;

/**
 * How long a walk may hold the event loop before it lets it turn (ms). Inside a pattern-constrained
 * string every token is walked: 100-300 ms a walk on a 150,000-token vocabulary, on the head's
 * thread, which every other request would wait for without slices.
 */
const SLICE_MS = 20;
/** Tokens walked between two looks at the clock (a power of two). */
const CLOCK_EVERY = 512;

/** A walk's time on the event loop: due once it has held it for a slice. */
class Slices {
  readonly #ms: number;
  #since = performance.now();

  constructor(ms: number) {
    this.#ms = ms;
  }

  get due(): boolean {
    return performance.now() - this.#since >= this.#ms;
  }

  /** Lets timers and I/O run (a macrotask), then starts the next slice. */
  async pause(): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, 0));
    this.#since = performance.now();
  }
}

export interface ConstraintOptions {
  /** How long a walk holds the event loop before it lets it turn (ms); default SLICE_MS. */
  readonly sliceMs?: number;
}

/**
 * Generation under a grammar: mask() says which tokens keep the text a prefix of a sentence
 * that can still end within the tokens left; accept() advances by the chosen token.
 */
export class GrammarConstraint implements TokenConstraint {
  readonly #grammar: Grammar;
  readonly #vocab: VocabIndex;
  readonly #masks = new Map<string, CachedMask>();
  readonly #sliceMs: number;
  #state: ParseState;
  #text = "";
  readonly #decoder = new TextDecoder();

  constructor(grammar: Grammar, vocab: VocabIndex, options: ConstraintOptions = {}) {
    this.#grammar = grammar;
    this.#vocab = vocab;
    this.#sliceMs = options.sliceMs ?? SLICE_MS;
    this.#state = grammar.start();
  }

  get done(): boolean {
    return this.#state.final;
  }

  /** The text generated under the grammar so far. */
  get text(): string {
    return this.#text;
  }

  /**
   * The tokens allowed next; `remaining` tokens may still be generated, this one included, so a
   * token is allowed only when the grammar can still end within the rest (one byte per token).
   * A walk over the vocabulary lets the event loop turn every SLICE_MS.
   */
  async mask(remaining: number): Promise<Uint32Array> {
    const key = this.#state.key;
    const cached = this.#masks.get(key);
    if (cached && cached.reach < remaining) return cached.mask;
    let out = await this.#walk(remaining - 1 > UNCHECKED_BUDGET ? Infinity : remaining - 1);
    if (out.reach === -1) {
      // Too few tokens left to finish: keep to the grammar; the reply ends at its limit.
      out = await this.#walk(Infinity);
      if (out.reach === -1) {
        throw new GrammarError(
          `no token can continue the constrained text after ${
            JSON.stringify(this.#text.slice(-60))
          }`,
        );
      }
    }
    if (out.reach < remaining) {
      if (this.#masks.size >= MASK_CACHE) this.#masks.delete(this.#masks.keys().next().value!);
      this.#masks.set(key, out);
    }
    return out.mask;
  }

  accept(id: number): void {
    const v = this.#vocab;
    if (v.eos.includes(id)) {
      if (!this.#state.accepting) {
        throw new GrammarError(
          `the grammar does not allow the text to end after ${
            JSON.stringify(this.#text.slice(-60))
          }`,
        );
      }
      return;
    }
    let state: ParseState | null = this.#state;
    const bytes = v.bytesOf(id);
    for (const b of bytes) {
      state = this.#grammar.feed(state, b);
      if (state === null) {
        throw new GrammarError(
          `token ${id} (${JSON.stringify(this.#decoder.decode(bytes))}) does not fit the grammar ` +
            `after ${JSON.stringify(this.#text.slice(-60))}`,
        );
      }
    }
    this.#state = state;
    this.#text += this.#decoder.decode(bytes, { stream: true });
  }

  /** Every token the grammar reads from here with at most `budget` bytes left after it. */
  async #walk(budget: number): Promise<CachedMask> {
    const v = this.#vocab;
    const mask = new Uint32Array(Math.ceil(v.vocabSize / 32));
    const cursor = this.#grammar.leafCursor(this.#state);
    const slices = new Slices(this.#sliceMs);
    let reach = cursor
      ? await this.#leafWalk(cursor, budget, mask, slices)
      : await this.#treeWalk(v.all, budget, mask, slices);
    if (this.#state.accepting && this.#state.partial === null) {
      for (const id of v.eos) {
        mask[id >>> 5] |= 1 << (id & 31);
        reach = Math.max(reach, 0);
      }
    }
    return { mask, reach };
  }

  /** Allows `id` when `left` bytes fit the budget; the reach so far. */
  #allow(mask: Uint32Array, id: number, left: number, budget: number, reach: number): number {
    if (left > budget) return reach;
    mask[id >>> 5] |= 1 << (id & 31);
    return Math.max(reach, budget === Infinity ? UNCHECKED_REACH : left);
  }

  /** The generic walk: every token of `tokens` fed byte by byte through the grammar. */
  async #treeWalk(
    tokens: SortedTokens,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
  ): Promise<number> {
    const g = this.#grammar;
    const states: (ParseState | null)[] = [this.#state];
    let reach = -1;
    let dead = Infinity;
    for (let i = 0; i < tokens.ids.length; i++) {
      if ((i & (CLOCK_EVERY - 1)) === 0 && slices.due) await slices.pause();
      const from = tokens.shared[i];
      if (from >= dead) continue; // Shares a prefix the grammar already refused.
      dead = Infinity;
      const bytes = tokens.bytes[i];
      let d = from;
      for (; d < bytes.length; d++) {
        const next: ParseState | null = g.feed(states[d]!, bytes[d]);
        if (next === null) break;
        states[d + 1] = next;
      }
      if (d < bytes.length) {
        dead = d + 1;
        continue;
      }
      const left = budget === Infinity ? 0 : g.distance(states[d]!);
      reach = this.#allow(mask, tokens.ids[i], left, budget, reach);
    }
    return reach;
  }

  /**
   * The walk inside one leaf (a string or number being written): tokens step the leaf itself
   * until it ends, and only then the grammar. In a free string, plain text tokens are allowed in
   * one go and only the others are walked.
   */
  async #leafWalk(
    cursor: LeafCursor,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
  ): Promise<number> {
    const v = this.#vocab;
    const g = this.#grammar;
    const { leaf, after } = cursor;
    let reach = -1;
    let tokens = v.all;
    const room = leaf instanceof StringLeaf ? leaf.plainRoom(cursor.state as never) : -1;
    if (room >= v.maxPlainChars) {
      // Each plain token leaves the string open: its closing quote and what follows remain.
      const base = 1 + after;
      if (budget === Infinity || budget >= base + 3) {
        for (let w = 0; w < mask.length; w++) mask[w] |= v.plain[w];
        reach = budget === Infinity ? UNCHECKED_REACH : base + 3;
      } else {
        for (const id of v.plainIds) {
          reach = this.#allow(mask, id, base + v.plainNeed[id], budget, reach);
        }
      }
      tokens = v.special;
    }
    // Per depth: the leaf's state and a half-read character, or the grammar's state once the
    // leaf has ended (generic) inside the token.
    const leafStates: unknown[] = [cursor.state];
    const pendings: (Utf8Partial | null)[] = [null];
    const generic: (ParseState | null)[] = [null];
    // The grammar's state once the leaf ended, per ended leaf state (tokens share them).
    const ended = new Map<unknown, ParseState>();
    let dead = Infinity;
    for (let i = 0; i < tokens.ids.length; i++) {
      if ((i & (CLOCK_EVERY - 1)) === 0 && slices.due) await slices.pause();
      const from = tokens.shared[i];
      if (from >= dead) continue;
      dead = Infinity;
      const bytes = tokens.bytes[i];
      let d = from;
      for (; d < bytes.length; d++) {
        const b = bytes[d];
        const gs = generic[d];
        if (gs) {
          const next = g.feed(gs, b);
          if (next === null) break;
          generic[d + 1] = next;
          continue;
        }
        const ls = leafStates[d];
        const p = pendings[d];
        // Once the leaf may end, the grammar goes on from it (it may read more or move on).
        if (p === null && leaf.done(ls)) {
          let resumed = ended.get(ls);
          if (!resumed) ended.set(ls, resumed = cursor.resume(ls));
          const next = g.feed(resumed, b);
          if (next === null) break;
          generic[d + 1] = next;
          continue;
        }
        const step = readByte(leaf, ls, p, b);
        if (step === null) break;
        leafStates[d + 1] = step.state;
        pendings[d + 1] = step.pending;
        generic[d + 1] = null;
      }
      if (d < bytes.length) {
        dead = d + 1;
        continue;
      }
      let left = 0;
      if (budget !== Infinity) {
        const gs = generic[d];
        left = gs
          ? g.distance(gs)
          : leaf.distance(leafStates[d]) + after + (pendings[d]?.need ?? 0);
      }
      reach = this.#allow(mask, tokens.ids[i], left, budget, reach);
    }
    return reach;
  }
}

/** One byte of UTF-8 into a leaf: its next state and half-read character, or null. */
function readByte(
  leaf: LeafCursor["leaf"],
  state: unknown,
  p: Utf8Partial | null,
  b: number,
): { state: unknown; pending: Utf8Partial | null } | null {
  const next = utf8Step(p, b);
  if (next === null) return null;
  if (typeof next === "number") {
    const after = leaf.step(state, next);
    return after === null ? null : { state: after, pending: null };
  }
  const [lo, hi] = utf8Range(next);
  return lo <= hi && leaf.meets(state, lo, hi) ? { state, pending: next } : null;
}
