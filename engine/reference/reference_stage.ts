// The CPU reference Stage: layers [first, end) of one model, per-slot state and snapshots.
// Opened by engine/open_stage.ts for the "reference" backend; the oracle the GPU stage must match.

import type { GgufModel } from "../gguf/gguf_model.ts";
import { hasMtpBlock } from "../gguf/stage_shard.ts";
import { type HParams, modelHParams } from "../hparams.ts";
import type {
  Stage,
  StageInput,
  StageOpenOptions,
  StageOutput,
  StageRunOptions,
  TopEntry,
} from "../stage.ts";
import { greedyCount } from "../stage.ts";
import {
  checkAdjust,
  checkCandidates,
  checkDraft,
  checkLogits,
  checkOpen,
  checkOpenOptions,
  checkRewind,
  checkRewindable,
  checkRun,
  checkSlot,
  checkSnapshot,
  checkTopK,
  mtpGapAfter,
  type RewindSpan,
  runsMtp,
} from "../stage_checks.ts";
import {
  forwardLayer,
  type LayerState,
  lmHead,
  mtpStep,
  newLayerState,
} from "./reference_forward.ts";
import { argmaxTopK, biasLogits, logSumExp, maskLogits } from "./logits.ts";
import {
  type Embedding,
  type HeadWeights,
  type LayerWeights,
  loadEmbedding,
  loadHead,
  loadLayer,
  loadMtp,
  type MtpWeights,
} from "./reference_weights.ts";
import { matVec } from "./math.ts";
import { rmsNorm } from "./norms.ts";

/** One sequence's state: its position and one LayerState per owned layer. */
interface SlotState {
  pos: number;
  readonly layers: readonly LayerState[];
  /** Some position of the state skipped the MTP block (StageRunOptions.mtp false). */
  mtpGap: boolean;
}

/**
 * A rewindable run's trail: its positions, and per owned layer (undefined for attention, whose
 * KV past a position is simply overwritten) the DeltaNet state after each of them.
 */
interface Trail extends RewindSpan {
  readonly after: readonly (DeltaNetAfter[] | undefined)[];
}

/**
 * A slot's MTP state: the block's KV cache, and the output-normed hidden rows of the slot's last
 * run (from position `base`), which the block reads one position late.
 */
interface SlotMtp {
  readonly state: LayerState;
  hidden: Float64Array[];
  base: number;
}

/** A DeltaNet layer's state after one position. */
interface DeltaNetAfter {
  readonly conv: Float64Array;
  readonly ssm: Float64Array;
}

/** Copies `from` into `to` (same layer kinds); KV only up to `pos` positions of `kvRow`. */
function copyLayers(
  from: readonly LayerState[],
  to: readonly LayerState[],
  pos: number,
  kvRow: number,
): void {
  from.forEach((f, i) => {
    const t = to[i];
    if (f.kind === "attention" && t.kind === "attention") {
      t.k.set(f.k.subarray(0, pos * kvRow));
      t.v.set(f.v.subarray(0, pos * kvRow));
    } else if (f.kind === "deltanet" && t.kind === "deltanet") {
      t.conv.set(f.conv);
      t.ssm.set(f.ssm);
    }
  });
}

/**
 * How long one call may hold the thread before it lets timers and I/O run, ms: a prefill chunk
 * takes seconds on the CPU, and meanwhile a worker must still tell its client it is alive
 * (lib/wire/liveness.ts) and a head must still serve HTTP.
 */
const HOLD_MS = 50;

/** Resolves on a later turn of the event loop, after the timers and I/O that are due. */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/** A Stage on the CPU; also computes full logits per position for llama.cpp parity tests. */
export class ReferenceStage implements Stage {
  readonly nLayer: number;
  readonly nEmbd: number;
  #closed = false;
  readonly #hp: HParams;
  #layers: readonly LayerWeights[];
  #embedding: Embedding | undefined;
  #head: HeadWeights | undefined;
  #slots: readonly SlotState[];
  /** Snapshots hold the same state shapes; their KV is copied only up to their position. */
  #snapshots: (SlotState | undefined)[];
  /** Per slot, the trail of its last run when that run was rewindable. */
  readonly #trails: (Trail | undefined)[];
  #mtp: MtpWeights | undefined;
  readonly #slotMtp: SlotMtp[];
  /** Settles when every call made so far has (see #inOrder). */
  #queue: Promise<unknown> = Promise.resolve();
  /** When the running call last let the event loop turn. */
  #heldSince = 0;

  constructor(
    hp: HParams,
    readonly first: number,
    readonly end: number,
    readonly slots: number,
    readonly ctx: number,
    readonly maxBatch: number,
    readonly snapshots: number,
    readonly maxRewind: number,
    weights: {
      layers: readonly LayerWeights[];
      embedding?: Embedding;
      head?: HeadWeights;
      mtp?: MtpWeights;
    },
  ) {
    this.#hp = hp;
    this.nLayer = hp.nLayer;
    this.nEmbd = hp.D;
    this.#layers = weights.layers;
    this.#embedding = weights.embedding;
    this.#head = weights.head;
    this.#slots = Array.from({ length: slots }, () => this.#newSlot());
    this.#snapshots = new Array(snapshots).fill(undefined);
    this.#trails = new Array(slots).fill(undefined);
    this.#mtp = weights.mtp;
    if (weights.mtp) {
      this.draft = (slot, id, k) => this.#inOrder(() => this.#draft(slot, id, k));
    }
    this.#slotMtp = weights.mtp
      ? Array.from({ length: slots }, () => ({
        state: newLayerState(hp, hp.nLayer, ctx),
        hidden: [],
        base: 0,
      }))
      : [];
  }

  run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options: StageRunOptions = {},
  ): Promise<StageOutput> {
    return this.#inOrder(() => this.#run(slot, input, n, base, options));
  }

  async #run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options: StageRunOptions,
  ): Promise<StageOutput> {
    const topk = options.topk ?? 0;
    checkTopK(topk);
    const positions = checkLogits(options);
    if (this.#head) checkAdjust(options.adjust, this.#hp.V);
    const rewindable = checkRewindable(this, options, n);
    const every = checkCandidates(options, n);
    const rows = await this.#forward(slot, input, n, base, rewindable);
    const head = this.#head;
    if (!head) return { kind: "hidden", rows };
    if (this.#mtp) {
      const state = this.#slot(slot);
      const mtp = runsMtp(input, options);
      // A skipped run leaves a gap in the block's cache: no drafts until the slot restarts.
      state.mtpGap = mtpGapAfter(state.mtpGap, base, mtp);
      if (mtp && input.ids) await this.#runMtp(slot, input.ids, rows, base);
      else this.#slotMtp[slot].hidden = [];
    }
    const D = this.#hp.D;
    const count = greedyCount(positions, n);
    const ids = new Uint32Array(count);
    let top: TopEntry[] = [];
    let lse = NaN;
    const tops: TopEntry[][] = [];
    // Position t's greedy id lands in ids[t − from]: every position's, the last one's, or none.
    const from = n - count;
    for (let t = from; t < n; t++) {
      await this.#breathe();
      const logits = lmHead(this.#hp, head, rows.subarray(t * D, (t + 1) * D));
      if (t < n - 1) {
        const best = argmaxTopK(logits, every ? topk : 0);
        ids[t - from] = best.argmax;
        if (every) tops.push(best.top);
        continue;
      }
      // The normaliser is the model's (after biases); the mask only limits the candidates.
      const biased = biasLogits(logits, options.adjust?.bias);
      if (topk > 0) lse = logSumExp(biased);
      const best = argmaxTopK(maskLogits(biased, options.adjust?.mask), topk);
      ids[t - from] = best.argmax;
      top = best.top;
    }
    return { kind: "ids", ids, top, lse, ...(every ? { tops: [...tops, top] } : {}) };
  }

  /**
   * Like run on the last stage, but returns every position's logits (n·V, position-major, the
   * float64 logits rounded to f32): what the llama.cpp parity fixtures compare against.
   */
  logits(slot: number, input: StageInput, n: number, base: number): Promise<Float32Array> {
    return this.#inOrder(() => this.#logits(slot, input, n, base));
  }

  async #logits(slot: number, input: StageInput, n: number, base: number): Promise<Float32Array> {
    this.#slot(slot);
    const head = this.#head;
    if (!head) {
      throw new RangeError(
        `Cannot compute logits on stage ${this.first}..${this.end}: only the last stage (ending at ${this.nLayer}) has the LM head`,
      );
    }
    const rows = await this.#forward(slot, input, n, base);
    const { D, V } = this.#hp;
    const out = new Float32Array(n * V);
    for (let t = 0; t < n; t++) {
      await this.#breathe();
      out.set(lmHead(this.#hp, head, rows.subarray(t * D, (t + 1) * D)), t * V);
    }
    return out;
  }

  save(slot: number, idx: number): Promise<void> {
    return this.#inOrder(() => this.#save(slot, idx));
  }

  #save(slot: number, idx: number): void {
    const from = this.#slot(slot);
    checkSnapshot(idx, this.#snapshots.length);
    const to = this.#snapshots[idx] ??= this.#newSlot();
    copyLayers(from.layers, to.layers, from.pos, this.#kvRow());
    to.pos = from.pos;
    to.mtpGap = from.mtpGap;
  }

  restore(slot: number, idx: number): Promise<number> {
    return this.#inOrder(() => this.#restore(slot, idx));
  }

  #restore(slot: number, idx: number): number {
    const to = this.#slot(slot);
    checkSnapshot(idx, this.#snapshots.length);
    const from = this.#snapshots[idx];
    if (!from) {
      throw new RangeError(`Cannot restore snapshot ${idx}: nothing was saved there; save first`);
    }
    copyLayers(from.layers, to.layers, from.pos, this.#kvRow());
    to.pos = from.pos;
    to.mtpGap = from.mtpGap;
    this.#trails[slot] = undefined;
    // The MTP block's KV is not snapshotted: drafts wait for the next run's rows.
    if (this.#slotMtp[slot]) this.#slotMtp[slot].hidden = [];
    return to.pos;
  }

  /** Stage.draft, where the stage was opened with its model's MTP block. */
  readonly draft?: (slot: number, id: number, k: number) => Promise<Uint32Array>;

  /**
   * The MTP block over a run's positions (the whole model's stage): at each position p ≥ 1 it
   * reads the token there and the output-normed row at p − 1, which fills its KV cache at p − 1
   * as the run goes; the run's rows are kept for the next run and for draft.
   */
  async #runMtp(slot: number, ids: Uint32Array, rows: Float32Array, base: number) {
    const w = this.#mtp;
    if (!w) return;
    const { D, eps } = this.#hp;
    const m = this.#slotMtp[slot];
    const normed = Array.from(
      { length: ids.length },
      (_, t) => rmsNorm(rows.subarray(t * D, (t + 1) * D), this.#head!.norm, eps),
    );
    for (let t = 0; t < ids.length; t++) {
      await this.#breathe();
      const before = t > 0 ? normed[t - 1] : this.#hiddenAt(slot, base - 1);
      if (!before) continue;
      mtpStep(this.#hp, w, this.#embedding!.row(ids[t]), before, m.state, base + t - 1);
    }
    m.hidden = normed;
    m.base = base;
  }

  /** The output-normed row the slot's last run left at position p, if it has it. */
  #hiddenAt(slot: number, p: number): Float64Array | undefined {
    const m = this.#slotMtp[slot];
    return p >= m.base ? m.hidden[p - m.base] : undefined;
  }

  #draft(slot: number, id: number, k: number): Uint32Array {
    const state = this.#slot(slot);
    checkDraft(id, k, this.#hp.V);
    const w = this.#mtp!;
    const drafts = new Uint32Array(Math.max(0, Math.min(k, this.ctx - state.pos)));
    let hidden = this.#hiddenAt(slot, state.pos - 1);
    if (!hidden || state.mtpGap) return new Uint32Array();
    let token = id;
    for (let i = 0; i < drafts.length; i++) {
      hidden = mtpStep(
        this.#hp,
        w,
        this.#embedding!.row(token),
        hidden,
        this.#slotMtp[slot].state,
        state.pos + i - 1,
      );
      token = argmaxTopK(matVec(this.#head!.output, hidden), 0).argmax;
      drafts[i] = token;
    }
    return drafts;
  }

  rewind(slot: number, pos: number): Promise<void> {
    return this.#inOrder(() => this.#rewind(slot, pos));
  }

  #rewind(slot: number, pos: number): void {
    const state = this.#slot(slot);
    const trail = this.#trails[slot];
    checkRewind(slot, pos, trail);
    trail!.after.forEach((after, i) => {
      const l = state.layers[i];
      if (after && l.kind === "deltanet") {
        l.conv.set(after[pos - trail!.base - 1].conv);
        l.ssm.set(after[pos - trail!.base - 1].ssm);
      }
    });
    state.pos = pos;
  }

  /** Drops weights and state so their memory can go; later calls throw. */
  close(): void {
    this.#closed = true;
    this.#layers = [];
    this.#slots = [];
    this.#snapshots = [];
    this.#embedding = undefined;
    this.#head = undefined;
  }

  #newSlot(): SlotState {
    const layers = [];
    for (let il = this.first; il < this.end; il++) {
      layers.push(newLayerState(this.#hp, il, this.ctx));
    }
    return { pos: 0, layers, mtpGap: false };
  }

  #kvRow(): number {
    return this.#hp.Hkv * this.#hp.Dh;
  }

  #slot(slot: number): SlotState {
    checkOpen(this, this.#closed);
    checkSlot(this, slot);
    return this.#slots[slot];
  }

  /**
   * Runs `work` once every call before it has settled. A call lets the event loop turn midway
   * (#breathe), and a later one must not meanwhile read or change the state it works on: the
   * calls take effect in call order, as the GPU stage's queue does.
   */
  #inOrder<T>(work: () => T | Promise<T>): Promise<T> {
    const done = this.#queue.then(() => {
      this.#heldSince = performance.now();
      return work();
    });
    this.#queue = done.catch(() => undefined);
    return done;
  }

  /**
   * Lets the event loop turn once the running call has held it for HOLD_MS; throws if the stage
   * was closed meanwhile.
   */
  async #breathe(): Promise<void> {
    if (performance.now() - this.#heldSince < HOLD_MS) return;
    await nextTurn();
    this.#heldSince = performance.now();
    checkOpen(this, this.#closed);
  }

  /**
   * Checks the request, then runs positions [base, base+n) through the owned layers, keeping
   * each position's DeltaNet states when `rewindable`.
   */
  async #forward(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    rewindable = false,
  ): Promise<Float32Array> {
    const state = this.#slot(slot);
    const { D, V } = this.#hp;
    checkRun(this, slot, input, n, base, state.pos, V);
    const rows = new Float32Array(n * D);
    if (input.kind === "ids") {
      // checkRun takes ids only on the first stage, which is opened with the embedding.
      for (let t = 0; t < n; t++) rows.set(this.#embedding!.row(input.ids[t]), t * D);
    } else {
      rows.set(input.rows);
    }
    if (base === 0) {
      for (const l of state.layers) {
        if (l.kind === "deltanet") {
          l.conv.fill(0);
          l.ssm.fill(0);
        }
      }
    }
    this.#trails[slot] = undefined;
    const after = state.layers.map((l): Trail["after"][number] =>
      l.kind === "deltanet" && rewindable ? [] : undefined
    );
    for (let i = 0; i < this.#layers.length; i++) {
      const l = state.layers[i];
      for (let t = 0; t < n; t++) {
        await this.#breathe();
        const x = rows.subarray(t * D, (t + 1) * D);
        forwardLayer(this.#hp, this.#layers[i], l, x, base + t);
        if (l.kind === "deltanet") after[i]?.push({ conv: l.conv.slice(), ssm: l.ssm.slice() });
      }
    }
    state.pos = base + n;
    if (rewindable) this.#trails[slot] = { base, n, after };
    return rows;
  }
}

/**
 * Opens layers [first, end) of `model` on the CPU, plus token_embd when first is 0 and the LM
 * head when end is the layer count. The caller keeps ownership of `model` (close it after).
 */
export async function openReferenceStage(
  model: GgufModel,
  options: StageOpenOptions,
): Promise<ReferenceStage> {
  const hp = options.hp ?? modelHParams(model);
  const { first, end, slots, ctx, maxBatch, snapshots, maxRewind } = checkOpenOptions(
    options,
    hp.nLayer,
  );
  const layers = [];
  for (let il = first; il < end; il++) layers.push(await loadLayer(model, hp, il));
  // The MTP block drafts on the last stage, which then embeds the tokens its runs carry.
  const mtp = !!options.mtp && end === hp.nLayer && hasMtpBlock(model, hp.nLayer);
  return new ReferenceStage(hp, first, end, slots, ctx, maxBatch, snapshots, maxRewind, {
    layers,
    embedding: first === 0 || mtp ? await loadEmbedding(model, hp) : undefined,
    head: end === hp.nLayer ? await loadHead(model, hp) : undefined,
    mtp: mtp ? await loadMtp(model, hp) : undefined,
  });
}
