// The stage contract: a stage owns layers [first, end) of one model and per-slot sequence state.
// Implemented by the CPU reference engine and the WebGPU engine; driven by generate, worker and head.

import type { HParams } from "./hparams.ts";
import type { SamplingParams } from "./sampler.ts";

/** Input rows for positions [base, base+n): token ids on the first stage, hidden rows after it. */
export type StageInput =
  | { readonly kind: "ids"; readonly ids: Uint32Array }
  | {
    readonly kind: "hidden";
    readonly rows: Float32Array;
    /**
     * The tokens at the rows' positions: a last stage that drafts with the model's MTP block
     * (Stage.draft) embeds them, and needs them; other stages pass them on or ignore them.
     */
    readonly ids?: Uint32Array;
  };

/**
 * Largest top-k any stage returns: one bound for the GPU kernel, the reference engine, the wire
 * and every API field that asks for candidates (top_k, n_probs, top_logprobs).
 */
export const MAX_TOPK = 1024;
/** Most u32 words of a LogitAdjust mask: vocabularies of up to 2^21 tokens. */
export const MAX_MASK_WORDS = 65536;
/** Most LogitBias records one run may apply to the logits (16 bytes each on the wire). */
export const MAX_BIAS_PAIRS = 16384;
/** Largest |bias| and |subtract|: far beyond any logit, far below f32's range. */
export const MAX_BIAS = 1e9;
/** The bias that bans a token outright (llama.cpp's `false`, ignore_eos) short of the mask. */
export const BAN = -MAX_BIAS;
/** A LogitBias's repeat lies in [1 / MAX_REPEAT, MAX_REPEAT], so no logit leaves f32's range. */
export const MAX_REPEAT = 1000;

/** A candidate of the last position's logits (f32 values, as every stage returns them). */
export interface TopEntry {
  readonly id: number;
  readonly logit: number;
}

/**
 * A change to one token's logit: x → rep(x + bias, repeat) − subtract, where rep(v, r) is v / r
 * for v > 0 and v · r otherwise. That is llama.cpp's order: logit bias, then repetition penalty,
 * then presence and frequency penalties; the head builds them per step (lib/sampling/penalties.ts)
 * so that a penalised token outside the top-k moves exactly as the full logits say.
 */
export interface LogitBias {
  readonly id: number;
  readonly bias: number;
  /** Positive; 1 (the default) leaves the logit's scale alone. */
  readonly repeat?: number;
  /** Default 0. */
  readonly subtract?: number;
}

/** Bytes of one LogitBias record as the wire and the GPU kernel hold it. */
export const BIAS_RECORD_BYTES = 16;

/** Records as little-endian (u32 id, f32 bias, f32 repeat, f32 subtract), for the wire and GPU. */
export function encodeBias(bias: readonly LogitBias[]): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(bias.length * BIAS_RECORD_BYTES);
  const v = new DataView(bytes.buffer);
  bias.forEach((b, i) => {
    const at = i * BIAS_RECORD_BYTES;
    v.setUint32(at, b.id, true);
    v.setFloat32(at + 4, b.bias, true);
    v.setFloat32(at + 8, b.repeat ?? 1, true);
    v.setFloat32(at + 12, b.subtract ?? 0, true);
  });
  return bytes;
}

/** One logit after its LogitBias (the reference engine's, and the GPU kernel's, formula). */
export function biasLogit(x: number, b: LogitBias): number {
  const v = x + b.bias;
  const r = b.repeat ?? 1;
  return (v > 0 ? v / r : v * r) - (b.subtract ?? 0);
}

/**
 * Changes to the last position's logits, applied on the last stage before its greedy id, top-k
 * and normaliser: a grammar's allowed tokens and the sampler's biases travel to the logits
 * instead of the logits travelling to them.
 */
export interface LogitAdjust {
  /** Bit (i & 31) of word i >> 5 allows token i; ids past the mask are not allowed. */
  readonly mask?: Uint32Array;
  /** Applied to the logits of these ids (each id at most once), before the mask. */
  readonly bias?: readonly LogitBias[];
}

/**
 * Which positions of a run the last stage computes logits for. "all": every position (its
 * greedy id each). "last": the last position alone, what a sampler uses (a prompt's final
 * chunk, a decode step); its logits have the bits "all" gives that row. "none": no position,
 * no output norm and no LM head: a prompt's earlier chunks, which only fill the slot. The top-k,
 * normaliser and adjustments are of the last position, so "none" takes no topk and no adjust.
 */
export type LogitPositions = "all" | "last" | "none";

export const LOGIT_POSITIONS: readonly LogitPositions[] = ["all", "last", "none"];

/** Greedy ids a last stage returns for a run of n positions: n, 1 (the last) or 0. */
export function greedyCount(logits: LogitPositions | undefined, n: number): number {
  return logits === "none" ? 0 : logits === "last" ? 1 : n;
}

/**
 * What the last stage returns: the greedy ids of the positions its run's `logits` asked for (all
 * n, the last alone, or none: greedyCount; the last position's is always ids[ids.length − 1]),
 * the top-k of the last position (among the tokens its mask allows), descending by logit (ties:
 * lower id first), and the log-sum-exp of that position's whole logits row after biases, before
 * the mask, so that logit − lse is a token's log-probability under the model, whatever a grammar
 * allowed. `lse` is NaN when no top-k was asked for.
 */
export interface LastOutput {
  readonly ids: Uint32Array;
  readonly top: readonly TopEntry[];
  readonly lse: number;
  /**
   * With StageRunOptions.candidates "every": the top-k of every position, in order (the last
   * one's is `top`), each among all tokens (no adjustments apply to a run that asks for them).
   */
  readonly tops?: readonly (readonly TopEntry[])[];
}

/** Output: hidden rows (n·D f32, position-major) from a stage that is not last, else ids. */
export type StageOutput =
  | { readonly kind: "hidden"; readonly rows: Float32Array }
  | ({ readonly kind: "ids" } & LastOutput);

/**
 * What a run's rows are, and so which kernels compute them: "prompt" rows (a prompt's positions)
 * run the prefill products, on tensor cores where the device has them (f16 operands); "decode"
 * rows (generated tokens) run f32 products. A token's bits depend on its kind, never on how many
 * rows share its run or step: a prompt gives the same bits however it is chunked, and a
 * generated token replayed as part of a longer run ("decode") the bits it had when generated.
 */
export type RowKind = "prompt" | "decode";

export const ROW_KINDS: readonly RowKind[] = ["prompt", "decode"];

/** A run's rows when the caller does not say: "prompt" for several positions, else "decode". */
export function defaultRows(n: number): RowKind {
  return n > 1 ? "prompt" : "decode";
}

export interface StageRunOptions {
  /** How many (id, logit) pairs of the last position to return from the last stage (≤ MAX_TOPK). */
  readonly topk?: number;
  /** Changes to the last position's logits (the last stage applies them). */
  readonly adjust?: LogitAdjust;
  /** Which positions need the LM head (default "all"); every stage passes it on to the last. */
  readonly logits?: LogitPositions;
  /** What the rows are (default defaultRows(n)); every stage passes it on. */
  readonly rows?: RowKind;
  /**
   * Keep the state after each of the run's positions, so that `rewind` can take the slot back
   * to any of them: a speculative step's drafts, verified in one run, of which the model may
   * accept only some. n must be at most the stage's `maxRewind`; every stage passes it on.
   */
  readonly rewindable?: boolean;
  /**
   * "every": the top-k of every position, not only the last (LastOutput.tops), for sampling a
   * speculative step's positions; needs logits "all" and no adjust, and n·(2·topk + 1) ≤
   * 2·MAX_TOPK + 1 (one run's share of the GPU's candidate buffer). Default "last".
   */
  readonly candidates?: "last" | "every";
  /**
   * false: a stage that runs the model's MTP block (opened with `mtp`) skips it for this run, for
   * a sequence that will not draft after it. The slot's `draft` then returns none until the slot
   * starts again at position 0 (its block's cache has a gap), and snapshots saved from it carry
   * the gap. Default true; a stage without the block ignores it.
   */
  readonly mtp?: boolean;
}

/** Stage.decodeFused's options: a run's top-k and MTP choice, and how its steps sample. */
export interface FusedOptions extends Pick<StageRunOptions, "topk" | "mtp"> {
  /**
   * Sample each step from its top `topk` (≥ 1) candidates with `params` (temperature > 0, no
   * grammar or logit changes), step s with the u32 draws[s] (SplitMix64.nextU32, as the head
   * draws); without it each step takes its argmax.
   */
  readonly sampling?: { readonly params: SamplingParams; readonly draws: Uint32Array };
  /**
   * Logit changes every step applies before its argmax and top-k, as a run's `adjust.bias`
   * (a request's logit_bias and bans: changes that do not depend on the tokens so far).
   */
  readonly bias?: readonly LogitBias[];
}

/** One sequence of Stage.decodeFusedMany: its slot, the token at its position, its options. */
export interface FusedSequence {
  readonly slot: number;
  readonly id: number;
  readonly base: number;
  readonly options?: FusedOptions;
}

/** A stage's layers and the sizes it was opened with; a worker's HELLO states the same. */
export interface StageShape {
  /** First layer owned (0 on the stage that embeds tokens). */
  readonly first: number;
  /** One past the last layer owned; equals nLayer on the stage that owns the LM head. */
  readonly end: number;
  readonly nLayer: number;
  readonly nEmbd: number;
  readonly slots: number;
  readonly ctx: number;
  /** Largest n accepted by one run (prefill chunks larger than this are the caller's job). */
  readonly maxBatch: number;
  /** Snapshot places `0..snapshots-1` that save and restore accept. */
  readonly snapshots: number;
  /** Most positions of a `rewindable` run (0: the stage keeps no trail and cannot rewind). */
  readonly maxRewind: number;
}

/** What either engine opens a stage with (engine/open_stage.ts); checked by checkOpenOptions. */
export interface StageOpenOptions {
  readonly first: number;
  readonly end: number;
  readonly slots: number;
  readonly ctx: number;
  /** Largest n of one run; default defaultMaxBatch(ctx). */
  readonly maxBatch?: number;
  /** Numbered snapshot places for save/restore; default 0. */
  readonly snapshots?: number;
  /** Most positions of a `rewindable` run; default 0 (none). Each costs a DeltaNet state a slot. */
  readonly maxRewind?: number;
  /**
   * Load the model's MTP block, where the file has one and the stage owns the whole model, and
   * run it beside every run so that `draft` can propose tokens.
   */
  readonly mtp?: boolean;
  /** The model's hyperparameters, when the caller has read them (else read from the model). */
  readonly hp?: HParams;
}

/**
 * Positions per run when the caller sets none. 2048, as llama.cpp's batch and vLLM's default token
 * budget: a prefill's experts get four times the tokens of a 512-position run, so their gathered
 * tiles run fuller (docs/PERFORMANCE.md "Prefill tiles", tenth session); --max-batch trades it for
 * activation memory (tools/plan.ts prints it) and shorter steps beside other slots' decode.
 */
export function defaultMaxBatch(ctx: number): number {
  return Math.min(ctx, DEFAULT_MAX_BATCH);
}

/** defaultMaxBatch's positions where the context holds them (the flags' help quotes it). */
export const DEFAULT_MAX_BATCH = 2048;

/**
 * Sequences a head and its workers run at once when not told (--slots): concurrent users share
 * each step's weight reads, so a slot more costs a row of each step and its state, not a step.
 */
export const DEFAULT_SLOTS = 4;

/**
 * Positions per slot when not told (--ctx): an agentic client's system prompt, tools and history
 * fit; `deno task plan` prints what it takes (about 0.7 GB a slot for Qwen3.5-35B-A3B).
 */
export const DEFAULT_CTX = 32768;

/**
 * Most steps of one Stage.decodeFusedMany call of `sequences` rows on a stage of `maxBatch`: the
 * call's ids, every step's row of each and the next step's, fit a run's maxBatch + 1.
 */
export function fusedManyMostSteps(maxBatch: number, sequences: number): number {
  return Math.floor((maxBatch + 1) / sequences) - 1;
}

export interface Stage extends StageShape {
  /**
   * Runs positions [base, base+n) of `slot`. base == 0 resets the slot; otherwise base must
   * equal the number of positions the slot has seen. Throws RangeError on overflow or gaps.
   */
  run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options?: StageRunOptions,
  ): Promise<StageOutput>;
  /**
   * Optional, for a stage that owns the whole model: decoding of `steps` tokens from `id` at
   * position `base` in one submission, each step's token fed to the next on the device: its
   * argmax, or with `options.sampling` its draw from the step's top `options.topk` candidates in
   * the head's sampler's arithmetic (engine/sampler.ts), so the tokens are what per-step runs and
   * lib/sampling/sample.ts would give. Returns every step's token and the top-k of the last step.
   */
  decodeFused?(
    slot: number,
    id: number,
    base: number,
    steps: number,
    options?: FusedOptions,
  ): Promise<LastOutput>;
  /**
   * Optional, decodeFused for several slots at once: `steps` tokens of each sequence in one
   * submission, every step one shared step of all of them, each row's argmax or draw fed to its
   * next step on the device. Each sequence gets the tokens and top-k decodeFused gives it alone
   * (a row's bits do not depend on the rows beside it). At most fusedManyMostSteps(maxBatch,
   * seqs.length) steps.
   */
  decodeFusedMany?(seqs: readonly FusedSequence[], steps: number): Promise<LastOutput[]>;
  /**
   * Optional, for a stage that owns the whole model and its MTP block (opened with `mtp`): up to
   * `k` tokens the MTP head drafts to follow `id`, the token the slot's next run starts with at
   * the slot's position, greedily, each from the one before. Empty where the stage lacks the
   * hidden state before that position (a slot restored from a snapshot, or never run).
   */
  draft?(slot: number, id: number, k: number): Promise<Uint32Array>;
  /** Copies slot state (KV up to its position, conv and recurrent states) into snapshot `idx`. */
  save(slot: number, idx: number): Promise<void>;
  /** Restores snapshot `idx` into `slot`; returns the position the slot then continues from. */
  restore(slot: number, idx: number): Promise<number>;
  /**
   * Takes `slot` back to position `pos` inside its last run, which was `rewindable` (base < pos
   * ≤ base + n; no run or restore on the slot since): the slot continues from `pos`
   * with the state it had there, as if the run had been of pos − base positions. Later
   * positions' KV is simply overwritten; rewinding again within the same run is allowed.
   */
  rewind(slot: number, pos: number): Promise<void>;
  close(): void;
}
