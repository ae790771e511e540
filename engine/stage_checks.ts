// The request checks every Stage makes before it touches state (slot, snapshot, run shape, input),
// so the GPU, reference and remote stages (engine/gpu, engine/reference, lib/wire) refuse alike.

import {
  defaultMaxBatch,
  defaultRows,
  LOGIT_POSITIONS,
  type LogitAdjust,
  type LogitPositions,
  MAX_BIAS,
  MAX_BIAS_PAIRS,
  MAX_MASK_WORDS,
  MAX_REPEAT,
  MAX_TOPK,
  ROW_KINDS,
  type RowKind,
  type Stage,
  type StageInput,
  type StageOpenOptions,
  type StageRunOptions,
  type StageShape,
} from "./stage.ts";

function wholeAtLeast(name: string, value: number, min: number): void {
  if (!Number.isInteger(value) || value < min) {
    throw new RangeError(
      `Cannot open a stage with ${name} ${value}: expected a whole number ≥ ${min}`,
    );
  }
}

/**
 * The sizes a stage opens with, defaults filled in, after the checks both engines make before
 * they load anything: layers within the model's `nLayer`, whole sizes.
 */
export function checkOpenOptions(
  options: StageOpenOptions,
  nLayer: number,
): Omit<StageShape, "nLayer" | "nEmbd"> {
  const { first, end, slots, ctx } = options;
  if (!Number.isInteger(first) || !Number.isInteger(end) || first < 0 || first >= end) {
    throw new RangeError(`Cannot open layers ${first}..${end}: expected whole numbers first < end`);
  }
  if (end > nLayer) {
    throw new RangeError(
      `Cannot open layers ${first}..${end}: the model has ${nLayer} layers; check --layers`,
    );
  }
  const maxBatch = options.maxBatch ?? defaultMaxBatch(ctx);
  const snapshots = options.snapshots ?? 0;
  const maxRewind = options.maxRewind ?? 0;
  wholeAtLeast("slots", slots, 1);
  wholeAtLeast("ctx", ctx, 1);
  wholeAtLeast("maxBatch", maxBatch, 1);
  wholeAtLeast("snapshots", snapshots, 0);
  wholeAtLeast("maxRewind", maxRewind, 0);
  if (maxRewind > maxBatch) {
    throw new RangeError(
      `Cannot open a stage with maxRewind ${maxRewind}: a rewindable run is one run, at most maxBatch (${maxBatch}) positions`,
    );
  }
  return { first, end, slots, ctx, maxBatch, snapshots, maxRewind };
}

/** Throws once the stage is closed. */
export function checkOpen(stage: Pick<Stage, "first" | "end">, closed: boolean): void {
  if (closed) {
    throw new TypeError(`Cannot use stage ${stage.first}..${stage.end}: it is closed`);
  }
}

export function checkSlot(stage: Pick<Stage, "slots">, slot: number): void {
  if (!Number.isInteger(slot) || slot < 0 || slot >= stage.slots) {
    throw new RangeError(
      `Cannot use slot ${slot}: this stage has ${stage.slots} slots (0..${stage.slots - 1})`,
    );
  }
}

/** `count` is the number of snapshot places the stage was opened with. */
export function checkSnapshot(idx: number, count: number): void {
  if (!Number.isInteger(idx) || idx < 0 || idx >= count) {
    throw new RangeError(
      `Cannot use snapshot ${idx}: this stage has ${count} snapshot places; open it with more snapshots`,
    );
  }
}

/**
 * Checks a run of positions [base, base+n) on `slot`, which has seen `pos` positions, and its
 * input: token ids (below `vocab`) on the first stage, n·nEmbd hidden values after it.
 */
export function checkRun(
  stage: Pick<Stage, "first" | "end" | "nEmbd" | "ctx" | "maxBatch">,
  slot: number,
  input: StageInput,
  n: number,
  base: number,
  pos: number,
  vocab: number,
): void {
  if (!Number.isInteger(n) || n < 1 || n > stage.maxBatch) {
    throw new RangeError(
      `Cannot run ${n} positions at once: this stage takes 1..${stage.maxBatch}; split the prefill into chunks`,
    );
  }
  if (!Number.isInteger(base) || base < 0 || (base !== 0 && base !== pos)) {
    throw new RangeError(
      `Cannot run slot ${slot} from position ${base}: the slot is at position ${pos}; continue from ${pos} or restart at 0`,
    );
  }
  if (base + n > stage.ctx) {
    throw new RangeError(
      `Cannot run positions ${base}..${
        base + n
      } of slot ${slot}: the context holds ${stage.ctx} positions`,
    );
  }
  if (stage.first === 0) {
    if (input.kind !== "ids") {
      throw new TypeError(
        `Cannot run the first stage on hidden rows: it embeds token ids; pass { kind: "ids" }`,
      );
    }
    checkTokenIds(input.ids, n, vocab);
    return;
  }
  if (input.kind !== "hidden") {
    throw new TypeError(
      `Cannot run stage ${stage.first}..${stage.end} on token ids: it continues hidden rows; pass { kind: "hidden" }`,
    );
  }
  const D = stage.nEmbd;
  if (input.rows.length !== n * D) {
    throw new RangeError(
      `Cannot run ${n} positions on ${input.rows.length} hidden values: expected ${n}·${D}`,
    );
  }
  if (input.ids) checkTokenIds(input.ids, n, vocab);
}

/** A run's token ids: one a position, each in the vocabulary. */
function checkTokenIds(ids: Uint32Array, n: number, vocab: number): void {
  if (ids.length !== n) {
    throw new RangeError(`Cannot run ${n} positions on ${ids.length} token ids`);
  }
  for (const id of ids) {
    if (id >= vocab) {
      throw new RangeError(`Cannot embed token id ${id}: the vocabulary has ${vocab} tokens`);
    }
  }
}

/**
 * Whether a stage that runs the model's MTP block runs it over a run of `input` with `options`:
 * unless the run says `mtp: false`, or, after the first stage, comes without its rows' token ids
 * (the block embeds them; a chain's head sends none for a run it will not draft after).
 */
export function runsMtp(input: StageInput, options: Pick<StageRunOptions, "mtp">): boolean {
  return options.mtp !== false && (input.kind === "ids" || input.ids !== undefined);
}

/**
 * Whether a slot's MTP cache has a gap after a run from `base` that did or did not run the block
 * (`ran`): a skipped run opens one, and only a run from position 0 (a fresh sequence) closes it.
 */
export function mtpGapAfter(gap: boolean, base: number, ran: boolean): boolean {
  return (base > 0 && gap) || !ran;
}

/** Checks Stage.draft's arguments: `k` a whole number ≥ 0, `id` a token of the vocabulary. */
export function checkDraft(id: number, k: number, vocab: number): void {
  if (!Number.isInteger(k) || k < 0) {
    throw new RangeError(`Cannot draft ${k} tokens: expected a whole number ≥ 0`);
  }
  if (!Number.isInteger(id) || id < 0 || id >= vocab) {
    throw new RangeError(`Cannot draft after token id ${id}: the vocabulary has ${vocab} tokens`);
  }
}

/** Checks a run's top-k count: 0..MAX_TOPK. */
export function checkTopK(topk: number): void {
  if (!Number.isInteger(topk) || topk < 0 || topk > MAX_TOPK) {
    throw new RangeError(`Cannot return the top ${topk} logits: expected 0..${MAX_TOPK}`);
  }
}

/**
 * Checks a run's `logits` (one of LOGIT_POSITIONS) against what else it asks of the last
 * position: "none" computes no logits, so it takes no top-k and no adjustments. Returns it,
 * "all" when unset.
 */
export function checkLogits(options: StageRunOptions): LogitPositions {
  const logits = options.logits ?? "all";
  if (!LOGIT_POSITIONS.includes(logits)) {
    throw new RangeError(
      `Cannot compute logits for positions ${JSON.stringify(logits)}: expected one of ` +
        LOGIT_POSITIONS.map((p) => `"${p}"`).join(", "),
    );
  }
  if (logits === "none" && ((options.topk ?? 0) > 0 || options.adjust)) {
    throw new RangeError(
      `Cannot return top-k candidates or adjust logits of a run with logits "none": it computes ` +
        `no logits; ask for "last"`,
    );
  }
  return logits;
}

/** The run's row kind (engine/stage.ts RowKind), checked, or the default for n rows. */
export function checkRows(options: StageRunOptions, n: number): RowKind {
  const rows = options.rows ?? defaultRows(n);
  if (!ROW_KINDS.includes(rows)) {
    throw new RangeError(
      `Cannot run rows of kind ${JSON.stringify(rows)}: expected one of ` +
        ROW_KINDS.map((k) => `"${k}"`).join(", "),
    );
  }
  return rows;
}

/**
 * Checks logit adjustments against a vocabulary of `vocab` tokens: the mask fits it and allows
 * at least one token, bias ids are in range and distinct, bias and subtract within ±MAX_BIAS (a
 * bias demotes, never masks), repeat within MAX_REPEAT of 1.
 */
export function checkAdjust(adjust: LogitAdjust | undefined, vocab: number): void {
  if (!adjust) return;
  const { mask, bias } = adjust;
  if (mask) {
    const words = Math.ceil(vocab / 32);
    if (mask.length === 0 || mask.length > Math.min(words, MAX_MASK_WORDS)) {
      throw new RangeError(
        `Cannot apply a token mask of ${mask.length} words: the vocabulary of ${vocab} tokens ` +
          `takes 1..${words}`,
      );
    }
    let allowed = false;
    for (let w = 0; w < mask.length && !allowed; w++) {
      const bits = w === words - 1 && vocab % 32 ? mask[w] & ((1 << (vocab % 32)) - 1) : mask[w];
      allowed = bits !== 0;
    }
    if (!allowed) throw new RangeError("Cannot apply a token mask that allows no token");
  }
  if (bias) {
    if (bias.length > MAX_BIAS_PAIRS) {
      throw new RangeError(
        `Cannot add ${bias.length} logit biases: at most ${MAX_BIAS_PAIRS} per run`,
      );
    }
    const seen = new Set<number>();
    for (const { id, bias: b, repeat = 1, subtract = 0 } of bias) {
      if (!Number.isInteger(id) || id < 0 || id >= vocab || seen.has(id)) {
        throw new RangeError(
          `Cannot bias token ${id}: expected distinct ids in 0..${vocab - 1}`,
        );
      }
      if (!(Math.abs(b) <= MAX_BIAS) || !(Math.abs(subtract) <= MAX_BIAS)) {
        throw new RangeError(
          `Cannot bias token ${id} by ${b} and subtract ${subtract}: expected each in ` +
            `-${MAX_BIAS}..${MAX_BIAS}`,
        );
      }
      if (!(repeat >= 1 / MAX_REPEAT && repeat <= MAX_REPEAT)) {
        throw new RangeError(
          `Cannot penalise token ${id} by repeat ${repeat}: expected ${
            1 / MAX_REPEAT
          }..${MAX_REPEAT}`,
        );
      }
      seen.add(id);
    }
  }
}

/** The stage that embeds token ids (the head's, or generate's) starts at layer 0. */
export function checkFirstStage(stage: Pick<Stage, "first" | "end">): void {
  if (stage.first !== 0) {
    throw new RangeError(
      `Cannot embed tokens on layers ${stage.first}..${stage.end}: the first stage embeds token ` +
        `ids, so its layers start at 0; use --layers 0:${stage.end}`,
    );
  }
}

/**
 * Checks one link of a chain: without a next stage, `stage` must own the last layer; with one,
 * something must be left for it and it must start where `stage` ends. Head, generate, scheduler
 * and workers all check their chain here.
 */
export function checkChainLink(
  stage: Pick<Stage, "first" | "end" | "nLayer">,
  next: { readonly first: number } | undefined,
): void {
  const { first, end, nLayer } = stage;
  if (!next && end !== nLayer) {
    throw new RangeError(
      `Cannot serve layers ${first}..${end}: the model has ${nLayer} layers and no next stage ` +
        `is given; pass --next host:port for the worker of layers ${end}..${nLayer}`,
    );
  }
  if (next && end >= nLayer) {
    throw new RangeError(
      `Cannot chain layers ${first}..${end} to a next stage: the model has ${nLayer} layers, so ` +
        `nothing is left for it; end this stage before layer ${nLayer} (--layers ${first}:k)`,
    );
  }
  if (next && next.first !== end) {
    throw new RangeError(
      `Cannot chain layers ${first}..${end} to a next stage starting at layer ${next.first}; ` +
        `the next stage must start at layer ${end}`,
    );
  }
}

/** Checks a run's `rewindable` against the stage's maxRewind; returns it, false when unset. */
export function checkRewindable(
  stage: Pick<Stage, "first" | "end" | "maxRewind">,
  options: StageRunOptions,
  n: number,
): boolean {
  const rewindable = options.rewindable ?? false;
  if (rewindable && n > stage.maxRewind) {
    throw new RangeError(
      `Cannot keep ${n} positions to rewind on stage ${stage.first}..${stage.end}: it keeps at most ${stage.maxRewind}; ` +
        "open it with a larger maxRewind or verify fewer drafts a run",
    );
  }
  return rewindable;
}

/** A slot's last run, where it was rewindable: the positions `rewind` may go back into. */
export interface RewindSpan {
  readonly base: number;
  readonly n: number;
}

/**
 * Checks rewind(slot, pos) against the slot's last run (`span`, undefined unless that run was
 * rewindable and nothing has run or restored the slot since): base < pos ≤ base + n.
 */
export function checkRewind(slot: number, pos: number, span: RewindSpan | undefined): void {
  if (!span) {
    throw new RangeError(
      `Cannot rewind slot ${slot}: its last run kept no trail; run it with rewindable: true first`,
    );
  }
  if (!Number.isInteger(pos) || pos <= span.base || pos > span.base + span.n) {
    throw new RangeError(
      `Cannot rewind slot ${slot} to position ${pos}: its last run covered ${span.base}..${
        span.base + span.n
      }, so it can go back to ${span.base + 1}..${span.base + span.n}`,
    );
  }
}

/**
 * Checks a run's `candidates` against what else it asks (StageRunOptions.candidates); returns
 * whether it wants every position's top-k (never with a top-k of 0).
 */
export function checkCandidates(options: StageRunOptions, n: number): boolean {
  const candidates = options.candidates ?? "last";
  if (candidates !== "last" && candidates !== "every") {
    throw new RangeError(
      `Cannot return candidates ${JSON.stringify(candidates)}: expected "last" or "every"`,
    );
  }
  if (candidates === "last") return false;
  const k = options.topk ?? 0;
  if ((options.logits ?? "all") !== "all" || options.adjust) {
    throw new RangeError(
      'Cannot return every position\'s candidates of a run with logits other than "all" or with ' +
        "adjustments: they apply to the last position alone",
    );
  }
  if (n * (2 * k + 1) > 2 * MAX_TOPK + 1) {
    throw new RangeError(
      `Cannot return the top ${k} of each of ${n} positions: at most ${2 * MAX_TOPK + 1} words ` +
        "of candidates a run; ask for fewer",
    );
  }
  return k > 0;
}
