// A grammar as a token constraint: which vocabulary tokens may come next (a bitmask the last stage
// applies to its logits, engine/stage.ts LogitAdjust), kept in step with the generated tokens.

import type { TokenConstraint } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { CharSet } from "./charset.ts";
import { type Grammar, GrammarError, type LeafCursor, type ParseState } from "./grammar.ts";
import { Lru } from "./lru.ts";
import { LETTER_ESCAPES, StringLeaf } from "./json_leaves.ts";
import { type Utf8Partial, utf8Range, utf8Step } from "./utf8.ts";

/**
 * Tokens as a trie of their symbols (bytes, or a string body's characters), its nodes in preorder:
 * a walk steps each shared prefix once and jumps over a refused prefix's whole subtree.
 */
interface TokenTrie {
  /** Each node's symbol and depth (its symbols from the root, itself included). */
  readonly symbol: Uint32Array;
  readonly depth: Uint32Array;
  /** The node just past each node's subtree. */
  readonly end: Uint32Array;
  /** Node n's path spells tokens ids[first[n]] up to ids[first[n + 1]] (first has one more). */
  readonly first: Uint32Array;
  readonly ids: Uint32Array;
}

/** The trie of `entries`, sorted by their symbols (tokens with one text side by side). */
function buildTrie(entries: readonly { id: number; symbols: ArrayLike<number> }[]): TokenTrie {
  // At most one node per symbol: fill typed arrays of that size, then keep the nodes made.
  const most = entries.reduce((n, e) => n + e.symbols.length, 0);
  const symbol = new Uint32Array(most);
  const depth = new Uint32Array(most);
  const end = new Uint32Array(most);
  const first = new Uint32Array(most + 1);
  const path: number[] = []; // The open nodes, by depth.
  let nodes = 0;
  let prev: ArrayLike<number> = [];
  entries.forEach((e, t) => {
    const s = e.symbols;
    let shared = 0;
    while (shared < prev.length && shared < s.length && prev[shared] === s[shared]) shared++;
    // Two ids with one text end on the same node; a prefix sorts before its extensions.
    if (shared === s.length) return;
    while (path.length > shared) end[path.pop()!] = nodes;
    for (let d = shared; d < s.length; d++, nodes++) {
      path.push(nodes);
      symbol[nodes] = s[d];
      depth[nodes] = d + 1;
      first[nodes] = t;
    }
    prev = s;
  });
  while (path.length) end[path.pop()!] = nodes;
  first[nodes] = entries.length;
  return {
    symbol: symbol.slice(0, nodes),
    depth: depth.slice(0, nodes),
    end: end.slice(0, nodes),
    first: first.slice(0, nodes + 1),
    ids: Uint32Array.from(entries, (e) => e.id),
  };
}

/**
 * A token that a JSON string body reads as plain text: no '"', '\', control bytes or invalid
 * UTF-8 (a last character may be incomplete). Its whole characters, and its incomplete last one.
 */
function plainText(bytes: Uint8Array): { cps: number[]; partial: Utf8Partial | null } | null {
  const cps: number[] = [];
  let p: Utf8Partial | null = null;
  for (const b of bytes) {
    if (b < 0x20 || b === 0x22 || b === 0x5c) return null;
    const next = utf8Step(p, b);
    if (next === null) return null;
    p = typeof next === "number" ? null : next;
    if (typeof next === "number") cps.push(next);
  }
  // An incomplete last character: some completion must still be a character.
  if (p === null) return { cps, partial: null };
  const [lo, hi] = utf8Range(p);
  return lo <= hi ? { cps, partial: p } : null;
}

/**
 * A plain token's characters as trie symbols that order as their UTF-8 bytes do: a whole code point
 * c is 8c + 7, an incomplete one 8lo + 3 − need (lo: the least code point it may become), so a
 * half-read character sorts after the ones below its range and before those it may become.
 */
const WHOLE = 7;

function plainSymbols(text: { cps: number[]; partial: Utf8Partial | null }): number[] {
  const symbols = text.cps.map((cp) => 8 * cp + WHOLE);
  if (text.partial) symbols.push(8 * utf8Range(text.partial)[0] + 3 - text.partial.need);
  return symbols;
}

/** The most characters `bytes` may add to a text (VocabIndex.maxChars). */
function charsAtMost(bytes: Uint8Array): number {
  let starts = 0;
  for (let i = 0; i < bytes.length; i++) if ((bytes[i] & 0xc0) !== 0x80) starts++;
  return bytes.length && (bytes[0] & 0xc0) === 0x80 ? starts + 1 : starts;
}

/** Lexicographic order of symbol lists, a prefix first. */
function compareSymbols(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < a.length && i < b.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/**
 * A token that is not plain text as a string body reads it: its leading plain characters as
 * CHAR + code point (a walk steps them as numbers, as plain tokens), then its bytes from the first
 * one that is not part of a plain character ('"', '\\', a control byte, invalid UTF-8).
 */
const CHAR = 0x100;

function specialSymbols(bytes: Uint8Array): number[] {
  const symbols: number[] = [];
  let p: Utf8Partial | null = null;
  let read = 0; // Bytes of whole plain characters.
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (b < 0x20 || b === 0x22 || b === 0x5c) break;
    const next = utf8Step(p, b);
    if (next === null) break;
    p = typeof next === "number" ? null : next;
    if (typeof next === "number") {
      symbols.push(CHAR + next);
      read = i + 1;
    }
  }
  for (let i = read; i < bytes.length; i++) symbols.push(bytes[i]);
  return symbols;
}

/**
 * A leading plain character of a token that is not plain text, whichever it is (VocabIndex.tails):
 * CHAR + U+0000, which no plain character is.
 */
const RUN = CHAR;

/** The code points [lo, hi] an incomplete-character symbol may become, and the bytes it lacks. */
function partialOf(symbol: number): { lo: number; hi: number; need: number } {
  const lo = symbol >>> 3;
  const need = 3 - (symbol & 7);
  return { lo, hi: Math.min(lo | ((1 << (6 * need)) - 1), 0x10ffff), need };
}

interface CachedMask {
  readonly mask: Uint32Array;
  /** The largest distance to the grammar's end after any allowed token. */
  readonly reach: number;
  /** The budget it was walked with: a walk with a larger one may allow more. */
  readonly budget: number;
}

/** Masks kept per vocabulary (32 MB on a 248,320-token one). */
const MASK_CACHE = 1024;

/** Each grammar's prefix of mask cache keys (state keys number alternatives per grammar). */
const grammarKeys = new WeakMap<Grammar, string>();
let grammarsKeyed = 0;

function grammarKey(grammar: Grammar): string {
  let key = grammarKeys.get(grammar);
  if (key === undefined) grammarKeys.set(grammar, key = `${grammarsKeyed++}#`);
  return key;
}

/** Plain tokens up to this many characters get masks by length (most tokens are shorter). */
const SHORT_CHARS = 32;
/**
 * A class of at least this many tokens per word of a vocabulary mask keeps masks by length; one
 * of fewer lists its tokens by length. The masks cost ~1 ms to build on the 248k-token vocabulary
 * whatever the class (33 of 31 KB), which a class met for the first time adds to a step's masks,
 * and a class of a few thousand tokens (an escape's letters, a '"' and then text) sets its bits
 * one by one in less time than a mask's words take to OR.
 */
const DENSE_PER_WORD = 2;
/**
 * Character classes whose tokens are kept by length (on the 248k-token vocabulary ~1.2 MB at most
 * for a class of many tokens, 20-150 KB for one of few: ~40 MB at most): the bench's mix of
 * seven schemas alone meets 25 (with the tries after '"' and '\\'), and a class of many tokens
 * pushed out costs 2-15 ms to build again, inside a step's masks.
 */
const CLASS_CACHE = 32;

/**
 * The tokens of a trie of plain text (VocabIndex.plainTrie, or an afterFirst one's) whose first
 * whole character lies in one class and the others in another (a run's, such as
 * `[A-Z][a-z]{1,30}` or, the same class twice, `[A-Za-z ,.]{1,40}`; or every character), by
 * length, and where the others leave them.
 */
interface ClassTokens {
  /** The tokens of whole characters, how many of each length. */
  readonly counts: Uint32Array;
  /**
   * Per c up to SHORT_CHARS: the tokens of at most c whole characters, as a mask; null for a
   * class of few tokens (DENSE_PER_WORD), whose tokens are all listed.
   */
  readonly upTo: readonly Uint32Array[] | null;
  /**
   * The tokens of whole characters that upTo does not hold, by length: those of l characters are
   * listed[listedFrom[l]…listedFrom[l + 1]).
   */
  readonly listed: Uint32Array;
  readonly listedFrom: Uint32Array;
  /**
   * The tokens that end in an incomplete character, and their trie nodes (symbol: that
   * character; depth: one more than the whole ones).
   */
  readonly partial: Uint32Array;
  readonly partialNode: Uint32Array;
  /**
   * The trie's nodes of a whole character outside the classes after r inside them (their
   * subtrees are every other token of the trie).
   */
  readonly exits: Exits;
}

/** The tokens that are not plain text, by their leading plain characters in a run's classes. */
interface RunSpecials {
  /** Those whose leading plain characters all lie in the classes. */
  readonly onRun: Uint32Array;
  /** The special trie's nodes of a leading character outside the classes, as ClassTokens.exits. */
  readonly exits: Exits;
}

/** Trie nodes by r (characters of a run before them) and then symbol: r's from from[r] on. */
interface Exits {
  readonly nodes: Uint32Array;
  readonly from: Uint32Array;
}

/** Exits of `trie` from lists of its nodes by r, each list in preorder. */
function exitsOf(trie: TokenTrie, lists: readonly number[][]): Exits {
  const { symbol } = trie;
  const from = new Uint32Array(lists.length + 1);
  lists.forEach((list, r) => from[r + 1] = from[r] + list.length);
  const nodes = new Uint32Array(from[lists.length]);
  lists.forEach((list, r) => {
    // The roots come in order; deeper exits come by parent, sorted as symbol·2³² + node.
    if (list.every((n, i) => i === 0 || symbol[list[i - 1]] <= symbol[n])) {
      nodes.set(list, from[r]);
      return;
    }
    const keys = new Float64Array(list.length);
    for (let i = 0; i < list.length; i++) keys[i] = symbol[list[i]] * 2 ** 32 + list[i];
    keys.sort();
    for (let i = 0; i < keys.length; i++) nodes[from[r] + i] = keys[i] % 2 ** 32;
  });
  return { nodes, from };
}

/** The vocabulary as the mask walks need it, built once per tokenizer. */
export class VocabIndex {
  readonly vocabSize: number;
  readonly eos: readonly number[];
  /** Every token with bytes (control tokens have none). */
  readonly all: TokenTrie;
  /**
   * The tokens that are not plain string text, by specialSymbols(): what a walk inside a string
   * body still reads.
   */
  readonly special: TokenTrie;
  /**
   * The same tokens with each leading plain character as RUN: a body reads those of a run alike
   * (#run), so this trie walks what follows them once per number of them and text after, not per
   * token (25,047 tokens on tests/_big_vocab.ts; their 15,927 nodes of leading characters here
   * are at most 48, one per number).
   */
  readonly tails: TokenTrie;
  /** Plain string text tokens by their characters, as a string body reads them. */
  readonly plainTrie: TokenTrie;
  /**
   * The tokens that start with '"' or '\\', the bytes after which a string may enter a body (an
   * opening quote, an escaped quote or backslash), by that byte: those that go on with plain text
   * by its characters, the others by their bytes. On tests/_big_vocab.ts, 7,348 tokens start
   * with '"' (6,666 then plain text) and 4,312 with '\\' (4,098).
   */
  readonly afterFirst: ReadonlyMap<number, { plain: TokenTrie; others: TokenTrie }>;
  /** Plain string text tokens as a mask. */
  readonly plain: Uint32Array;
  /**
   * The most plain characters a token starts with, or has after an afterFirst byte: all of a
   * plain one's, a special's first, an afterFirst plain one's after its first byte.
   */
  readonly maxRun: number;
  /** The longest token's bytes: the deepest a walk of the tries goes. */
  readonly maxBytes: number;
  /**
   * The most characters a token adds to a string body (mask keys rely on it): one per byte that
   * begins a UTF-8 character, and one for leading continuation bytes that end one begun before.
   * A character or escape spans at least that, so this is below maxBytes on a vocabulary with
   * multi-byte tokens: 49 against 80 on tests/_big_vocab.ts's.
   */
  readonly maxChars: number;
  /**
   * Masks by grammar and state key, shared by every constraint over this vocabulary: a grammar
   * revisits few states (inside a string, between keys), and agents send the same schemas and
   * tools again with every request (tool_grammar.ts keeps their grammars).
   */
  readonly masks = new Lru<CachedMask>(MASK_CACHE);
  /**
   * The walks under way, by the same keys: a batched step asks every sequence's mask in one turn
   * of the event loop, so sequences at one state (agents that start together, or meet a state
   * none has reached before) would each walk it before the first walk's mask is cached.
   */
  readonly walks = new Map<string, Promise<CachedMask>>();
  /** classTokens() by trie and classes. */
  readonly #classes = new Lru<ClassTokens>(CLASS_CACHE);
  /** runSpecials() by classes (about 40 KB each on the 248k-token vocabulary). */
  readonly #runSpecials = new Lru<RunSpecials>(CLASS_CACHE);
  /** How many ClassTokens and RunSpecials this index has built (a cache hit builds none). */
  #builds = 0;
  /**
   * The grammars whose classes GrammarConstraint has built before their first mask (held weakly:
   * the classes themselves are in the caches above).
   */
  readonly prepared = new WeakSet<Grammar>();
  /** Each id's bytes (empty for control tokens). */
  readonly #bytes: Uint8Array[];

  private constructor(tokenizer: TextTokenizer) {
    this.vocabSize = tokenizer.vocabSize;
    this.eos = [...tokenizer.eosIds];
    this.plain = new Uint32Array(Math.ceil(this.vocabSize / 32));
    this.#bytes = [];
    const all: { id: number; bytes: Uint8Array; key: string }[] = [];
    for (let id = 0; id < this.vocabSize; id++) {
      const bytes = tokenizer.tokenBytes(id, { specials: false });
      this.#bytes.push(bytes);
      if (bytes.length) all.push({ id, bytes, key: String.fromCharCode(...bytes) });
    }
    // Bytes as a Latin-1 string: strings compare by code unit, which is byte order here.
    all.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const special: { id: number; symbols: number[] }[] = [];
    const plain: { id: number; symbols: number[] }[] = [];
    let maxPlain = 0;
    for (const { id, bytes } of all) {
      const text = plainText(bytes);
      if (!text) {
        special.push({ id, symbols: specialSymbols(bytes) });
        continue;
      }
      const symbols = plainSymbols(text);
      this.plain[id >>> 5] |= 1 << (id & 31);
      maxPlain = Math.max(maxPlain, symbols.length);
      plain.push({ id, symbols });
    }
    this.all = buildTrie(all.map((e) => ({ id: e.id, symbols: e.bytes })));
    this.special = buildTrie(special.sort((a, b) => compareSymbols(a.symbols, b.symbols)));
    const tails = special.map((e) => ({
      id: e.id,
      symbols: e.symbols.map((x) => Math.min(x, RUN)),
    }));
    this.tails = buildTrie(tails.sort((a, b) => compareSymbols(a.symbols, b.symbols)));
    this.plainTrie = buildTrie(plain);
    this.afterFirst = new Map([0x22, 0x5c].map((first) => {
      const plain: { id: number; symbols: number[] }[] = [];
      const others: { id: number; symbols: Uint8Array }[] = [];
      // `all` is in byte order: the tokens that start with `first` stand together.
      let i = 0;
      while (i < all.length && all[i].bytes[0] < first) i++;
      for (; i < all.length && all[i].bytes[0] === first; i++) {
        const { id, bytes } = all[i];
        const text = bytes.length > 1 ? plainText(bytes.subarray(1)) : null;
        if (!text) {
          others.push({ id, symbols: bytes });
          continue;
        }
        const symbols = plainSymbols(text);
        maxPlain = Math.max(maxPlain, symbols.length);
        plain.push({ id, symbols });
      }
      plain.sort((a, b) => compareSymbols(a.symbols, b.symbols));
      return [first, { plain: buildTrie(plain), others: buildTrie(others) }];
    }));
    this.maxRun = special.reduce((most, e) => {
      const run = e.symbols.findIndex((symbol) => symbol < CHAR);
      return Math.max(most, run < 0 ? e.symbols.length : run);
    }, maxPlain);
    this.maxBytes = all.reduce((most, e) => Math.max(most, e.bytes.length), 0);
    // No token adds more characters than it has bytes: only those longer than the most so far
    // are counted (counting every token's took ~100 ms of the index's ~900).
    let maxChars = 0;
    for (const { bytes } of all) {
      if (bytes.length > maxChars) maxChars = Math.max(maxChars, charsAtMost(bytes));
    }
    this.maxChars = maxChars;
  }

  /** The bytes of token `id` (none for control tokens). */
  bytesOf(id: number): Uint8Array {
    return this.#bytes[id] ?? new Uint8Array();
  }

  /**
   * The plain text tokens by their characters, or with `first` (a key of afterFirst) the tokens
   * of that byte and then plain text by the characters after it: the tries that ClassTokens sort.
   */
  plainTextTrie(first?: number): TokenTrie {
    return first === undefined ? this.plainTrie : this.afterFirst.get(first)!.plain;
  }

  /**
   * The tokens of plainTextTrie(first) whose first whole character lies in `head` and the others
   * in `chars`, built once per trie and classes (a walk of the trie that skips a refused
   * character's subtree).
   */
  classTokens(head: CharSet, chars: CharSet, first?: number): ClassTokens {
    const key = `${first ?? ""}|${head.ranges}|${chars.ranges}`;
    return this.#classes.getOrBuild(
      key,
      () => this.#buildClass(this.plainTextTrie(first), head, chars),
    );
  }

  #buildClass(trie: TokenTrie, head: CharSet, chars: CharSet): ClassTokens {
    this.#builds++;
    const { symbol, depth, end, first, ids } = trie;
    const counts = new Uint32Array(this.maxRun + 1);
    // The nodes that spell tokens of whole characters of the classes.
    const spelling: number[] = [];
    const partial: number[] = [];
    const partialNode: number[] = [];
    const exits = Array.from({ length: this.maxRun + 1 }, (): number[] => []);
    for (let n = 0; n < symbol.length;) {
      const whole = (symbol[n] & 7) === WHOLE;
      const d = depth[n];
      if (whole && !(d === 1 ? head : chars).has(symbol[n] >>> 3)) {
        exits[d - 1].push(n);
        n = end[n];
        continue;
      }
      if (whole && first[n] !== first[n + 1]) {
        spelling.push(n);
        counts[d] += first[n + 1] - first[n];
      }
      for (let t = first[n]; t < first[n + 1] && !whole; t++) {
        partial.push(ids[t]);
        partialNode.push(n);
      }
      n++;
    }
    const words = this.plain.length;
    const dense = counts.reduce((a, b) => a + b, 0) >= DENSE_PER_WORD * words;
    const upTo = dense
      ? Array.from({ length: SHORT_CHARS + 1 }, () => new Uint32Array(words))
      : null;
    const listedFrom = new Uint32Array(this.maxRun + 2);
    for (let l = 1; l <= this.maxRun; l++) {
      listedFrom[l + 1] = listedFrom[l] + (upTo && l <= SHORT_CHARS ? 0 : counts[l]);
    }
    const listed = new Uint32Array(listedFrom[this.maxRun + 1]);
    const at = listedFrom.slice();
    for (const n of spelling) {
      const d = depth[n];
      for (let t = first[n]; t < first[n + 1]; t++) {
        const id = ids[t];
        if (upTo && d <= SHORT_CHARS) upTo[d][id >>> 5] |= 1 << (id & 31);
        else listed[at[d]++] = id;
      }
    }
    for (let c = 1; upTo && c <= SHORT_CHARS; c++) {
      for (let w = 0; w < words; w++) upTo[c][w] |= upTo[c - 1][w];
    }
    return {
      counts,
      upTo,
      listed,
      listedFrom,
      partial: Uint32Array.from(partial),
      partialNode: Uint32Array.from(partialNode),
      exits: exitsOf(trie, exits),
    };
  }

  /**
   * The tokens that are not plain text whose leading characters lie in `head` and then `chars`,
   * and the special trie's nodes where the others leave those classes, built once per classes.
   */
  runSpecials(head: CharSet, chars: CharSet): RunSpecials {
    const key = `${head.ranges}|${chars.ranges}`;
    return this.#runSpecials.getOrBuild(key, () => this.#buildRunSpecials(head, chars));
  }

  #buildRunSpecials(head: CharSet, chars: CharSet): RunSpecials {
    this.#builds++;
    const { symbol, depth, end, first, ids } = this.special;
    const onRun = new Uint32Array(this.plain.length);
    const exits = Array.from({ length: this.maxRun + 1 }, (): number[] => []);
    for (let n = 0; n < symbol.length;) {
      if (symbol[n] < CHAR) {
        // Past the leading characters: every token of the subtree (ids in preorder) is on the run.
        for (let t = first[n]; t < first[end[n]]; t++) onRun[ids[t] >>> 5] |= 1 << (ids[t] & 31);
        n = end[n];
      } else if (!(depth[n] === 1 ? head : chars).has(symbol[n] - CHAR)) {
        exits[depth[n] - 1].push(n);
        n = end[n];
      } else n++;
    }
    return { onRun, exits: exitsOf(this.special, exits) };
  }

  /** Classes built so far: a step whose masks leave it as it was built none of them. */
  get builds(): number {
    return this.#builds;
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
/** Trie nodes stepped between two looks at the clock (a power of two). */
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

/**
 * Walks `trie` in preorder, over each span of nodes [spans[2i], spans[2i + 1]) (whole subtrees):
 * `step(n)` reads node n's symbol from the state its parent left (at depth[n] - 1) and keeps the
 * result at depth[n], or returns false, and the subtree is skipped; `spelt(n)` then comes for each
 * node that ends tokens.
 */
async function walkTrie(
  trie: TokenTrie,
  slices: Slices,
  step: (n: number) => boolean,
  spelt: (n: number) => void,
  spans: readonly number[] = [0, trie.symbol.length],
): Promise<void> {
  const { end, first } = trie;
  let stepped = 0;
  for (let i = 0; i < spans.length; i += 2) {
    for (let n = spans[i]; n < spans[i + 1]; stepped++) {
      if ((stepped & (CLOCK_EVERY - 1)) === 0 && slices.due) await slices.pause();
      if (!step(n)) {
        n = end[n];
        continue;
      }
      if (first[n] !== first[n + 1]) spelt(n);
      n++;
    }
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
  /** This grammar's prefix of mask cache keys. */
  readonly #cacheKey: string;
  readonly #sliceMs: number;
  #state: ParseState;
  #text = "";
  readonly #decoder = new TextDecoder();

  constructor(grammar: Grammar, vocab: VocabIndex, options: ConstraintOptions = {}) {
    this.#grammar = grammar;
    this.#vocab = vocab;
    this.#sliceMs = options.sliceMs ?? SLICE_MS;
    this.#state = grammar.start();
    this.#cacheKey = grammarKey(grammar);
    if (!vocab.prepared.has(grammar)) {
      vocab.prepared.add(grammar);
      this.#prepare();
    }
  }

  /**
   * Builds the classes the grammar's strings ask for where a walk enters a body from outside one:
   * after an opening quote, and after a backslash at a body's start (the escape letters' runs, an
   * escaped quote or backslash). A class met for the first time is otherwise built inside a
   * step's masks (after a backslash in `.{0,80}` on the 248k-token vocabulary ~1.3 ms: the letters
   * `/bft` then any character, their special tokens, the tokens that start with '\\'), and a reply
   * may write its first escape long after the grammar's first masks. A pattern that steps every
   * character alike (`.{0,80}`, no pattern) asks the same classes at any count; for others these
   * are those of the body's start, built once more at most. They go to the bounded class caches.
   */
  #prepare(): void {
    const v = this.#vocab;
    for (const leaf of this.#grammar.leaves()) {
      if (!(leaf instanceof StringLeaf)) continue;
      const open = leaf.step(leaf.start, 0x22);
      const escaped = open && leaf.step(open, 0x5c);
      for (const state of [leaf.start, escaped]) {
        for (const first of v.afterFirst.keys()) {
          const opened = state && this.#openedBy(leaf, state, first);
          if (opened) v.classTokens(opened.run.head, opened.run.chars, first);
        }
      }
      const escape = escaped && leaf.afterBackslash(escaped);
      if (!escape) continue;
      const sets = new Int32Array((v.maxRun + 1) * leaf.rules.patterns.length);
      for (const { run } of this.#escapeRuns(leaf, escape, sets)) {
        v.classTokens(run.head, run.chars);
        v.runSpecials(run.head, run.chars);
      }
    }
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
    const key = this.#cacheKey + this.#state.maskKey(this.#vocab.maxChars);
    const budget = remaining - 1 > UNCHECKED_BUDGET ? Infinity : remaining - 1;
    // A mask walked with a budget B allows the same tokens as a walk with any budget from its
    // reach up to B: the allowed end within its reach, the refused ones past B.
    const serves = (m: CachedMask) => m.reach !== -1 && m.reach <= budget && budget <= m.budget;
    const cached = this.#vocab.masks.get(key);
    if (cached && serves(cached)) return cached.mask;
    const { walks } = this.#vocab;
    const under = walks.get(key);
    if (under) {
      const theirs = await under;
      if (serves(theirs)) return theirs.mask;
    }
    const walk = this.#walk(budget);
    if (!walks.has(key)) {
      walks.set(key, walk);
      const done = () => walks.get(key) === walk && walks.delete(key);
      walk.then(done, done);
    }
    let out = await walk;
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
    if (out.reach < remaining) this.#vocab.masks.set(key, out);
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
    return { mask, reach, budget };
  }

  /** Allows `id` when `left` bytes fit the budget; the reach so far. */
  #allow(mask: Uint32Array, id: number, left: number, budget: number, reach: number): number {
    if (left > budget) return reach;
    mask[id >>> 5] |= 1 << (id & 31);
    return Math.max(reach, budget === Infinity ? UNCHECKED_REACH : left);
  }

  /**
   * Allows the tokens trie node `n` spells (those of `only` when given) if `left` bytes fit the
   * budget; the reach so far.
   */
  #allowAll(
    trie: TokenTrie,
    n: number,
    mask: Uint32Array,
    left: number,
    budget: number,
    reach: number,
    only?: Uint32Array,
  ): number {
    for (let t = trie.first[n]; t < trie.first[n + 1]; t++) {
      const id = trie.ids[t];
      if (!only || (only[id >>> 5] >>> (id & 31)) & 1) {
        reach = this.#allow(mask, id, left, budget, reach);
      }
    }
    return reach;
  }

  /** The generic walk: every token of `trie` fed byte by byte through the grammar. */
  async #treeWalk(
    trie: TokenTrie,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
  ): Promise<number> {
    const g = this.#grammar;
    const states: ParseState[] = [this.#state];
    let reach = -1;
    await walkTrie(trie, slices, (n) => {
      const next = g.feed(states[trie.depth[n] - 1], trie.symbol[n]);
      if (next === null) return false;
      states[trie.depth[n]] = next;
      return true;
    }, (n) => {
      const left = budget === Infinity ? 0 : g.distance(states[trie.depth[n]]);
      reach = this.#allowAll(trie, n, mask, left, budget, reach);
    });
    return reach;
  }

  /**
   * The walk inside one leaf (a string or number being written): tokens step the leaf itself
   * until it ends, and only then the grammar. In a string body, the plain text tokens of its run
   * are allowed by length, the other plain ones step its patterns by character from where they
   * leave the run, and only the tokens that are not plain text are walked byte by byte, past
   * leading characters of the run once per number of them (VocabIndex.tails).
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
    let trie = v.all;
    const string = leaf instanceof StringLeaf ? leaf : null;
    const body = string?.plainBody(cursor.state as never) ?? null;
    const escape = body ? null : string?.afterBackslash(cursor.state as never) ?? null;
    // The body's characters before the token.
    const start = (body ?? escape)?.count ?? 0;
    const k = string?.rules.patterns.length ?? 0;
    // In a body, the patterns' states after each number of characters of its run (#run), k at a
    // time, which every token's leading characters of the run's classes share.
    const sets = new Int32Array(body || escape ? (v.maxRun + 1) * k : 0);
    let run = NO_RUN;
    if (string && body) {
      sets.set(body.sets);
      run = this.#run(string, body.count, sets);
      reach = await this.#plainTokens(string, body.count, run, sets, after, budget, mask, slices);
    }
    // Per depth, the parse so far, in one of three forms: the grammar's state once the leaf has
    // ended inside the token (generic); the leaf's state as an object (leafStates), as a byte
    // walk makes them; or, in a plain body (numeric), its count and its patterns' states, k at a
    // time, as numbers: in sets while all its characters are of the run, else in chars. A walk
    // enters a body (after an opening quote or an escape) with most of the vocabulary's tokens
    // still alive, so the numbers step them without making an object per byte; an object is made
    // for a body only at a byte that is not plain text ('"', '\\', a control byte), and kept in
    // leafStates for the siblings. A half-read character is in pendings in either leaf form.
    const depths = v.maxBytes + 1;
    const onRun = new Uint8Array(depths);
    const numeric = new Uint8Array(depths);
    const counts = new Uint32Array(depths);
    const chars = new Int32Array(depths * k);
    chars.set(sets);
    // The body's state after d characters of the run, and where it goes on each first byte that
    // is not a plain character, by d·256 + byte (tokens of one run share them).
    const runStates: unknown[] = [];
    const runSteps = new Map<number, ReturnType<typeof readByte>>();
    const leafStates: unknown[] = [cursor.state];
    const pendings: (Utf8Partial | null)[] = [null];
    const generic: (ParseState | null)[] = [null];
    counts[0] = start;
    if (body) {
      onRun[0] = 1;
      numeric[0] = 1;
    }
    // The grammar's state once the leaf ended, per ended leaf state (tokens share them).
    const ended = new Map<unknown, ParseState>();
    /** Depth d + 1 as a plain body, its states still to be written. */
    const enterBody = (d: number, count: number, pending: Utf8Partial | null, state: unknown) => {
      numeric[d + 1] = 1;
      onRun[d + 1] = 0;
      counts[d + 1] = count;
      pendings[d + 1] = pending;
      leafStates[d + 1] = state;
      generic[d + 1] = null;
    };
    /** Depth d + 1 after a byte read into a leaf state object: in numbers once a plain body. */
    const stepped = (d: number, step: NonNullable<ReturnType<typeof readByte>>) => {
      const plain = step.pending === null ? string?.plainBody(step.state as never) : null;
      if (plain) {
        enterBody(d, plain.count, null, step.state);
        chars.set(plain.sets, (d + 1) * k);
        return;
      }
      numeric[d + 1] = 0;
      onRun[d + 1] = 0;
      leafStates[d + 1] = step.state;
      pendings[d + 1] = step.pending;
      generic[d + 1] = null;
    };
    /** Depth d + 1 as one more character of the run. */
    const runChar = (d: number) => {
      enterBody(d, counts[d] + 1, null, undefined);
      onRun[d + 1] = 1;
    };
    // The tokens that walkTrie allows: only those of `only` when given.
    let only: Uint32Array | undefined;
    const step = (n: number) => {
      const d = trie.depth[n] - 1;
      const b = trie.symbol[n];
      if (b === RUN) {
        runChar(d);
        return d + 1 <= run.longest;
      }
      if (b > RUN) {
        // A leading character that leaves the run here (exit walks start at those) or after.
        enterBody(d, counts[d] + 1, null, undefined);
        if (onRun[d]) chars.set(sets.subarray(d * k, d * k + k), d * k);
        return readChar(string!, start, chars, k, d + 1, b - CHAR);
      }
      const gs = generic[d];
      if (gs) {
        const next = g.feed(gs, b);
        generic[d + 1] = next;
        return next !== null;
      }
      if (numeric[d] && b >= 0x20 && b !== 0x22 && b !== 0x5c) {
        // A plain byte in a plain body: as readByte and StringLeaf.step would read it.
        const next = utf8Step(pendings[d], b);
        if (next === null) return false;
        if (onRun[d]) chars.set(sets.subarray(d * k, d * k + k), d * k);
        if (typeof next === "number") {
          enterBody(d, counts[d] + 1, null, undefined);
          // readChar counts from the body before the token; here, d bytes before this one.
          return readChar(string!, counts[d] - d, chars, k, d + 1, next);
        }
        enterBody(d, counts[d], next, undefined);
        chars.copyWithin((d + 1) * k, d * k, d * k + k);
        const [lo, hi] = utf8Range(next);
        return lo <= hi && string!.fits(counts[d], chars, lo, hi, d * k);
      }
      let ls = leafStates[d];
      if (ls === undefined && onRun[d]) {
        ls = leafStates[d] = runStates[d] ??= string!.bodyState(counts[d], sets, d * k);
        let step = runSteps.get(d * 256 + b);
        if (step === undefined) runSteps.set(d * 256 + b, step = readByte(leaf, ls, null, b));
        if (step === null) return false;
        stepped(d, step);
        return true;
      }
      ls ??= leafStates[d] = string!.bodyState(counts[d], chars, d * k);
      const p = pendings[d];
      // Once the leaf may end, the grammar goes on from it (it may read more or move on).
      if (p === null && leaf.done(ls)) {
        let resumed = ended.get(ls);
        if (!resumed) ended.set(ls, resumed = cursor.resume(ls));
        const next = g.feed(resumed, b);
        generic[d + 1] = next;
        return next !== null;
      }
      const next = readByte(leaf, ls, p, b);
      if (next === null) return false;
      stepped(d, next);
      return true;
    };
    const spelt = (n: number) => {
      const d = trie.depth[n];
      let left = 0;
      if (budget !== Infinity) {
        const gs = generic[d];
        const need = pendings[d]?.need ?? 0;
        left = gs
          ? g.distance(gs)
          : numeric[d]
          ? string!.closeDistance(counts[d], onRun[d] ? sets : chars, d * k) + after + need
          : leaf.distance(leafStates[d]) + after + need;
      }
      reach = this.#allowAll(trie, n, mask, left, budget, reach, only);
    };
    /**
     * The tokens that are not plain text, from `tails` spans: those whose leading characters are
     * of the run once per number of them and text after; then the others from where they leave
     * it, the depths up to there as the run left them.
     */
    const specialWalks = async (tails: readonly number[]) => {
      const specials = v.runSpecials(run.head, run.chars);
      trie = v.tails;
      only = specials.onRun;
      await walkTrie(trie, slices, step, spelt, tails);
      for (let d = 0; d < run.longest; d++) runChar(d);
      trie = v.special;
      only = undefined;
      const spans = exitSpans(
        trie,
        specials.exits,
        run,
        (r) => readsAt(string!, sets, r),
        (cp) => CHAR + cp,
      );
      await walkTrie(trie, slices, step, spelt, spans);
    };
    if (string && body) {
      await specialWalks([0, v.tails.symbol.length]);
      return reach;
    }
    // First bytes whose tokens are walked apart.
    const apart = new Set<number>();
    if (string && escape) {
      // After a backslash, a token that starts with an escape's letter reads its character, then
      // goes on as in a body ("\nothing": a newline, then "othing"), by its group's run.
      for (const group of this.#escapeRuns(string, escape, sets)) {
        run = group.run;
        reach = Math.max(
          reach,
          await this.#plainTokens(string, start, run, sets, after, budget, mask, slices),
        );
        // The run's states by depth are this group's.
        runStates.length = 0;
        runSteps.clear();
        await specialWalks(rootSpans(v.tails, (symbol) => symbol === RUN));
        for (const letter of group.letters) apart.add(letter);
      }
    }
    // A '"' or '\\' that enters a plain body (an opening quote, an escaped quote or backslash): the
    // tokens of it and then plain text read that text as a body's plain tokens, by the run from
    // there (the states of a pattern that counts, such as `.{0,80}`, are another at each
    // character, so each is a mask walked anew: ~1 ms a walk by character on the 248k-token
    // vocabulary, ~0.05 ms by a class already built); the others that start with it are walked
    // byte by byte (a walk of all would make a body state a byte).
    for (const [first, tokens] of v.afterFirst) {
      const opened = string && !body ? this.#openedBy(string, cursor.state, first) : null;
      if (!opened) continue;
      apart.add(first);
      reach = Math.max(
        reach,
        await this.#plainTokens(
          string!,
          opened.count,
          opened.run,
          opened.states,
          after,
          budget,
          mask,
          slices,
          first,
        ),
      );
      trie = tokens.others;
      await walkTrie(trie, slices, step, spelt);
    }
    // The other tokens byte by byte: after a backslash, 'u' (hex digits follow) and the letters
    // of escapes the string refuses.
    trie = v.all;
    await walkTrie(trie, slices, step, spelt, rootSpans(trie, (symbol) => !apart.has(symbol)));
    return reach;
  }

  /**
   * After a backslash (`escape`: the body's count and its patterns' states), per group of escape
   * letters whose characters step the states alike: the letters and a run with them as its head,
   * as #run makes a body's, its states written into `sets` before the group is yielded.
   */
  *#escapeRuns(
    string: StringLeaf,
    escape: { readonly count: number; readonly sets: readonly number[] },
    sets: Int32Array,
  ): Generator<{ readonly letters: readonly number[]; readonly run: Run }> {
    const { count } = escape;
    const k = string.rules.patterns.length;
    const groups = new Map<string, number[]>();
    for (const [letter, c] of LETTER_ESCAPES) {
      sets.set(escape.sets);
      if (!readChar(string, count, sets, k, 1, c)) continue;
      const key = sets.subarray(k, 2 * k).join();
      const group = groups.get(key);
      if (group) group.push(letter);
      else groups.set(key, [letter]);
    }
    for (const letters of groups.values()) {
      sets.set(escape.sets);
      readChar(string, count, sets, k, 1, LETTER_ESCAPES.get(letters[0])!);
      yield { letters, run: this.#run(string, count, sets, CharSet.of(...letters)) };
    }
  }

  /**
   * The plain body that `first` (a key of afterFirst: an opening quote, an escaped quote or
   * backslash) opens from `string`'s `state`: its count, its run (#run) and the run's states;
   * null where it opens none.
   */
  #openedBy(
    string: StringLeaf,
    state: unknown,
    first: number,
  ): { readonly count: number; readonly run: Run; readonly states: Int32Array } | null {
    const next = string.step(state as never, first);
    const opened = next ? string.plainBody(next) : null;
    if (!opened) return null;
    const states = new Int32Array((this.#vocab.maxRun + 1) * string.rules.patterns.length);
    states.set(opened.sets);
    return { count: opened.count, run: this.#run(string, opened.count, states), states };
  }

  /**
   * The run of a string body of `count` characters, its patterns' states at sets[0…k]: its
   * states after each number of characters in sets, k at a time, from the most it reads down.
   * After a backslash, `letters` are those of escapes whose characters step the states alike,
   * one of them read into sets[k…2k] already: the run's head.
   */
  #run(leaf: StringLeaf, count: number, sets: Int32Array, letters?: CharSet): Run {
    const { patterns } = leaf.rules;
    const k = patterns.length;
    // The part of `within` that steps every pattern's state after l characters alike.
    const alike = (l: number, within: CharSet) =>
      patterns.reduce((part, p, i) => p.alike(sets[l * k + i], part), within);
    const head = letters ?? alike(0, readsAt(leaf, sets, 0));
    let chars = head;
    const most = this.#vocab.maxRun;
    let longest = 0;
    for (let l = 1; l <= most && !chars.empty; l++) {
      if (!(letters && l === 1) && !readChar(leaf, count, sets, k, l, chars.ranges[0])) break;
      longest = l;
      // A longer token reads on from here: after the first character, the class that steps the
      // states alike; then the part of it that still does (a part of a class steps as the rest
      // did before, so the states so far still hold).
      if (l < most) chars = alike(l, l === 1 ? readsAt(leaf, sets, 1) : chars);
    }
    if (letters) return { head, chars, longest, shortest: 1 };
    // A loop's class (the same after the first character) serves every length of it. A first
    // character of one class and one or two of another would have their classes built for that
    // alone (a date's "-0", "01", a sentence's "x."), to save little: the empty run serves them.
    return longest < 3 && !head.equals(chars) ? NO_RUN : { head, chars, longest, shortest: 0 };
  }

  /**
   * The tokens of plainTextTrie(first) read as plain text into a string body of `count`
   * characters, its run (#run) and the run's states in `sets`: by class, then from where they
   * leave the run.
   */
  async #plainTokens(
    leaf: StringLeaf,
    count: number,
    run: Run,
    sets: Int32Array,
    after: number,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
    first?: number,
  ): Promise<number> {
    return Math.max(
      this.#byClass(leaf, count, run, sets, after, budget, mask, first),
      await this.#exitWalk(leaf, count, run, sets, after, budget, mask, slices, first),
    );
  }

  /**
   * The tokens of plainTextTrie(first) whose characters are all of a string body's run (#run),
   * the body of `count` characters, by length: a token of L of them is read as any other of
   * that length is, so the bounds and distance are asked once per length instead of per token,
   * and the mask is a difference of the class's masks of tokens by length.
   */
  #byClass(
    leaf: StringLeaf,
    count: number,
    run: Run,
    sets: Int32Array,
    after: number,
    budget: number,
    mask: Uint32Array,
    first?: number,
  ): number {
    const v = this.#vocab;
    const k = leaf.rules.patterns.length;
    const { longest } = run;
    const { depth, symbol } = v.plainTextTrie(first);
    const tokens = v.classTokens(run.head, run.chars, first);
    const { upTo, listed, listedFrom } = tokens;
    const fits = new Uint8Array(longest + 1);
    let reach = -1;
    for (let l = 1; l <= longest; l++) {
      const left = budget === Infinity ? 0 : leaf.closeDistance(count + l, sets, l * k) + after;
      if (left > budget) continue;
      fits[l] = 1;
      if (tokens.counts[l]) reach = Math.max(reach, budget === Infinity ? UNCHECKED_REACH : left);
    }
    // Runs of lengths that fit, as differences of the masks by length.
    const short = upTo ? Math.min(longest, SHORT_CHARS) : 0;
    for (let a = 1; a <= short; a++) {
      if (!fits[a]) continue;
      let b = a;
      while (b < short && fits[b + 1]) b++;
      const upper = upTo![b];
      const lower = upTo![a - 1];
      for (let w = 0; w < mask.length; w++) mask[w] |= upper[w] & ~lower[w];
      a = b;
    }
    for (let l = short + 1; l <= longest; l++) {
      if (!fits[l]) continue;
      for (let t = listedFrom[l]; t < listedFrom[l + 1]; t++) {
        mask[listed[t] >>> 5] |= 1 << (listed[t] & 31);
      }
    }
    // A token that ends in an incomplete character: some completion must fit, as the walk checks
    // (one of no whole character does not start an escape).
    tokens.partial.forEach((id, t) => {
      const node = tokens.partialNode[t];
      const whole = depth[node] - 1;
      if (whole > longest || whole < run.shortest) return;
      const { lo, hi, need } = partialOf(symbol[node]);
      if (!leaf.fits(count + whole, sets, lo, hi, whole * k)) return;
      const left = budget === Infinity
        ? 0
        : leaf.closeDistance(count + whole, sets, whole * k) + after + need;
      reach = this.#allow(mask, id, left, budget, reach);
    });
    return reach;
  }

  /**
   * The other tokens of plainTextTrie(first) in that body: those that leave its run, walked from
   * where they leave it (#charWalk).
   */
  async #exitWalk(
    leaf: StringLeaf,
    count: number,
    run: Run,
    sets: Int32Array,
    after: number,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
    first?: number,
  ): Promise<number> {
    const v = this.#vocab;
    const trie = v.plainTextTrie(first);
    const { exits } = v.classTokens(run.head, run.chars, first);
    const spans = exitSpans(
      trie,
      exits,
      run,
      (r) => readsAt(leaf, sets, r),
      (cp) => 8 * cp,
    );
    return await this.#charWalk(
      leaf,
      count,
      trie,
      sets.slice(),
      after,
      budget,
      mask,
      slices,
      spans,
    );
  }

  /**
   * Walks `spans` of `trie`, a trie of plain text by characters, into a string body that had
   * `count` characters before, its patterns' states after d characters at states[dk…] (k of
   * them, those above the spans' depth given): each character counting and stepping the patterns
   * (an incomplete last one must still fit them) and the string still closable after it, as
   * StringLeaf.step would, on numbers.
   */
  async #charWalk(
    leaf: StringLeaf,
    count: number,
    trie: TokenTrie,
    states: Int32Array,
    after: number,
    budget: number,
    mask: Uint32Array,
    slices: Slices,
    spans: readonly number[],
  ): Promise<number> {
    const k = leaf.rules.patterns.length;
    let reach = -1;
    await walkTrie(trie, slices, (n) => {
      const d = trie.depth[n];
      const symbol = trie.symbol[n];
      if ((symbol & 7) === WHOLE) return readChar(leaf, count, states, k, d, symbol >>> 3);
      // An incomplete last character leaves the states as they were (spelt reads them at d).
      const { lo, hi } = partialOf(symbol);
      states.copyWithin(d * k, (d - 1) * k, d * k);
      return leaf.fits(count + d - 1, states, lo, hi, (d - 1) * k);
    }, (n) => {
      const d = trie.depth[n];
      const symbol = trie.symbol[n];
      let left = 0;
      if (budget !== Infinity) {
        const whole = (symbol & 7) === WHOLE;
        const need = whole ? 0 : partialOf(symbol).need;
        left = leaf.closeDistance(count + (whole ? d : d - 1), states, d * k) + after + need;
      }
      reach = this.#allowAll(trie, n, mask, left, budget, reach);
    }, spans);
    return reach;
  }
}

/**
 * A string body's run: its first character from `head` and the others from `chars`, each class
 * stepping the states alike, for up to `longest` characters. Tokens leave it after `shortest`
 * characters or more: 1 after a backslash, where `head` is the letters of the escapes read.
 */
interface Run {
  readonly head: CharSet;
  readonly chars: CharSet;
  readonly longest: number;
  readonly shortest: number;
}

const NO_RUN: Run = { head: CharSet.EMPTY, chars: CharSet.EMPTY, longest: 0, shortest: 0 };

/** The characters that every pattern of `leaf` reads after l characters of a run, by `sets`. */
function readsAt(leaf: StringLeaf, sets: Int32Array, l: number): CharSet {
  const { patterns } = leaf.rules;
  return CharSet.common(patterns.map((p, i) => p.reads(sets[l * patterns.length + i])));
}

/**
 * The spans of `trie` that walk its `exits` after each number of `run`'s characters a token may
 * leave it after: only those whose character the states there read (`reads`, as code point
 * ranges; `symbolOf`, a character's least symbol), as a pattern reads few of the vocabulary's
 * tens of thousands of characters. Longest runs first: a walk writes only the states deeper than
 * its run's, which those walks have done with.
 */
function exitSpans(
  trie: TokenTrie,
  exits: Exits,
  run: Run,
  reads: (r: number) => CharSet,
  symbolOf: (cp: number) => number,
): number[] {
  const { nodes, from } = exits;
  const spans: number[] = [];
  for (let r = run.longest; r >= run.shortest; r--) {
    const ranges = reads(r).ranges;
    for (let i = 0; i < ranges.length; i += 2) {
      const to = exitAt(trie, nodes, from[r], from[r + 1], symbolOf(ranges[i + 1] + 1));
      for (let e = exitAt(trie, nodes, from[r], to, symbolOf(ranges[i])); e < to; e++) {
        // Exits side by side in the trie walk as one span.
        const n = nodes[e];
        if (spans.length && spans.at(-1) === n) spans[spans.length - 1] = trie.end[n];
        else spans.push(n, trie.end[n]);
      }
    }
  }
  return spans;
}

/** The spans of `trie` that walk the subtrees of its first symbols that `keep` keeps. */
function rootSpans(trie: TokenTrie, keep: (symbol: number) => boolean): number[] {
  const spans: number[] = [];
  for (let n = 0; n < trie.symbol.length; n = trie.end[n]) {
    if (!keep(trie.symbol[n])) continue;
    if (spans.length && spans.at(-1) === n) spans[spans.length - 1] = trie.end[n];
    else spans.push(n, trie.end[n]);
  }
  return spans;
}

/** The first of exits[from…to) whose node's symbol is `symbol` or more (`to` when none). */
function exitAt(
  trie: TokenTrie,
  exits: Uint32Array,
  from: number,
  to: number,
  symbol: number,
): number {
  let lo = from;
  let hi = to;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (trie.symbol[exits[mid]] < symbol) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Reads whole character `cp`, the d-th of a token, into a string body that had `count` characters
 * before the token, as StringLeaf.step would: the patterns' states (k of them) go from
 * sets[(d − 1)k…] to sets[dk…]. Whether the string reads it and can still close after it.
 */
function readChar(
  leaf: StringLeaf,
  count: number,
  sets: Int32Array,
  k: number,
  d: number,
  cp: number,
): boolean {
  if (count + d - 1 >= leaf.rules.maxLength) return false;
  const from = (d - 1) * k;
  for (let i = 0; i < k; i++) {
    const next = leaf.rules.patterns[i].step(sets[from + i], cp);
    if (next === 0) return false;
    sets[from + k + i] = next;
  }
  return !leaf.bound || leaf.closable(count + d, sets, from + k);
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
