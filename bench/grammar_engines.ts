// Two mask engines, lib/grammar and xgrammar, driven in lockstep through the same documents (each
// step's token allowed by both), timed per mask and per step of N sequences, masks compared.

import process from "node:process";
import type { Grammar } from "../lib/grammar/grammar.ts";
import { GrammarConstraint, VocabIndex } from "../lib/grammar/token_mask.ts";
import type { TokenConstraint } from "../lib/scheduler/sequence.ts";
import type { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { rng } from "../tests/_fuzz.ts";
import { type GrammarSpec, ourGrammar } from "./grammar_specs.ts";

/** A constraint that may hold memory outside the JS heap (xgrammar's matchers). */
export type EngineConstraint = TokenConstraint & { dispose?(): void };

/** A mask engine: a request compiled once (C), a constraint per reply. */
export interface MaskEngine<C = unknown> {
  readonly name: string;
  compile(spec: GrammarSpec): Promise<C>;
  constraint(compiled: C): Promise<EngineConstraint>;
}

/** lib/grammar as the server runs it, but with its event-loop slices off (pure CPU). */
export class OurEngine implements MaskEngine<Grammar> {
  readonly name = "lib/grammar";
  readonly vocab: VocabIndex;

  constructor(tokenizer: TextTokenizer) {
    this.vocab = VocabIndex.of(tokenizer);
  }

  compile(spec: GrammarSpec): Promise<Grammar> {
    return Promise.resolve(ourGrammar(spec));
  }

  constraint(grammar: Grammar): Promise<EngineConstraint> {
    return Promise.resolve(new GrammarConstraint(grammar, this.vocab, { sliceMs: Infinity }));
  }
}

/** Engines over one vocabulary, with what building each took (ms); built by bench/xgrammar.ts. */
export interface Engines {
  readonly tokenizer: TextTokenizer;
  readonly list: readonly MaskEngine[];
  readonly setupMs: readonly number[];
  /** Plain JSON string text tokens (lib/grammar's index), to steer documents to close strings. */
  readonly plain: Uint32Array;
}

export const isSet = (mask: Uint32Array, id: number) => ((mask[id >>> 5] >>> (id & 31)) & 1) === 1;

/** A mask's allowed ids. */
export function allowedIds(mask: Uint32Array, vocabSize: number): number[] {
  const ids: number[] = [];
  for (let w = 0; w < mask.length; w++) {
    for (let bits = mask[w]; bits !== 0; bits &= bits - 1) {
      const id = w * 32 + 31 - Math.clz32(bits & -bits);
      if (id < vocabSize) ids.push(id);
    }
  }
  return ids;
}

/** Set bits of a 32-bit word. */
function popcount(x: number): number {
  x -= (x >>> 1) & 0x55555555;
  x = (x & 0x33333333) + ((x >>> 2) & 0x33333333);
  return (((x + (x >>> 4)) & 0x0f0f0f0f) * 0x01010101) >>> 24;
}

/**
 * An id drawn with `random` among those `mask` allows below `vocabSize`, `skip` left out: the id
 * allowedIds' list (without `skip`) holds at index ⌊random() · its length⌋, found by counting bits
 * instead of listing them (a free string allows ~220,000 ids of 248,320), with no copy of the mask
 * (garbage made between timed steps is collected during them); undefined when none.
 */
export function drawAllowed(
  mask: Uint32Array,
  vocabSize: number,
  skip: Iterable<number>,
  random: () => number,
): number | undefined {
  const words = Math.ceil(vocabSize / 32);
  const dropped = new Map<number, number>();
  for (const id of skip) {
    if (id < vocabSize) dropped.set(id >>> 5, (dropped.get(id >>> 5) ?? 0) | (1 << (id & 31)));
  }
  const tail = vocabSize % 32 ? (1 << (vocabSize % 32)) - 1 : -1;
  const bitsOf = (w: number) => mask[w] & ~(dropped.get(w) ?? 0) & (w === words - 1 ? tail : -1);
  let count = 0;
  for (let w = 0; w < words; w++) count += popcount(bitsOf(w));
  if (count === 0) return undefined;
  let k = Math.floor(random() * count);
  for (let w = 0;; w++) {
    let bits = bitsOf(w);
    const c = popcount(bits);
    if (k >= c) {
      k -= c;
      continue;
    }
    for (; k > 0; k--) bits &= bits - 1;
    return w * 32 + 31 - Math.clz32(bits & -bits);
  }
}

/** Where two masks of one step differ: the ids only the first allows, and only the second. */
export interface MaskDiff {
  readonly step: number;
  /** The document's text before the step. */
  readonly text: string;
  readonly only: readonly [number[], number[]];
}

/** Tokens left that put no budget on a mask (lib/grammar checks budgets up to 4096). */
export const UNBUDGETED = 1_000_000;

/** One document: each engine's time per mask (ms), and the steps where their masks differ. */
export interface DocumentRun {
  readonly ms: number[][];
  readonly diffs: MaskDiff[];
  readonly text: string;
  /** Why it ended: a grammar's end, an end-of-generation token, the token limit, or masks that share no token. */
  readonly end: "done" | "eos" | "limit" | "disjoint";
}

export interface DocumentOptions {
  readonly maxTokens: number;
  /** Whether lib/grammar's masks keep to the token budget (the server's) or ignore it. */
  readonly budget: boolean;
  readonly random: () => number;
  /** Stop after this many steps, whatever the document. */
  readonly stepsLeft?: number;
}

/**
 * Decodes one document under both engines' constraints at once: each step times each mask, then
 * picks a random token both allow (a fifth of the time one that is not plain string text, so
 * strings close) and accepts it everywhere.
 */
export async function runDocument(
  engines: Engines,
  constraints: readonly EngineConstraint[],
  options: DocumentOptions,
): Promise<DocumentRun> {
  const { tokenizer, plain } = engines;
  const ms: number[][] = constraints.map(() => []);
  const diffs: MaskDiff[] = [];
  const ids: number[] = [];
  let end: DocumentRun["end"] = "limit";
  const steps = Math.min(options.maxTokens, options.stepsLeft ?? Infinity);
  for (let n = 0; n < steps; n++) {
    if (constraints[0].done) {
      end = "done";
      break;
    }
    const remaining = options.budget ? options.maxTokens - n : UNBUDGETED;
    const masks: Uint32Array[] = [];
    for (const [e, c] of constraints.entries()) {
      const start = performance.now();
      const mask = await c.mask(remaining);
      ms[e].push(performance.now() - start);
      masks.push(mask);
    }
    const lists = masks.map((m) => allowedIds(m, tokenizer.vocabSize));
    const both = lists[0].filter((id) => masks.every((m) => isSet(m, id)));
    if (both.length !== lists[0].length || lists.some((l) => l.length !== both.length)) {
      diffs.push({
        step: n,
        text: tokenizer.decode(ids, { specials: false }),
        only: [
          lists[0].filter((id) => !isSet(masks[1], id)),
          lists[1].filter((id) => !isSet(masks[0], id)),
        ],
      });
    }
    if (both.length === 0) {
      end = "disjoint";
      break;
    }
    const special = both.filter((id) => !isSet(plain, id));
    const from = special.length && options.random() < 0.2 ? special : both;
    const id = from[Math.floor(options.random() * from.length)];
    if (tokenizer.eosIds.has(id)) {
      end = "eos";
      break;
    }
    for (const c of constraints) c.accept(id);
    ids.push(id);
  }
  return { ms, diffs, text: tokenizer.decode(ids, { specials: false }), end };
}

/** The q-quantile of ascending `sorted`. */
export function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

export interface BatchOptions {
  /** Sequences decoding at once. */
  readonly sequences: number;
  readonly steps: number;
  readonly maxTokens: number;
  /** Whether lib/grammar's masks keep to the token budget (the server's) or ignore it. */
  readonly budget: boolean;
  readonly seed: number;
}

/** Per step of N sequences: the head CPU (ms) all their masks took, and all their accepts. */
export interface BatchTiming {
  /** Wall time from asking the masks to having them all. */
  readonly maskMs: number[];
  /**
   * The process's CPU time (every thread, user and system) over the same span: below maskMs
   * when the thread was preempted (a shared box), above it when collector or compiler threads ran.
   */
  readonly maskCpuMs: number[];
  readonly acceptMs: number[];
  /** Documents begun, the first N included. */
  documents: number;
}

/**
 * Times the steps of `options.sequences` constrained sequences decoding at once under `engine`,
 * sequence i under specs[i mod length], each on its own document and position (sequence i starts
 * i tokens in; a finished one starts a new document). A step asks every sequence's mask at once,
 * as a batched scheduler would, and the time of all of them together is the step's.
 */
export async function timeBatch(
  engine: MaskEngine,
  tokenizer: TextTokenizer,
  specs: readonly GrammarSpec[],
  options: BatchOptions,
): Promise<BatchTiming> {
  const random = rng(options.seed);
  const compiled = await Promise.all(specs.map((s) => engine.compile(s)));
  const n = options.sequences;
  const grammarOf = (i: number) => compiled[i % compiled.length];
  const out: BatchTiming = { maskMs: [], maskCpuMs: [], acceptMs: [], documents: n };
  const seqs = await Promise.all(
    Array.from(
      { length: n },
      async (_, i) => ({ c: await engine.constraint(grammarOf(i)), at: 0 }),
    ),
  );
  const pick = (mask: Uint32Array) =>
    drawAllowed(mask, tokenizer.vocabSize, tokenizer.eosIds, random);
  /** Starts sequence i again on a new document once it can go no further. */
  const renew = async (i: number) => {
    seqs[i].c.dispose?.();
    seqs[i] = { c: await engine.constraint(grammarOf(i)), at: 0 };
    out.documents++;
  };
  /** Accepts a token sequence i's mask allows; the ms accept took (renewing is not timed). */
  const advance = async (i: number, mask: Uint32Array): Promise<number> => {
    const id = pick(mask);
    if (id === undefined || seqs[i].at + 1 >= options.maxTokens) {
      await renew(i);
      return 0;
    }
    const start = performance.now();
    seqs[i].c.accept(id);
    const ms = performance.now() - start;
    seqs[i].at++;
    if (seqs[i].c.done) await renew(i);
    return ms;
  };
  const maskOf = (i: number) =>
    seqs[i].c.mask(options.budget ? options.maxTokens - seqs[i].at : UNBUDGETED);
  for (let i = 0; i < n; i++) for (let k = 0; k < i; k++) await advance(i, await maskOf(i));
  for (let step = 0; step < options.steps; step++) {
    const cpu = process.cpuUsage();
    const start = performance.now();
    const masks = await Promise.all(seqs.map((_, i) => maskOf(i)));
    out.maskMs.push(performance.now() - start);
    const used = process.cpuUsage(cpu);
    out.maskCpuMs.push((used.user + used.system) / 1000);
    let acceptMs = 0;
    for (let i = 0; i < n; i++) acceptMs += await advance(i, masks[i]);
    out.acceptMs.push(acceptMs);
  }
  for (const s of seqs) s.c.dispose?.();
  return out;
}
