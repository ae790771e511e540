// The stage contract: a stage owns layers [first, end) of one model and per-slot sequence state.
// Implemented by the CPU reference engine and the WebGPU engine; driven by generate, worker and head.

/** Input rows for positions [base, base+n): token ids on the first stage, hidden rows after it. */
export type StageInput =
  | { readonly kind: "ids"; readonly ids: Uint32Array }
  | { readonly kind: "hidden"; readonly rows: Float32Array };

/** A candidate of the last position's logits. */
export interface TopEntry {
  readonly id: number;
  readonly logit: number;
}

/**
 * Output: hidden rows (n·D f32, position-major) from a stage that is not last; from the last
 * stage the greedy id of each of the n positions plus the top-k of the last position, descending
 * by logit (ties: lower id first).
 */
export type StageOutput =
  | { readonly kind: "hidden"; readonly rows: Float32Array }
  | { readonly kind: "ids"; readonly ids: Uint32Array; readonly top: readonly TopEntry[] };

export interface StageRunOptions {
  /** How many (id, logit) pairs of the last position to return from the last stage. */
  readonly topk?: number;
}

export interface Stage {
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
   * Optional, for a stage that owns the whole model: greedy decoding of `steps` tokens from `id`
   * at position `base` in one submission, each step's argmax fed to the next on the device.
   * Returns every step's greedy id and the top-k of the last step.
   */
  decodeGreedy?(
    slot: number,
    id: number,
    base: number,
    steps: number,
    options?: StageRunOptions,
  ): Promise<{ ids: Uint32Array; top: readonly TopEntry[] }>;
  /** Copies slot state (KV up to its position, conv and recurrent states) into snapshot `idx`. */
  save(slot: number, idx: number): Promise<void>;
  /** Restores snapshot `idx` into `slot`; returns the position the slot then continues from. */
  restore(slot: number, idx: number): Promise<number>;
  close(): void;
}
