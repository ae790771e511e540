// The WebGPU Stage: layers [first, end) of one model on one device, with per-slot KV caches and
// DeltaNet states allocated once for the whole context, and numbered snapshots of them.
// Implements engine/stage.ts like engine/reference/reference_stage.ts; gpu_forward.ts records
// each step. One GpuMemory owns everything the stage allocates; close() frees it in one place.

import { formatBytes, GpuMemory, mapRead, writeBytes } from "./buffers.ts";
import type { GpuContext } from "./device.ts";
import {
  createStepTimer,
  type EncodedStep,
  ParamArena,
  StepEncoder,
  type StepTimer,
} from "./encoder.ts";
import { collectVariants, compileAhead, lateKernels, settleKernels } from "./kernel.ts";
import type { DispatchProfiler, ProfiledStep } from "./profiler.ts";
import type { GgufModel } from "../gguf/gguf_model.ts";
import { argmaxScratchWords } from "./kernels/argmax.ts";
import { attentionPartialFloats } from "./kernels/attention.ts";
import { gatherWords } from "./kernels/moe_gather.ts";
import { DENSE_TT, PREFILL_TT, PRODUCT_STEP_TOKENS } from "./kernels/mul_mat.ts";
import { MMA_X_VALUE_BYTES } from "./kernels/mul_mat_mma.ts";
import { sample } from "./kernels/sample.ts";
import { topKScratchWords, topKWords } from "./kernels/topk.ts";
import { SAMPLER_WORDS, samplerWords } from "../sampler.ts";
import { type HParams, readHParams } from "../hparams.ts";
import {
  BIAS_RECORD_BYTES,
  encodeBias,
  fusedManyMostSteps,
  type FusedOptions,
  type FusedSequence,
  greedyCount,
  type LastOutput,
  type LogitAdjust,
  type LogitPositions,
  MAX_BIAS_PAIRS,
  MAX_TOPK,
  type Stage,
  type StageInput,
  type StageOpenOptions,
  type StageOutput,
  type StageRunOptions,
  type TopEntry,
} from "../stage.ts";
import {
  checkAdjust,
  checkCandidates,
  checkDraft,
  checkLogits,
  checkOpen,
  checkOpenOptions,
  checkRewind,
  checkRewindable,
  checkRows,
  checkRun,
  checkSlot,
  checkSnapshot,
  checkTopK,
  mtpGapAfter,
  type RewindSpan,
  runsMtp,
} from "../stage_checks.ts";
import { loadStageWeights, type StageWeights } from "./gpu_weights.ts";
import { hasMtpBlock } from "../gguf/stage_shard.ts";
import { encodeMtpDrafts, encodeMtpPass, type MtpPlan, type MtpRun } from "./mtp_forward.ts";
import {
  type Activations,
  encodeHead,
  encodeLayers,
  type ForwardPlan,
  type GpuLayerState,
  type HeadAdjust,
  type HeadRow,
  SEQ_WORDS,
  stateStrides,
  type StepHead,
  type StepSeq,
} from "./gpu_forward.ts";

export interface GpuStageOptions extends StageOpenOptions {
  /** Largest weight part in bytes (default: the device's binding limit); tests force splits. */
  readonly maxPartBytes?: number;
  /** Start-up report lines (weights, memory); default stderr. */
  readonly log?: (line: string) => void;
  /** Called after every run with its timings (GPU time where the device has timestamp-query). */
  readonly profile?: (p: StepProfile) => void;
  /**
   * Times every dispatch of every run (bench/profile.ts): the stage collects each step's timings
   * before its outputs return (StepProfile.kernels), so shared steps of several slots are timed too.
   */
  readonly dispatchProfiler?: DispatchProfiler;
  /**
   * Runs of several slots share a step (default: where an awaited map costs less than
   * SHARE_MAX_MAP_FLOOR_MS, or from SHARE_MIN_SLOTS_SLOW_MAPS active slots).
   */
  readonly shareSteps?: boolean;
  /**
   * Where the device has no tensor cores, run prompt rows through their path anyway with the
   * matrix operations emulated in f32 code (tests of its numerics and invariance on any device;
   * slow). Default: TANDEM_MMA=emulate.
   */
  readonly emulateTensorCores?: boolean;
}

/** Where one run's time went. */
export interface StepProfile {
  readonly tokens: number;
  readonly dispatches: number;
  /** Validating, recording and submitting on the CPU. */
  readonly encodeMs: number;
  /** The part of encodeMs spent handing the recorded step to the provider and submitting it. */
  readonly submitMs: number;
  /** From submit until the outputs were read back. */
  readonly waitMs: number;
  /** GPU time from the first dispatch's start to the last one's end; undefined without timestamps. */
  readonly gpuMs?: number;
  /** Every dispatch's GPU interval, where the stage was opened with a dispatchProfiler. */
  readonly kernels?: ProfiledStep;
}

/** GPU bytes of a stage by part; `total` also counts readbacks and the params arena. */
export interface StageMemory {
  /** By kind of weight, as the loader counts them ("experts", "attention", "norms", ...). */
  readonly weights: ReadonlyMap<string, number>;
  /** KV caches and recurrent states of all slots. */
  readonly slotState: number;
  readonly snapshots: number;
  readonly activations: number;
  readonly total: number;
}

/** Bytes of logits one LM-head chunk may take. */
const LOGITS_BYTES = 64 * 1024 * 1024;

/**
 * Each activation buffer of a stage running T positions of up to `slots` runs at once: its label
 * and f32 count.
 */
export function activationFloats(
  hp: HParams,
  T: number,
  slots: number,
  shape: ActivationShape,
): Record<keyof Activations, readonly [string, number]> {
  const { lmChunk, attnPartFloats, mmaFloats, mtp } = shape;
  const { D, Hq, Hkv, Dh, C, Nv, Dv, E, Ku, Fe, Fs, F, V } = hp;
  // Runs a step may carry, each with its own adjustments and candidates.
  const runs = Math.min(slots, T);
  return {
    ids: ["ids", T + 1],
    // The MTP block's sequences follow the step's own.
    seqs: ["sequence table", SEQ_WORDS * runs * (mtp ? 2 : 1)],
    x: ["x", T * D],
    h: ["h", T * D],
    attn: ["attn qkv", T * (2 * Hq * Dh + 2 * Hkv * Dh)],
    o: ["mixer out", T * Math.max(Hq * Dh, Nv * Dv)],
    attnPart: ["attention partials", attnPartFloats],
    qkvzba: ["deltanet qkvzba", T * (C + Nv * Dv + 2 * Nv)],
    u: ["conv out", T * C],
    router: ["router logits", T * (E + 1)],
    route: ["expert ids", T * Ku],
    routeW: ["expert weights", T * (Ku + 1)],
    gather: ["expert gather table", gatherWords(T * Ku, E, PREFILL_TT)],
    gateUp: ["ffn gate|up", T * Math.max(Ku * 2 * Fe, 2 * F)],
    expertOut: ["expert out", T * Ku * D],
    sharedGateUp: ["shared gate|up", T * 2 * Fs],
    sharedOut: ["shared out", T * D],
    logits: ["logits", lmChunk * V],
    greedy: ["greedy ids", T],
    headRows: ["head rows", T],
    headX: ["head rows gathered", T * D],
    mask: ["token masks", runs * Math.ceil(V / 32)],
    bias: [
      "logit biases",
      BIAS_RECORD_BYTES / 4 * Math.min(runs * MAX_BIAS_PAIRS, STEP_BIAS_PAIRS),
    ],
    argmaxScratch: ["argmax scratch", argmaxScratchWords(lmChunk)],
    top: ["top-k", runs * topKWords(MAX_TOPK)],
    draws: ["sampler draws", runs * SAMPLER_WORDS + T],
    topScratch: ["top-k scratch", topKScratchWords(V, MAX_TOPK)],
    mmaX: ["tensor-core inputs", mmaFloats],
    mtpBefore: ["mtp hidden rows", mtp ? T * D : 1],
    mtpJoin: ["mtp joined rows", mtp ? 2 * T * D : 1],
  };
}

/** What a stage's activations follow from besides its positions per run and slots. */
export interface ActivationShape {
  /** LM-head rows per chunk. */
  readonly lmChunk: number;
  readonly attnPartFloats: number;
  readonly mmaFloats: number;
  /** The stage runs its model's MTP block. */
  readonly mtp: boolean;
}

/** The shapes a stage's activations follow from: positions per run, LM-head chunk, partials. */
export function activationShape(
  hp: HParams,
  span: { readonly first: number; readonly end: number },
  ctx: number,
  maxBatch: number,
  tensorCores = false,
  mtp = false,
  maxBindingBytes = Infinity,
): ActivationShape {
  // Where the logits budget splits a run, chunks of whole token tiles of the LM head's product:
  // a chunk of 67 positions would run a second tile of 3 over every row of the vocabulary.
  const fit = Math.max(1, Math.min(maxBatch, Math.floor(LOGITS_BYTES / (4 * hp.V))));
  const lmChunk = fit < maxBatch && fit > DENSE_TT ? fit - (fit % DENSE_TT) : fit;
  const attention = hp.isDeltaNet.slice(span.first, span.end).some((d) => !d) || mtp;
  const attnPartFloats = attention
    ? attentionPartialFloats({ hq: hp.Hq, dh: hp.Dh, ctx, maxBatch, maxBindingBytes })
    : 0;
  const mmaFloats = tensorCores ? mmaScratchFloats(hp, maxBatch) : 1;
  return { lmChunk, attnPartFloats, mmaFloats, mtp };
}

/**
 * f32s of the tensor-core products' input scratch for runs of T positions (mmaScratchBytes of
 * engine/gpu/kernels/mul_mat_mma.ts for the largest: T rows of the widest input, or the experts'
 * down over T·Ku rank rows), with its scales aligned to WebGPU's largest storage offset alignment.
 */
function mmaScratchFloats(hp: HParams, T: number): number {
  const bytes = (rows: number, k: number) =>
    Math.ceil((4 * rows) / 256) * 256 + MMA_X_VALUE_BYTES * rows * k;
  const widest = Math.max(hp.D, hp.Hq * hp.Dh, hp.Nv * hp.Dv, hp.F, hp.Fs);
  return Math.ceil(Math.max(bytes(T, widest), bytes(T * hp.Ku, hp.Fe)) / 4);
}

function allocActivations(
  mem: GpuMemory,
  floats: Record<keyof Activations, readonly [string, number]>,
): Activations {
  const entries = Object.entries(floats).map(([k, [label, n]]) => [k, mem.storage(label, 4 * n)]);
  return Object.fromEntries(entries) as Activations;
}

/** Bytes of layer il's two state buffers: conv and recurrent state, or K and V (f16). */
export function layerStateBytes(hp: HParams, il: number, positions: number): [number, number] {
  if (hp.isDeltaNet[il]) return [4 * (hp.Kc - 1) * hp.C, 4 * hp.Nv * hp.Dk * hp.Dv];
  const kv = 2 * positions * hp.Hkv * hp.Dh;
  return [kv, kv];
}

/**
 * The state of `count` slots (or snapshot places) for the owned layers: per layer, buffers that
 * each hold as many of them one after another as the device's binding limit allows (the same
 * number for every layer, so a slot has one index in all of its buffers), so that one dispatch
 * can run every sequence of a step. Returns each one's states.
 */
function allocStates(
  mem: GpuMemory,
  hp: HParams,
  span: { readonly first: number; readonly end: number },
  positions: number,
  count: number,
  label: string,
): GpuLayerState[][] {
  const limit = mem.ctx.limits.maxStorageBufferBindingSize;
  const layers = Array.from({ length: span.end - span.first }, (_, i) => span.first + i);
  const largest = Math.max(
    0,
    ...layers.map((il) => Math.max(...layerStateBytes(hp, il, positions))),
  );
  if (largest > limit) {
    throw new RangeError(
      `Cannot allocate the KV cache for ${positions} positions: ${largest} bytes per K or V of a layer exceed the device's binding limit ${limit}; use a smaller --ctx`,
    );
  }
  const per = Math.max(1, Math.min(count, Math.floor(limit / Math.max(1, largest))));
  const sets: GpuLayerState[][] = Array.from({ length: count }, () => []);
  for (let g0 = 0; g0 < count; g0 += per) {
    const n = Math.min(per, count - g0);
    const name = n === 1 ? `${label} ${g0}` : `${label}s ${g0}..${g0 + n - 1}`;
    for (const il of layers) {
      const [a, b] = layerStateBytes(hp, il, positions);
      const state = hp.isDeltaNet[il]
        ? {
          kind: "deltanet" as const,
          conv: mem.storage(`${name} conv ${il}`, a * n),
          ssm: mem.storage(`${name} ssm ${il}`, b * n),
        }
        : {
          kind: "attention" as const,
          kc: mem.storage(`${name} k ${il}`, a * n),
          vc: mem.storage(`${name} v ${il}`, b * n),
        };
      for (let i = 0; i < n; i++) sets[g0 + i].push({ ...state, index: i });
    }
  }
  return sets;
}

/**
 * The slots' states with a trail each for rewinds of up to `maxRewind` positions (none for 0):
 * per DeltaNet layer, buffers holding as many slots' trails as the device's binding limit allows.
 */
function withTrails(
  mem: GpuMemory,
  hp: HParams,
  sets: GpuLayerState[][],
  maxRewind: number,
): GpuLayerState[][] {
  if (maxRewind === 0 || sets.length === 0) return sets;
  const convFloats = (hp.Kc - 1 + maxRewind) * hp.C;
  const ssmFloats = maxRewind * hp.Nv * hp.Dk * hp.Dv;
  const limit = mem.ctx.limits.maxStorageBufferBindingSize;
  if (4 * ssmFloats > limit) {
    throw new RangeError(
      `Cannot keep ${maxRewind} positions to rewind: ${
        4 * ssmFloats
      } bytes of DeltaNet states a layer exceed the device's binding limit ${limit}; verify fewer drafts a run`,
    );
  }
  const per = Math.max(1, Math.min(sets.length, Math.floor(limit / (4 * ssmFloats))));
  const out = sets.map((layers) => [...layers]);
  for (let g0 = 0; g0 < sets.length; g0 += per) {
    const n = Math.min(per, sets.length - g0);
    sets[0].forEach((state, i) => {
      if (state.kind !== "deltanet") return;
      const conv = mem.storage(`trails ${g0}.. conv ${i}`, 4 * convFloats * n);
      const ssm = mem.storage(`trails ${g0}.. ssm ${i}`, 4 * ssmFloats * n);
      for (let j = 0; j < n; j++) {
        const trail = { conv, convOffset: j * convFloats, ssm, ssmOffset: j * ssmFloats };
        out[g0 + j][i] = { ...(sets[g0 + j][i] as typeof state), trail };
      }
    });
  }
  return out;
}

/** The buffers holding `sets` (each once, trails included), and their bytes. */
function stateBytes(sets: readonly (readonly GpuLayerState[])[]): number {
  const buffers = new Set(
    sets.flat().flatMap((s) =>
      s.kind === "attention"
        ? [s.kc, s.vc]
        : [s.conv, s.ssm, ...(s.trail ? [s.trail.conv, s.trail.ssm] : [])]
    ),
  );
  return [...buffers].reduce((n, b) => n + b.size, 0);
}

/** What a step reads back: [buffer, byte offset, bytes], one after another. */
type Outputs = readonly (readonly [GPUBuffer, number, number])[];

/** A step encoded before it is submitted, and where its outputs land. */
interface Prepared {
  /** What the recording depended on besides the slot (runKey, fusedKey). */
  readonly key: string;
  readonly step: EncodedStep;
  /**
   * Undefined for a step that reads nothing back (decodeFused's steps before the last, a run
   * with logits "none" without a timer).
   */
  readonly readback: GPUBuffer | undefined;
  /** Bytes of the outputs; with a timer, its two timestamps follow at timeAt, up to total. */
  readonly bytes: number;
  readonly timeAt: number;
  readonly total: number;
  /** Validation errors of the encoding. */
  readonly encoded: Promise<GPUError | null>;
}

/**
 * A run's place in a step: its slot and positions, and what the last stage's head computes for
 * it (its top-k, which positions, and the sizes of its logit adjustments; all 0 or "none" on a
 * stage before the last, which computes no logits whatever it is asked).
 */
interface StepRun {
  readonly slot: number;
  readonly base: number;
  readonly n: number;
  /** The rows are a prompt's (engine/stage.ts RowKind). */
  readonly prompt: boolean;
  /** Keeps each position's DeltaNet state for a rewind (a rewindable run of n > 1). */
  readonly trail: boolean;
  readonly k: number;
  /** The top-k of every position, not only the last (StageRunOptions.candidates "every"). */
  readonly every: boolean;
  readonly logits: LogitPositions;
  /** Words of its mask and records of its biases. */
  readonly words: number;
  readonly pairs: number;
  /** Where the MTP block runs after the step: the store's row of the hidden state before it. */
  readonly before: number;
  /** The MTP block runs over the rows (StageRunOptions.mtp; false where the stage has none). */
  readonly mtp: boolean;
}

/** What a step's recording depends on besides its slots' state: its runs, in row order. */
function stepKey(runs: readonly StepRun[]): string {
  return runs.map((r) =>
    `${r.slot}@${r.base}+${r.n}${r.prompt ? "p" : ""}${r.trail ? "t" : ""} ${r.logits} ${r.k}${
      r.every ? "e" : ""
    } ${r.words} ${r.pairs} h${r.before}${r.mtp ? "" : " -mtp"}`
  ).join(" | ");
}

/**
 * What a submission runs: its slots, its tokens (rows) and, for errors, what that is (built only
 * when one is reported, not every step).
 */
interface Submission {
  readonly slots: readonly number[];
  readonly tokens: number;
  readonly what: () => string;
}

function submission(runs: readonly StepRun[]): Submission {
  return {
    slots: runs.map((r) => r.slot),
    tokens: runs.reduce((n, r) => n + r.n, 0),
    what: () =>
      runs.map((r) => `positions ${r.base}..${r.base + r.n} of slot ${r.slot}`).join(", "),
  };
}

/**
 * A run waiting to share a step with other slots' (GpuStage.run): several sequences at once read
 * each weight once a step instead of once each.
 */
interface Waiting extends StepRun {
  readonly rewindable: boolean;
  readonly input: StageInput;
  readonly adjust: LogitAdjust | undefined;
  readonly started: number;
  readonly resolve: (out: StageOutput) => void;
  readonly reject: (e: unknown) => void;
}

/** A step's runs laid out: their rows, the head, what it reads back, and each run's output. */
interface StepLayout {
  readonly seqs: readonly StepSeq[];
  readonly head: StepHead | undefined;
  readonly outputs: Outputs;
  readonly read: (data: ArrayBuffer) => StageOutput[];
}

/**
 * How long a slot that ran recently counts as active (its next run is expected), and how long,
 * once none of this stage's steps is on the GPU, waiting runs wait for the active slots that have
 * not joined them before their step goes without them (those are then taken as idle until they
 * run again).
 */
const ACTIVE_MS = 200;
const WAIT_MS = 5;
/**
 * Where every awaited map costs ≥ 11 ms (Deno's builtin provider), two slots' own steps run side
 * by side, each one's map overlapping the other's, and beat one shared step: on the H200 two
 * sequences ran 102 tok/s apart (e8cbdcd) and 91 shared (e8ec441), through the split 63.9 and
 * 49.8. From this many slots on, a shared step reads the weights once for all of them and wins
 * there too.
 */
const SHARE_MAX_MAP_FLOOR_MS = 1;
const SHARE_MIN_SLOTS_SLOW_MAPS = 3;
/** Bias records one step may carry, over all its runs (each run's alone fits: MAX_BIAS_PAIRS). */
export const STEP_BIAS_PAIRS = 4 * MAX_BIAS_PAIRS;

/**
 * Step s of a decodeFused call: only its last step depends on steps and k (every step on k where
 * it samples), only its first on the MTP store's row before it.
 */
function fusedKey(f: FusedCall, s: number): string {
  const { base, steps, k, before, mtp, sampled, pairs } = f;
  const at = (s === 0 ? ` h${before}` : "") + (mtp ? "" : " -mtp") +
    (sampled ? ` sampled ${k}` : "") + (pairs ? ` b${pairs}` : "");
  const pos = base + s;
  return s === steps - 1 ? `fused ${pos} ${s} last ${steps} ${k}${at}` : `fused ${pos} ${s}${at}`;
}

/** A decodeFused call's steps: what each step's recording depends on. */
interface FusedCall {
  readonly slot: number;
  readonly base: number;
  readonly steps: number;
  readonly k: number;
  readonly before: number;
  readonly mtp: boolean;
  readonly sampled: boolean;
  /** Bias records every step applies (act.bias from 0). */
  readonly pairs: number;
}

/** A decodeFusedMany call: row r of each step is rows[r]. */
interface FusedManyCall {
  readonly rows: readonly FusedRow[];
  readonly steps: number;
  /** The call's top-k: the largest of its rows' (each row's own k are its first entries). */
  readonly k: number;
  /** Words of act.draws a row takes (its sampler constants, then a draw a step). */
  readonly drawWords: number;
}

/** One sequence of a decodeFusedMany call, checked. */
interface FusedRow {
  readonly slot: number;
  readonly base: number;
  readonly k: number;
  readonly sampled: boolean;
  /** Its bias records' place in act.bias, where it has any. */
  readonly adjust: HeadAdjust | undefined;
}

/** The top-k pairs of a readback's words from `at`, and the log-sum-exp after `stride` pairs. */
function readTop(data: ArrayBuffer, at: number, k: number, stride: number): Candidates {
  const words = new Uint32Array(data, 4 * at, 2 * stride + 1);
  const floats = new Float32Array(data, 4 * at, 2 * stride + 1);
  const top: TopEntry[] = [];
  for (let i = 0; i < k; i++) {
    const id = words[2 * i + 1];
    if (id !== 0xffffffff) top.push({ id, logit: floats[2 * i] });
  }
  return { top, lse: floats[2 * stride] };
}

type Candidates = Pick<LastOutput, "top" | "lse">;
const NO_CANDIDATES: Candidates = { top: [], lse: NaN };
const ALL_MARKS = { start: true, end: true } as const;

/** A Stage on the GPU, plus greedy multi-token decoding where it owns the whole model. */
export class GpuStage implements Stage {
  readonly nLayer: number;
  readonly nEmbd: number;
  readonly #gpu: GpuContext;
  readonly #memory: GpuMemory;
  readonly #hp: HParams;
  readonly #plan: ForwardPlan;
  readonly #arena: ParamArena;
  /** Slots 0..slots−1, then snapshot places. */
  readonly #sets: readonly GpuLayerState[][];
  /** Positions seen per slot; per snapshot the saved position, or −1 when empty. */
  readonly #pos: number[];
  /** Per slot, its last run's positions when that run was rewindable (engine/stage.ts rewind). */
  readonly #spans: (RewindSpan | undefined)[];
  /** The MTP block, where the stage runs it (opened with `mtp`, whole model, file has one). */
  readonly #mtp: MtpPlan | undefined;
  /** Per slot, the positions whose hidden rows the MTP store keeps (from the slot's row 0). */
  readonly #kept: (RewindSpan | undefined)[];
  /**
   * Per slot and snapshot: some position of its state skipped the MTP block (a run with
   * StageRunOptions.mtp false), so its drafts are off until the slot starts again at 0.
   */
  readonly #mtpGap: boolean[];
  readonly #readbacks: GPUBuffer[] = [];
  /** Per slot, its next step encoded while the GPU ran the one before (#encodeAhead). */
  readonly #aheadBySlot = new Map<number, Prepared>();
  readonly #profile: ((p: StepProfile) => void) | undefined;
  readonly #log: (line: string) => void;
  /** Kernel variants built outside a recording when last looked (lateKernels). */
  #lateSeen: number;
  readonly #timer: StepTimer | undefined;
  readonly #dispatchProfiler: DispatchProfiler | undefined;
  /**
   * From how many active slots on runs of several slots share steps (GpuStageOptions.shareSteps):
   * 2 where maps are cheap or sharing is asked for, SHARE_MIN_SLOTS_SLOW_MAPS where they are
   * not, never (Infinity) with one slot or when asked not to.
   */
  readonly #shareFrom: number;
  /** The last wait (ms from submit to outputs back) per slot and shape of submission. */
  readonly #waits = new Map<string, number>();
  /** Runs not yet submitted, in call order (run, #flush). */
  #waiting: Waiting[] = [];
  #flushTimer: ReturnType<typeof setTimeout> | undefined;
  #flushQueued = false;
  /** The next step of the last shared step, encoded while the GPU ran it. */
  #aheadBatch: Prepared | undefined;
  /** Slots with a step on the GPU. */
  readonly #inFlight = new Set<number>();
  /** When each slot's last run came back (slots that decode greedily on the GPU alone: absent). */
  readonly #active = new Map<number, number>();
  #closed = false;

  constructor(
    memory: GpuMemory,
    arena: ParamArena,
    hp: HParams,
    plan: ForwardPlan,
    sets: GpuLayerState[][],
    readonly first: number,
    readonly end: number,
    readonly slots: number,
    readonly ctx: number,
    readonly maxBatch: number,
    readonly maxRewind: number,
    timing: Pick<GpuStageOptions, "profile" | "dispatchProfiler" | "shareSteps" | "log">,
    mtp?: MtpPlan,
  ) {
    this.#gpu = memory.ctx;
    this.#memory = memory;
    this.#profile = timing.profile;
    this.#log = timing.log ?? ((line: string) => console.error(line));
    this.#lateSeen = lateKernels(memory.ctx).length;
    this.#dispatchProfiler = timing.dispatchProfiler;
    this.#shareFrom = slots === 1 || timing.shareSteps === false
      ? Infinity
      : timing.shareSteps || memory.ctx.mapFloorMs < SHARE_MAX_MAP_FLOOR_MS
      ? 2
      : SHARE_MIN_SLOTS_SLOW_MAPS;
    this.#timer = timing.profile ? createStepTimer(memory) : undefined;
    this.#hp = hp;
    this.#plan = plan;
    this.#sets = sets;
    this.#arena = arena;
    this.#pos = sets.map((_, i) => (i < slots ? 0 : -1));
    this.#spans = new Array(slots).fill(undefined);
    this.#mtp = mtp;
    this.#kept = new Array(slots).fill(undefined);
    this.#mtpGap = sets.map(() => false);
    if (mtp) this.draft = (slot, id, k) => this.#draft(mtp, slot, id, k);
    this.nLayer = hp.nLayer;
    this.nEmbd = hp.D;
  }

  get #last(): boolean {
    return this.end === this.nLayer;
  }

  #checkSlot(slot: number): void {
    checkOpen(this, this.#closed);
    checkSlot(this, slot);
  }

  get snapshots(): number {
    return this.#sets.length - this.slots;
  }

  /** How prompt rows run their products: tensor cores ("hardware", "emulate") or not. */
  get tensorCores(): ForwardPlan["mma"] {
    return this.#plan.mma;
  }

  /** What this stage holds on the GPU now, by part (deno task plan predicts these). */
  get memory(): StageMemory {
    return {
      weights: this.#plan.weights.bytes,
      slotState: stateBytes(this.#sets.slice(0, this.slots)) + (this.#mtp?.store.size ?? 0),
      snapshots: stateBytes(this.#sets.slice(this.slots)),
      activations: Object.values(this.#plan.act).reduce((s, b) => s + b.size, 0),
      total: this.#memory.bytes,
    };
  }

  #snapshot(idx: number): number {
    checkSnapshot(idx, this.snapshots);
    return this.slots + idx;
  }

  #check(slot: number, input: StageInput, n: number, base: number): void {
    this.#checkSlot(slot);
    checkRun(this, slot, input, n, base, this.#pos[slot], this.#hp.V);
  }

  /**
   * A checked run is the slot's last: its positions are seen, a rewind may go into them, and the
   * MTP store keeps its last rows.
   */
  #advance(
    run: Pick<Waiting, "slot" | "base" | "n" | "mtp"> & { readonly rewindable: boolean },
  ): void {
    this.#pos[run.slot] = run.base + run.n;
    this.#spans[run.slot] = run.rewindable ? { base: run.base, n: run.n } : undefined;
    this.#keep(run.slot, run.base, run.n, run.mtp);
  }

  /**
   * The MTP store keeps the last of positions [base, base + n) of `slot`, where the block ran over
   * them; where it did not, the slot's drafts are off until it starts again at 0.
   */
  #keep(slot: number, base: number, n: number, mtp: boolean): void {
    if (!this.#mtp) return;
    this.#mtpGap[slot] = mtpGapAfter(this.#mtpGap[slot], base, mtp);
    const m = Math.min(n, this.#mtp.rows);
    this.#kept[slot] = mtp ? { base: base + n - m, n: m } : undefined;
  }

  /** Whether the MTP block runs over a run of `input` with `options` (StageRunOptions.mtp). */
  #runsMtp(input: StageInput, options: Pick<StageRunOptions, "mtp">): boolean {
    return this.#mtp !== undefined && runsMtp(input, options);
  }

  /**
   * The MTP store's row with the hidden state at base − 1 of `slot`, for a run from `base` (or a
   * draft there); −1 where it keeps none (no MTP block, position 0, after a restore).
   */
  #before(slot: number, base: number): number {
    const kept = this.#kept[slot];
    const p = base - 1;
    if (!this.#mtp || !kept || p < kept.base || p >= kept.base + kept.n) return -1;
    return slot * this.#mtp.rows + p - kept.base;
  }

  /** Writes a run's ids or hidden rows at row `row` of the step's input. */
  #write(input: StageInput, row: number): void {
    const act = this.#plan.act;
    if (input.kind === "hidden") writeBytes(this.#gpu, act.x, 4 * row * this.#hp.D, input.rows);
    // After the first stage only the MTP block reads the tokens (a middle stage passes them on).
    const ids = input.kind === "ids" || this.#mtp ? input.ids : undefined;
    if (ids) writeBytes(this.#gpu, act.ids, 4 * row, ids);
  }

  /**
   * A run joins the runs waiting for a step. The step goes once every active slot has joined
   * (they return together, so they come back together); while one of this stage's steps is on
   * the GPU its slots count as joining (their next runs come once it is back, and the GPU has
   * work meanwhile), else the step goes at the latest WAIT_MS after the GPU went idle. Runs
   * arriving in one turn of the event loop share a step.
   */
  #wait(w: Waiting): Promise<StageOutput> {
    if (this.#waiting.some((o) => o.slot === w.slot)) this.#flush();
    this.#check(w.slot, w.input, w.n, w.base);
    this.#advance(w);
    const out = new Promise<StageOutput>((resolve, reject) => {
      this.#waiting.push({ ...w, resolve, reject });
    });
    this.#schedule();
    return out;
  }

  /** Whether every active slot has a run waiting. */
  get #allJoined(): boolean {
    // Slots not back for ACTIVE_MS are taken as idle: not waited for, and not kept in #active.
    const now = performance.now();
    for (const [s, at] of [...this.#active]) {
      const here = this.#inFlight.has(s) || this.#waiting.some((w) => w.slot === s);
      if (!here && now - at >= ACTIVE_MS) this.#active.delete(s);
    }
    return [...this.#active.keys()].every((s) => this.#waiting.some((w) => w.slot === s));
  }

  /** Submits the waiting runs now, when all have joined, or arms the wait for the others. */
  #schedule(): void {
    if (this.#waiting.length === 0) return;
    if (this.#allJoined || this.#waiting.length === this.slots) {
      if (!this.#flushQueued) {
        this.#flushQueued = true;
        queueMicrotask(() => this.#flush());
      }
      return;
    }
    // A step on the GPU brings its slots back: wait for them (re-armed when it is back).
    if (this.#inFlight.size > 0 || this.#flushTimer !== undefined) return;
    this.#flushTimer = setTimeout(() => {
      this.#flushTimer = undefined;
      // The slots that did not come are idle until they run again.
      const came = new Set(this.#waiting.map((w) => w.slot));
      for (const s of [...this.#active.keys()]) {
        if (!came.has(s) && !this.#inFlight.has(s)) this.#active.delete(s);
      }
      this.#flush();
    }, WAIT_MS);
  }

  /**
   * Submits the waiting runs as steps: one-token runs first, then the others in call order, each
   * step as many as its rows (maxBatch) and its biases hold.
   */
  #flush(): void {
    this.#flushQueued = false;
    if (this.#flushTimer !== undefined) clearTimeout(this.#flushTimer);
    this.#flushTimer = undefined;
    const order = [
      ...this.#waiting.filter((w) => w.n === 1),
      ...this.#waiting.filter((w) => w.n !== 1),
    ];
    this.#waiting = [];
    while (order.length) {
      const runs: Waiting[] = [];
      let rows = 0;
      let pairs = 0;
      // With tensor cores a prompt's rows and generated tokens run different products: a step
      // takes one kind (either kind's bits are the same in any company).
      const kind = this.#plan.mma ? order[0].prompt : undefined;
      for (let i = 0; i < order.length;) {
        const w = order[i];
        const other = kind !== undefined && w.prompt !== kind;
        // Every position's candidates fill the candidate buffer by the step's largest top-k:
        // such a run goes alone.
        const crowded = runs.length > 0 && (w.every || runs[0].every);
        if (
          other || crowded || rows + w.n > this.maxBatch || pairs + w.pairs > STEP_BIAS_PAIRS
        ) {
          i++;
          continue;
        }
        runs.push(w);
        order.splice(i, 1);
        rows += w.n;
        pairs += w.pairs;
      }
      // One-token runs first (their layers take one dispatch for them all), then those with
      // candidates first (their head rows run together: one top-k dispatch for them all).
      const rank = (w: Waiting) => 2 * Number(w.n === 1) + Number(w.k > 0);
      runs.sort((a, b) => rank(b) - rank(a));
      const settle = (done: Promise<StageOutput[]>) =>
        done.then(
          (outs) =>
            runs.forEach((w, i) => {
              this.#active.set(w.slot, performance.now());
              w.resolve(outs[i]);
            }),
          (e) => runs.forEach((w) => w.reject(e)),
        );
      try {
        settle(runs.length === 1 ? this.#single(runs[0]).then((o) => [o]) : this.#batch(runs));
      } catch (e) {
        // Nothing was submitted: the slots stay where they were.
        for (const w of runs) {
          this.#pos[w.slot] = w.base;
          this.#spans[w.slot] = undefined;
          this.#kept[w.slot] = undefined;
          w.reject(e);
        }
      }
    }
  }

  /** A waiting run alone: the run it would have been. */
  #single(w: Waiting): Promise<StageOutput> {
    this.#write(w.input, 0);
    this.#uploadAdjusts([w]);
    return this.#submitRun(w, w.started).then((data) => this.#layout([w]).read(data)[0]);
  }

  /**
   * Submits a run of `run.n` positions whose input is written (its step encoded ahead if it
   * was), advances the slot, and encodes the next token's step ahead.
   */
  #submitRun(run: StepRun, started: number): Promise<ArrayBuffer> {
    const { slot, n, base } = run;
    const step = this.#ahead(slot, stepKey([run])) ?? this.#prepareStep([run]);
    const done = this.#submit(1, () => step, started, submission([run]));
    this.#pos[slot] = base + n;
    // The next token's step, encoded while the GPU runs this one: the id it embeds is written
    // before it is submitted, so only its position and what the head returns must match.
    if (n === 1 && base + 2 <= this.ctx) {
      const next = { ...run, base: base + 1, prompt: false, before: this.#before(slot, base + 1) };
      this.#encodeAhead(slot, () => this.#prepareStep([next]));
    }
    return done;
  }

  /** Waiting runs of several slots as one step (each run gets the bits it gets alone). */
  #batch(runs: readonly Waiting[]): Promise<StageOutput[]> {
    let row = 0;
    for (const w of runs) {
      this.#write(w.input, row);
      row += w.n;
    }
    this.#uploadAdjusts(runs);
    const key = stepKey(runs);
    const ahead = this.#aheadBatch;
    this.#aheadBatch = undefined;
    let step = ahead;
    if (ahead && (ahead.key !== key || ahead.step.stale)) {
      this.#drop(ahead);
      step = undefined;
    }
    step ??= this.#prepareStep(runs);
    const started = Math.min(...runs.map((w) => w.started));
    const done = this.#submit(1, () => step, started, submission(runs));
    // The next step as it comes if every run decodes one more token the same way.
    const next = runs.map((w): StepRun => ({
      ...w,
      base: w.base + w.n,
      n: 1,
      prompt: false,
      trail: false,
      every: false,
      before: this.#before(w.slot, w.base + w.n),
    }));
    if (next.every((w) => w.base + 1 <= this.ctx) && !this.#dispatchProfiler) {
      try {
        this.#aheadBatch = this.#prepareStep(next);
      } catch {
        // As #encodeAhead: the step that needs it encodes it again and fails there.
      }
    }
    const layout = this.#layout(runs);
    return done.then((data) => layout.read(data));
  }

  #takeReadback(bytes: number): GPUBuffer {
    const i = this.#readbacks.findIndex((b) => b.size >= bytes);
    if (i >= 0) return this.#readbacks.splice(i, 1)[0];
    return this.#memory.readback("stage output", Math.max(bytes, 256));
  }

  async run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options: StageRunOptions = {},
  ): Promise<StageOutput> {
    // Everything up to submit runs synchronously, so concurrent runs reach the queue in call order
    // (runs waiting to share a step are submitted first).
    const started = performance.now();
    const k = this.#topk(options);
    const logits = checkLogits(options);
    if (this.#last) checkAdjust(options.adjust, this.#hp.V);
    // A stage before the last computes no logits whatever it is asked.
    const adjust = this.#last ? options.adjust : undefined;
    const rewindable = checkRewindable(this, options, n);
    const every = checkCandidates(options, n);
    const run: StepRun & { rewindable: boolean } = {
      slot,
      base,
      n,
      prompt: checkRows(options, n) === "prompt",
      trail: rewindable && n > 1,
      rewindable,
      k: this.#last ? k : 0,
      every: this.#last && every && k > 0,
      logits: this.#last ? logits : "none",
      words: adjust?.mask?.length ?? 0,
      pairs: adjust?.bias?.length ?? 0,
      before: this.#before(slot, base),
      mtp: this.#runsMtp(input, options),
    };
    // Runs share steps once enough slots are active (on the GPU, waiting, or back from a run
    // not long ago); a slot running alone goes as it would without sharing, its submit not put
    // off to the end of the event loop's turn.
    const active = new Set([...this.#active.keys(), ...this.#inFlight, slot]);
    for (const w of this.#waiting) active.add(w.slot);
    const alone = this.#waiting.length === 0 && active.size === 1 && this.#active.has(slot);
    if (active.size >= this.#shareFrom || (this.#shareFrom === 2 && !alone)) {
      return this.#wait({ ...run, input, adjust, started, resolve: () => {}, reject: () => {} });
    }
    this.#flush();
    this.#check(slot, input, n, base);
    this.#advance(run);
    this.#write(input, 0);
    this.#uploadAdjusts([{ ...run, adjust }]);
    const data = await this.#submitRun(run, started);
    if (this.#shareFrom !== Infinity) this.#active.set(slot, performance.now());
    return this.#layout([run]).read(data)[0];
  }

  /**
   * Decoding of `steps` tokens, for a stage that owns the whole model: position base takes `id`,
   * and each step's next token (its argmax, or with `options.sampling` its draw from the step's
   * top-k: wgsl/sample.wgsl, the head's sampler's arithmetic) is embedded at the next position
   * without leaving the GPU. Each step is submitted as soon as it is encoded, so the GPU starts
   * on the first while the rest are encoded. Returns every step's token (what `steps`
   * single-token runs fed their own output, or the head's draws from their candidates, would
   * give) and the top-k of the last step.
   */
  async decodeFused(
    slot: number,
    id: number,
    base: number,
    steps: number,
    options: FusedOptions = {},
  ): Promise<LastOutput> {
    const started = performance.now();
    this.#checkFused("decodeFused");
    const k = this.#topk(options);
    if (!Number.isInteger(steps) || steps < 1 || steps > this.maxBatch || base + steps > this.ctx) {
      throw new RangeError(
        `Cannot decode ${steps} tokens from position ${base}: expected 1..${this.maxBatch} steps within the context of ${this.ctx}`,
      );
    }
    const sampling = options.sampling;
    if (sampling && (k < 1 || sampling.draws.length !== steps)) {
      throw new RangeError(
        `Cannot sample ${steps} steps from ${k} candidates with ${sampling.draws.length} draws: a sampled decodeFused needs topk ≥ 1 and a draw a step`,
      );
    }
    const constants = sampling && samplerWords(sampling.params, k);
    const bias = options.bias ?? [];
    checkAdjust({ bias }, this.#hp.V);
    this.#active.delete(slot);
    this.#flush();
    this.#check(slot, { kind: "ids", ids: Uint32Array.of(id) }, 1, base);
    this.#spans[slot] = undefined;
    this.#write({ kind: "ids", ids: Uint32Array.of(id) }, 0);
    if (constants) {
      const words = new Uint32Array(SAMPLER_WORDS + steps);
      words.set(constants);
      words.set(sampling.draws, SAMPLER_WORDS);
      writeBytes(this.#gpu, this.#plan.act.draws, 0, words);
    }
    if (bias.length) writeBytes(this.#gpu, this.#plan.act.bias, 0, encodeBias(bias));
    const sampled = constants !== undefined;
    const before = this.#before(slot, base);
    const mtp = this.#mtp !== undefined && options.mtp !== false;
    const pairs = bias.length;
    const fused = { slot, base, steps, k, before, mtp, sampled, pairs };
    const first = this.#ahead(slot, fusedKey(fused, 0));
    // Each step is submitted before the next is encoded.
    const prepare = (s: number) => (s === 0 ? first : undefined) ?? this.#prepareFused(fused, s);
    const run = {
      slot,
      base,
      n: steps,
      prompt: false,
      trail: false,
      k,
      every: false,
      logits: "all" as const,
      words: 0,
      pairs,
      before,
      mtp,
    };
    const done = this.#submit(steps, prepare, started, submission([run]));
    this.#pos[slot] = base + steps;
    this.#keep(slot, base + steps - 1, 1, mtp);
    // The next call's first step, for a caller that goes on decoding this sequence.
    if (base + steps + 2 <= this.ctx) {
      const next = {
        ...fused,
        base: base + steps,
        steps: 2,
        k: sampled ? k : 0,
        before: this.#before(slot, base + steps),
      };
      this.#encodeAhead(slot, () => this.#prepareFused(next, 0));
    }
    const data = await done;
    const ids = new Uint32Array(data, 0, steps).slice();
    return { ids, ...(k ? readTop(data, steps, k, k) : NO_CANDIDATES) };
  }

  /**
   * decodeFused for several slots at once (Stage.decodeFusedMany): every step one shared step of
   * the sequences' rows (row r is seqs[r]), each row's argmax or draw written to act.ids where the
   * next step embeds it; the last step reads back every step's ids and each row's top-k. The MTP
   * block does not run in it: on a stage that runs one, each sequence needs `mtp: false`.
   */
  async decodeFusedMany(
    seqs: readonly FusedSequence[],
    steps: number,
  ): Promise<LastOutput[]> {
    const started = performance.now();
    this.#checkFused("decodeFusedMany");
    const R = seqs.length;
    if (R < 1 || new Set(seqs.map((q) => q.slot)).size !== R) {
      throw new RangeError(
        `Cannot decode sequences on slots ${
          seqs.map((q) => q.slot).join(", ") || "(none)"
        } at once: expected one or more, each on a slot of its own`,
      );
    }
    // act.ids (maxBatch + 1 words) holds every step's R ids and the next step's; act.draws
    // (SAMPLER_WORDS a slot + maxBatch) each row's constants and draws, which fit wherever the
    // ids do.
    const { act } = this.#plan;
    const most = fusedManyMostSteps(this.maxBatch, R);
    if (!Number.isInteger(steps) || steps < 1 || steps > most) {
      throw new RangeError(
        `Cannot decode ${steps} steps of ${R} sequences at once: expected 1..${most} (maxBatch ${this.maxBatch}); take fewer steps a call`,
      );
    }
    const drawWords = SAMPLER_WORDS + steps;
    const draws = new Uint32Array(R * drawWords);
    let biasAt = 0;
    const rows = seqs.map((q, r): FusedRow => {
      const options = q.options ?? {};
      const k = this.#topk(options);
      const sampling = options.sampling;
      if (sampling && (k < 1 || sampling.draws.length !== steps)) {
        throw new RangeError(
          `Cannot sample ${steps} steps of slot ${q.slot} from ${k} candidates with ${sampling.draws.length} draws: a sampled sequence needs topk ≥ 1 and a draw a step`,
        );
      }
      if (this.#mtp && options.mtp !== false) {
        throw new RangeError(
          `Cannot run the MTP block for slot ${q.slot} in a fused call of several sequences: pass mtp: false, or decode it alone (decodeFused)`,
        );
      }
      const bias = options.bias ?? [];
      checkAdjust({ bias }, this.#hp.V);
      if (sampling) {
        draws.set(samplerWords(sampling.params, k), r * drawWords);
        draws.set(sampling.draws, r * drawWords + SAMPLER_WORDS);
      }
      const adjust = bias.length ? { maskAt: 0, words: 0, biasAt, pairs: bias.length } : undefined;
      biasAt += bias.length;
      return { slot: q.slot, base: q.base, k, sampled: sampling !== undefined, adjust };
    });
    if (BIAS_RECORD_BYTES * biasAt > act.bias.size) {
      throw new RangeError(
        `Cannot apply ${biasAt} logit-bias records in one step: it holds ${
          act.bias.size / BIAS_RECORD_BYTES
        }; decode fewer biased sequences at once`,
      );
    }
    this.#flush();
    for (const q of seqs) {
      this.#check(q.slot, { kind: "ids", ids: Uint32Array.of(q.id) }, 1, q.base);
    }
    for (const q of rows) {
      this.#active.delete(q.slot);
      this.#spans[q.slot] = undefined;
      // A step a decodeFused call encoded ahead for the slot is not this call's: let it go.
      this.#ahead(q.slot, "");
    }
    this.#write({ kind: "ids", ids: Uint32Array.from(seqs, (q) => q.id) }, 0);
    if (rows.some((q) => q.sampled)) writeBytes(this.#gpu, act.draws, 0, draws);
    // Each row's bias records where its adjust says (biasAt in row order, as a shared step's).
    this.#uploadAdjusts(seqs.map((q) => ({ adjust: { bias: q.options?.bias } })));
    const k = Math.max(...rows.map((q) => q.k));
    const call: FusedManyCall = { rows, steps, k, drawWords };
    const done = this.#submit(steps, (s) => this.#prepareFusedMany(call, s), started, {
      slots: rows.map((q) => q.slot),
      tokens: R,
      what: () =>
        rows.map((q) => `positions ${q.base}..${q.base + steps} of slot ${q.slot}`).join(", "),
    });
    for (const q of rows) {
      this.#pos[q.slot] = q.base + steps;
      this.#keep(q.slot, q.base + steps - 1, 1, false);
    }
    const data = await done;
    const ids = new Uint32Array(data, 0, steps * R);
    const stride = k ? topKWords(k) : 0;
    let top = 0;
    return rows.map((q, r) => ({
      ids: Uint32Array.from({ length: steps }, (_, s) => ids[s * R + r]),
      ...(q.k ? readTop(data, steps * R + stride * top++, q.k, k) : NO_CANDIDATES),
    }));
  }

  /**
   * Step s of decodeFusedMany: embeds act.ids[s·R + r] for row r at its position and writes its
   * argmax, or where it samples its draw s, to act.ids[(s + 1)·R + r]; a row's top-k is computed
   * where it samples and on the last step, which reads back every id and those top-k.
   */
  #prepareFusedMany(f: FusedManyCall, s: number): Prepared {
    const { rows, steps, k, drawWords } = f;
    const { act } = this.#plan;
    const R = rows.length;
    const last = s === steps - 1;
    const tops = rows.map((q) => q.k > 0 && (last || q.sampled));
    const count = tops.filter((t) => t).length;
    const words = k ? topKWords(k) : 0;
    const outputs: Outputs = last
      ? [[act.ids, 4 * R, 4 * steps * R], [act.top, 0, 4 * count * words]]
      : [];
    const seqs = rows.map((q, r) => ({
      states: this.#sets[q.slot],
      base: q.base + s,
      row: r,
      n: 1,
    }));
    const key = `fused many ${rows.map((q) => `${q.slot}@${q.base + s}`).join(",")} ${s}/${steps}`;
    return this.#prepare(key, seqs, outputs, { start: s === 0, end: last }, (enc) => {
      encodeLayers(enc, this.#plan, seqs, s * R);
      // Only the last step's log-sum-exp is read; a row's draw overwrites its argmax, which
      // stays the id where its top-k holds no candidate (as the head's sampler has it).
      encodeHead(enc, this.#plan, {
        rows: rows.map((q, r) => ({ row: r, top: tops[r], adjust: q.adjust })),
        topk: count ? k : 0,
        greedy: { buffer: act.ids, offset: (s + 1) * R },
        lse: last,
      });
      let top = 0;
      rows.forEach((q, r) => {
        if (!tops[r]) return;
        if (q.sampled) {
          sample(enc, { top: act.top, draws: act.draws, out: act.ids }, {
            topOffset: top * words,
            drawsOffset: r * drawWords,
            draw: s,
            outOffset: (s + 1) * R + r,
          });
        }
        top++;
      });
    });
  }

  /** A fused call (`what`) needs the whole model and no per-dispatch profiler. */
  #checkFused(what: string): void {
    if (this.first !== 0 || !this.#last) {
      throw new RangeError(
        `Cannot decode on the GPU alone with stage ${this.first}..${this.end}: it needs the whole model (0..${this.nLayer}); use run per token`,
      );
    }
    if (this.#dispatchProfiler) {
      throw new RangeError(
        `Cannot time every dispatch of ${what}: it submits one command buffer per step; profile single-token runs (bench/profile.ts)`,
      );
    }
  }

  #topk(options: Pick<StageRunOptions, "topk">): number {
    const topk = options.topk ?? 0;
    checkTopK(topk);
    return Math.min(topk, this.#hp.V);
  }

  /**
   * Writes the (checked) adjustments of a step's runs into act.mask and act.bias, one run's after
   * another's, where #layout places them.
   */
  #uploadAdjusts(runs: readonly { readonly adjust: LogitAdjust | undefined }[]): void {
    const { act } = this.#plan;
    let maskAt = 0;
    let biasAt = 0;
    for (const { adjust } of runs) {
      const mask = adjust?.mask;
      if (mask) writeBytes(this.#gpu, act.mask, 4 * maskAt, mask);
      const bias = adjust?.bias ?? [];
      if (bias.length) {
        writeBytes(this.#gpu, act.bias, BIAS_RECORD_BYTES * biasAt, encodeBias(bias));
      }
      maskAt += mask?.length ?? 0;
      biasAt += bias.length;
    }
  }

  /** A step encoder; a sequence from position 0 first zeroes its slot's DeltaNet states. */
  #begin(seqs: readonly StepSeq[]): StepEncoder {
    const enc = new StepEncoder(this.#gpu, this.#arena);
    const { strides } = this.#plan;
    for (const seq of seqs) {
      if (seq.base !== 0) continue;
      for (const s of seq.states) {
        if (s.kind === "deltanet") {
          enc.clear(s.conv, 4 * s.index * strides.conv, 4 * strides.conv);
          enc.clear(s.ssm, 4 * s.index * strides.ssm, 4 * strides.ssm);
        }
      }
    }
    return enc;
  }

  /**
   * Where a step's runs go: a run's rows one after another in its order; on the last stage its
   * head rows (those its `logits` asks for; its adjustments and top-k on its last position), its
   * greedy ids and its candidates in the readback, at the step's top-k (the largest of its runs',
   * whose first k entries are each run's own).
   */
  #layout(runs: readonly StepRun[]): StepLayout {
    const { act } = this.#plan;
    const D = this.#hp.D;
    let row = 0;
    const seqs = runs.map((r) => {
      const seq = { states: this.#sets[r.slot], base: r.base, row, n: r.n, trail: r.trail };
      row += r.n;
      return seq;
    });
    if (!this.#last) {
      return {
        seqs,
        head: undefined,
        outputs: [[act.x, 0, 4 * row * D]],
        read: (data) =>
          seqs.map((s) => ({
            kind: "hidden",
            rows: new Float32Array(data.slice(4 * s.row * D, 4 * (s.row + s.n) * D)),
          })),
      };
    }
    const topk = Math.max(0, ...runs.map((r) => r.k));
    const rows: HeadRow[] = [];
    let maskAt = 0;
    let biasAt = 0;
    let tops = 0;
    const places = runs.map((r, i) => {
      const count = greedyCount(r.logits, r.n);
      const first = rows.length;
      const top = count > 0 && r.k > 0 ? tops : -1;
      for (let t = r.n - count; t < r.n; t++) {
        const last = t === r.n - 1;
        const adjusted = last && (r.words > 0 || r.pairs > 0);
        const candidates = r.k > 0 && (last || r.every);
        if (candidates) tops++;
        rows.push({
          row: seqs[i].row + t,
          top: candidates,
          adjust: adjusted ? { maskAt, words: r.words, biasAt, pairs: r.pairs } : undefined,
        });
      }
      maskAt += r.words;
      biasAt += r.pairs;
      return { first, count, top };
    });
    const R = rows.length;
    const stride = topk ? topKWords(topk) : 0;
    return {
      seqs,
      head: R
        ? { rows, topk, greedy: { buffer: act.greedy, offset: 0 }, prompt: runs[0].prompt }
        : undefined,
      outputs: R ? [[act.greedy, 0, 4 * R], [act.top, 0, 4 * tops * stride]] : [],
      read: (data) =>
        runs.map((r, i) => {
          const p = places[i];
          const ids = new Uint32Array(data, 4 * p.first, p.count).slice();
          if (r.every) {
            const all = Array.from(
              { length: p.count },
              (_, t) => readTop(data, R + (p.top + t) * stride, r.k, topk),
            );
            return { kind: "ids", ids, ...all[p.count - 1], tops: all.map((c) => c.top) };
          }
          const top = p.top < 0 ? NO_CANDIDATES : readTop(data, R + p.top * stride, r.k, topk);
          return { kind: "ids", ids, ...top };
        }),
    };
  }

  /**
   * The step of `runs` (one after another, a slot each), encoded and not yet submitted; on the
   * last stage with the head #layout gives it (none: nothing to read back).
   */
  #prepareStep(runs: readonly StepRun[]): Prepared {
    const { seqs, head, outputs } = this.#layout(runs);
    return this.#prepare(stepKey(runs), seqs, outputs, ALL_MARKS, (enc) => {
      encodeLayers(enc, this.#plan, seqs, 0, runs[0].prompt);
      if (head) encodeHead(enc, this.#plan, head);
      if (this.#mtp) {
        const mtpRuns = runs.flatMap((r, i): MtpRun[] =>
          r.mtp ? [{ seq: seqs[i], slot: r.slot, before: r.before }] : []
        );
        if (mtpRuns.length) encodeMtpPass(enc, this.#plan, this.#mtp, mtpRuns);
      }
    });
  }

  /**
   * Step s of decodeFused: embeds act.ids[s] at position base + s and writes its argmax, or
   * where `sampled` its draw s from its top-k, to act.ids[s + 1]; the last step reads back every
   * id and the top-k. With the MTP block (where `mtp`), `before` is the MTP store's row before
   * the first step (#before).
   */
  #prepareFused(f: FusedCall, s: number): Prepared {
    const { slot, base, steps, k, before, mtp, sampled, pairs } = f;
    const { act } = this.#plan;
    const last = s === steps - 1;
    const outputs: Outputs = last
      ? [[act.ids, 4, 4 * steps], [act.top, 0, k ? 4 * topKWords(k) : 0]]
      : [];
    const marks = { start: s === 0, end: last };
    const seqs = [{ states: this.#sets[slot], base: base + s, row: 0, n: 1 }];
    const key = fusedKey(f, s);
    return this.#prepare(key, seqs, outputs, marks, (enc) => {
      encodeLayers(enc, this.#plan, seqs, s);
      const top = (last || sampled) && k > 0;
      const adjust = pairs ? { maskAt: 0, words: 0, biasAt: 0, pairs } : undefined;
      // Only the last step's log-sum-exp is read. A sampled step's draw overwrites the argmax,
      // which stays the id where it finds no candidate (as the head's sampler has it).
      encodeHead(enc, this.#plan, {
        rows: [{ row: 0, top, adjust }],
        topk: top ? k : 0,
        greedy: { buffer: act.ids, offset: s + 1 },
        lse: last,
      });
      if (sampled) {
        sample(enc, { top: act.top, draws: act.draws, out: act.ids }, {
          topOffset: 0,
          drawsOffset: 0,
          draw: s,
          outOffset: s + 1,
        });
      }
      const plan = this.#mtp;
      if (plan && mtp) {
        // After the first step the store's slot row 0 holds the step before's hidden row.
        const mtpBefore = s === 0 ? before : slot * plan.rows;
        encodeMtpPass(enc, this.#plan, plan, [{ seq: seqs[0], slot, before: mtpBefore }], s);
      }
    });
  }

  /** Stage.draft, where the stage runs its model's MTP block. */
  readonly draft?: (slot: number, id: number, k: number) => Promise<Uint32Array>;

  /**
   * Up to k greedy drafts of the MTP block after `slot`'s position, `id` the token there: one
   * submission chaining each draft's argmax into the next on the GPU.
   */
  async #draft(mtp: MtpPlan, slot: number, id: number, k: number): Promise<Uint32Array> {
    this.#checkSlot(slot);
    checkDraft(id, k, this.#hp.V);
    const pos = this.#pos[slot];
    const before = this.#before(slot, pos);
    const count = Math.min(k, this.ctx - pos, this.maxBatch);
    if (before < 0 || count <= 0 || this.#mtpGap[slot]) return new Uint32Array();
    const started = performance.now();
    // The slot's runs go first: the drafts read the state they leave.
    this.#flush();
    this.#write({ kind: "ids", ids: Uint32Array.of(id) }, 0);
    const { act } = this.#plan;
    const key = `draft ${slot} ${pos} ${count} h${before}`;
    const step = this.#prepare(key, [], [[act.ids, 4, 4 * count]], ALL_MARKS, (enc) => {
      encodeMtpDrafts(enc, this.#plan, mtp, this.#sets[slot], { before, pos, k: count });
    });
    const data = await this.#submit(1, () => step, started, {
      slots: [slot],
      tokens: count,
      what: () => `${count} drafts after position ${pos} of slot ${slot}`,
    });
    return new Uint32Array(data, 0, count).slice();
  }

  /**
   * Records a step with `record`, copies `outputs` ([buffer, byte offset, bytes]) one after
   * another into a readback (followed by the step's timestamps where a timer runs) and encodes
   * it; validation errors of the encoding are kept for the step's caller.
   */
  #prepare(
    key: string,
    seqs: readonly StepSeq[],
    outputs: Outputs,
    marks: { readonly start: boolean; readonly end: boolean },
    record: (enc: StepEncoder) => void,
  ): Prepared {
    const enc = this.#begin(seqs);
    record(enc);
    const bytes = outputs.reduce((s, [, , size]) => s + size, 0);
    const timer = this.#timer;
    // Timestamps (2 u64) follow the outputs, 8-byte aligned.
    const timeAt = Math.ceil(bytes / 8) * 8;
    const total = timer && marks.end ? timeAt + 16 : bytes;
    const readback = total ? this.#takeReadback(total) : undefined;
    let at = 0;
    for (const [src, offset, size] of outputs) {
      enc.copy(src, offset, readback!, at, size);
      at += size;
    }
    if (timer && marks.end) enc.copy(timer.resolve, 0, readback!, timeAt, 16);
    // Bind groups are built and the command buffer validated here, in a scope of its own.
    const { device } = this.#gpu;
    device.pushErrorScope("validation");
    let encoded: Promise<GPUError | null> | undefined;
    try {
      const step = enc.encode(timer && { timer, ...marks }, this.#dispatchProfiler);
      encoded = device.popErrorScope();
      return { key, step, readback, bytes, timeAt, total, encoded };
    } finally {
      if (!encoded) device.popErrorScope().catch(() => {});
    }
  }

  /** The step encoded ahead for `slot` if it is `key` (and still valid); else drops it. */
  #ahead(slot: number, key: string): Prepared | undefined {
    const p = this.#aheadBySlot.get(slot);
    if (!p) return undefined;
    this.#aheadBySlot.delete(slot);
    if (p.key === key && !p.step.stale) return p;
    this.#drop(p);
    return undefined;
  }

  /** Encodes `slot`'s likely next step now, while the GPU is busy (not under a dispatch profiler). */
  #encodeAhead(slot: number, prepare: () => Prepared): void {
    if (this.#dispatchProfiler) return;
    const old = this.#aheadBySlot.get(slot);
    if (old) this.#drop(old);
    this.#aheadBySlot.delete(slot);
    try {
      this.#aheadBySlot.set(slot, prepare());
    } catch {
      // A guess that cannot be encoded fails the step that needs it, encoded again then; the
      // step already submitted is not this one's to fail.
    }
  }

  #drop(p: Prepared): void {
    if (p.readback) this.#readbacks.push(p.readback);
    // Its encoding errors are moot once it is not submitted.
    p.encoded.catch(() => {});
  }

  /**
   * Submits `count` steps, each encoded by `prepare(i)` right before it is submitted (the last
   * one reads back), and returns the last step's outputs once they are back.
   */
  #submit(
    count: number,
    prepare: (i: number) => Prepared,
    started: number,
    run: Submission,
  ): Promise<ArrayBuffer> {
    const { device } = this.#gpu;
    const errors: Promise<GPUError | null>[] = [];
    let submitMs = 0;
    let dispatches = 0;
    let last: Prepared | undefined;
    for (let i = 0; i < count; i++) {
      const p = prepare(i);
      const t = performance.now();
      device.pushErrorScope("validation");
      p.step.submit();
      errors.push(p.encoded, device.popErrorScope());
      submitMs += performance.now() - t;
      dispatches += p.step.dispatches;
      last = p;
    }
    for (const slot of run.slots) this.#inFlight.add(slot);
    const submitted = performance.now();
    const times = { started, submitted, submitMs, dispatches };
    return this.#collect(last!, errors, run, times);
  }

  async #collect(
    p: Prepared,
    errors: readonly Promise<GPUError | null>[],
    run: Submission,
    t: { started: number; submitted: number; submitMs: number; dispatches: number },
  ): Promise<ArrayBuffer> {
    const { readback } = p;
    try {
      // The last wait of the same shape says when this one should end, so a provider that
      // polls (Dawn) can poll finely around then.
      const shape = `${run.slots.join(",")} ${t.dispatches} ${run.tokens} ${p.total}`;
      const last = this.#waits.get(shape);
      if (last !== undefined) this.#gpu.expectDone(t.submitted + last);
      // A step that reads nothing back is done when the queue says so.
      const all = readback
        ? await mapRead(readback, p.total)
        : await this.#gpu.device.queue.onSubmittedWorkDone().then(() => new ArrayBuffer(0));
      const waitMs = performance.now() - t.submitted;
      this.#reportLateKernels(run);
      this.#waits.set(shape, waitMs);
      // Collected before the outputs return: the next step, encoded once they have, reuses the
      // profiler's buffers.
      const kernels = this.#dispatchProfiler ? await this.#dispatchProfiler.collect() : undefined;
      if (this.#profile) {
        const ns = this.#timer ? new BigUint64Array(all, p.timeAt, 2) : undefined;
        this.#profile({
          tokens: run.tokens,
          dispatches: t.dispatches,
          encodeMs: t.submitted - t.started,
          submitMs: t.submitMs,
          waitMs,
          gpuMs: ns ? Number(ns[1] - ns[0]) / 1e6 : undefined,
          kernels,
        });
      }
      for (const error of await Promise.all(errors)) {
        if (error) {
          throw new Error(
            `Cannot run ${run.what()} on stage ${this.first}..${this.end}: the GPU rejected the step: ${error.message}`,
          );
        }
      }
      return all.slice(0, p.bytes);
    } finally {
      if (readback) this.#readbacks.push(readback);
      for (const slot of run.slots) this.#inFlight.delete(slot);
      // Runs waiting for this step's slots may now wait out WAIT_MS for them instead.
      this.#schedule();
    }
  }

  /**
   * Says which kernel variants a step had to build while it was encoded (each stalls it for its
   * compile, up to a few hundred ms on Dawn): the stage's plan of steps (recordSteps) missed
   * them, which is a bug to report.
   */
  #reportLateKernels(run: Submission): void {
    const late = lateKernels(this.#gpu);
    if (late.length === this.#lateSeen) return;
    const names = late.slice(this.#lateSeen).join(", ");
    this.#lateSeen = late.length;
    this.#log(
      `GPU stage ${this.first}..${this.end}: ${run.what()} built kernel ${names} on the spot, ` +
        "stalling while it compiled; the stage's plan of steps (recordSteps) misses it: report this",
    );
  }

  /**
   * Copies one state set into another (a slot's and a snapshot's, never in one buffer): KV up to
   * `pos` positions, DeltaNet states whole.
   */
  #copy(from: number, to: number, pos: number): void {
    const enc = new StepEncoder(this.#gpu, this.#arena);
    const { strides } = this.#plan;
    const kvBytes = 2 * pos * this.#hp.Hkv * this.#hp.Dh;
    this.#sets[from].forEach((s, i) => {
      const d = this.#sets[to][i];
      if (s.kind === "attention" && d.kind === "attention") {
        const at = (x: { index: number }) => 4 * x.index * strides.kv;
        enc.copy(s.kc, at(s), d.kc, at(d), kvBytes);
        enc.copy(s.vc, at(s), d.vc, at(d), kvBytes);
      } else if (s.kind === "deltanet" && d.kind === "deltanet") {
        enc.copy(
          s.conv,
          4 * s.index * strides.conv,
          d.conv,
          4 * d.index * strides.conv,
          4 * strides.conv,
        );
        enc.copy(
          s.ssm,
          4 * s.index * strides.ssm,
          d.ssm,
          4 * d.index * strides.ssm,
          4 * strides.ssm,
        );
      }
    });
    enc.submit();
  }

  save(slot: number, idx: number): Promise<void> {
    return new Promise((resolve) => {
      this.#checkSlot(slot);
      this.#flush();
      const snap = this.#snapshot(idx);
      this.#copy(slot, snap, this.#pos[slot]);
      this.#pos[snap] = this.#pos[slot];
      this.#mtpGap[snap] = this.#mtpGap[slot];
      resolve();
    });
  }

  restore(slot: number, idx: number): Promise<number> {
    return new Promise((resolve) => {
      this.#checkSlot(slot);
      this.#flush();
      this.#active.delete(slot);
      const snap = this.#snapshot(idx);
      const pos = this.#pos[snap];
      if (pos < 0) {
        throw new RangeError(`Cannot restore snapshot ${idx}: nothing was saved there; save first`);
      }
      this.#copy(snap, slot, pos);
      this.#pos[slot] = pos;
      this.#mtpGap[slot] = this.#mtpGap[snap];
      this.#spans[slot] = undefined;
      // The MTP store keeps no snapshot's rows: drafts wait for the slot's next run.
      this.#kept[slot] = undefined;
      resolve(pos);
    });
  }

  rewind(slot: number, pos: number): Promise<void> {
    return new Promise((resolve) => {
      this.#checkSlot(slot);
      const span = this.#spans[slot];
      checkRewind(slot, pos, span);
      // The run must be submitted before the copies that undo part of it.
      this.#flush();
      const kept = pos - span!.base;
      if (kept < span!.n) {
        const enc = new StepEncoder(this.#gpu, this.#arena);
        const { strides } = this.#plan;
        for (const s of this.#sets[slot]) {
          if (s.kind !== "deltanet" || !s.trail) continue;
          const t = s.trail;
          enc.copy(
            t.ssm,
            4 * (t.ssmOffset + (kept - 1) * strides.ssm),
            s.ssm,
            4 * s.index * strides.ssm,
            4 * strides.ssm,
          );
          // Rows kept … kept + Kc − 2 of the history: the last Kc − 1 inputs up to pos − 1.
          enc.copy(
            t.conv,
            4 * (t.convOffset + kept * this.#hp.C),
            s.conv,
            4 * s.index * strides.conv,
            4 * strides.conv,
          );
        }
        enc.submit();
      }
      this.#pos[slot] = pos;
      resolve();
    });
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#flushTimer !== undefined) clearTimeout(this.#flushTimer);
    const closed = new RangeError(`Cannot run on stage ${this.first}..${this.end}: it was closed`);
    for (const w of this.#waiting.splice(0)) w.reject(closed);
    for (const p of this.#aheadBySlot.values()) this.#drop(p);
    this.#aheadBySlot.clear();
    if (this.#aheadBatch) this.#drop(this.#aheadBatch);
    this.#memory.destroy();
  }
}

/**
 * Opens layers [first, end) of `model` on the GPU: uploads their weights (quantized), compiles
 * the kernels, and allocates the state of every slot and snapshot place for `ctx` positions.
 */
export async function openGpuStage(
  model: GgufModel,
  gpu: GpuContext,
  options: GpuStageOptions,
): Promise<GpuStage> {
  const hp = options.hp ?? readHParams(model.metadata);
  const { first, end, slots, ctx, maxBatch, snapshots, maxRewind } = checkOpenOptions(
    options,
    hp.nLayer,
  );
  const log = options.log ?? ((line: string) => console.error(line));
  const mem = new GpuMemory(gpu);
  // WebGPU tells no free memory, and a buffer the device cannot back fails only into an error
  // scope: without one the stage would open, the server report healthy, and every step fail.
  // The inner scope takes the validation errors of every later write into such a buffer.
  gpu.device.pushErrorScope("out-of-memory");
  gpu.device.pushErrorScope("validation");
  let scoped = true;
  try {
    const mma = gpu.features.subgroupMatrix
      ? "hardware"
      : options.emulateTensorCores ?? tensorCoresEmulatedByEnv()
      ? "emulate"
      : undefined;
    // The MTP block drafts on the last stage, which then embeds the tokens its runs carry.
    const mtp = !!options.mtp && end === hp.nLayer && hasMtpBlock(model, hp.nLayer);
    const shape = activationShape(
      hp,
      { first, end },
      ctx,
      maxBatch,
      mma !== undefined,
      mtp,
      gpu.limits.maxStorageBufferBindingSize,
    );
    const { lmChunk } = shape;
    const act = allocActivations(mem, activationFloats(hp, maxBatch, slots, shape));
    // The MTP block's KV cache is one more layer of every slot's (and snapshot's) state.
    const owned = { first, end: mtp ? end + 1 : end };
    const sets = [
      ...withTrails(mem, hp, allocStates(mem, hp, owned, ctx, slots, "slot"), maxRewind),
      ...allocStates(mem, hp, owned, ctx, snapshots, "snapshot"),
    ];
    // A slot's kept rows: its last run's last row, or every row of a rewindable run.
    const mtpRows = Math.max(1, maxRewind);
    const mtpStore = mtp ? mem.storage("mtp kept rows", 4 * slots * mtpRows * hp.D) : undefined;
    const mtpPlan = (w: StageWeights): MtpPlan | undefined =>
      mtpStore && w.mtp
        ? {
          weights: w.mtp,
          state: end - first,
          store: mtpStore,
          rows: mtpRows,
          before: act.mtpBefore,
          join: act.mtpJoin,
        }
        : undefined;
    const strides = stateStrides(hp, ctx);
    const arena = new ParamArena(mem);
    const load = { first, end, maxPartBytes: options.maxPartBytes, log, mtp };
    // The kernels compile (on Dawn's worker threads) while the weights load: the steps are
    // recorded first against the weights' shapes, which need none of their bytes.
    const shapes = await loadStageWeights(mem, model, hp, { ...load, describe: true });
    const ahead = compileAhead(gpu, () => {
      const described: ForwardPlan = { hp, first, weights: shapes, act, lmChunk, strides, mma };
      recordSteps(
        new StepEncoder(gpu, arena),
        described,
        sets.slice(0, slots),
        maxBatch,
        mtpPlan(shapes),
      );
    });
    const weights = await loadStageWeights(mem, model, hp, load);
    const weightsIn = performance.now();
    const waiting = ahead.unfinished;
    const late = await ahead.settle(KERNEL_DEADLINE_MS);
    const stateTotal = stateBytes(sets) + (mtpStore?.size ?? 0);
    const actBytes = Object.values(act).reduce((s, b) => s + b.size, 0);
    log(
      `GPU state for ${slots} slots + ${snapshots} snapshots of ${ctx} positions: ${
        formatBytes(stateTotal)
      }; activations for ${maxBatch} tokens: ${formatBytes(actBytes)}`,
    );
    scoped = false;
    const invalid = await gpu.device.popErrorScope();
    const oom = await gpu.device.popErrorScope();
    if (oom) {
      throw new GpuOutOfMemoryError(
        `Cannot open layers ${first}..${end}: the GPU ran out of memory placing ${
          formatBytes(mem.bytes)
        } (${formatBytes(mem.bytes - stateTotal - actBytes)} of weights, ${
          formatBytes(stateTotal)
        } of state for ${slots} slots + ${snapshots} snapshots of ${ctx} positions, ${
          formatBytes(actBytes)
        } of activations; ${oom.message.split("\n")[0]}): give fewer --slots, a shorter ` +
          "--ctx or fewer --snapshots (`deno task plan` prints what each takes)",
      );
    }
    if (invalid) {
      throw new Error(
        `Cannot open layers ${first}..${end}: the GPU refused a buffer or write: ${invalid.message}`,
      );
    }
    const plan: ForwardPlan = { hp, first, weights, act, lmChunk, strides, mma };
    const used = await buildKernels(
      new StepEncoder(gpu, arena),
      plan,
      sets.slice(0, slots),
      maxBatch,
      mtpPlan(weights),
    );
    const missed = [...used].filter((n) => !ahead.names.has(n));
    const unused = [...ahead.names].filter((n) => !used.has(n));
    log(
      `Kernels: ${used.size} variants, ${ahead.compiling} compiled while the weights loaded; ${waiting} still compiling when the weights were in, done ${
        ((performance.now() - weightsIn) / 1000).toFixed(2)
      } s after them${
        late ? `; ${late} built synchronously after ${KERNEL_DEADLINE_MS / 1000} s` : ""
      }${missed.length ? `; missing from the plan: ${missed.join(", ")}` : ""}${
        unused.length ? `; planned but unused: ${unused.join(", ")}` : ""
      }`,
    );
    return new GpuStage(
      mem,
      arena,
      hp,
      plan,
      sets,
      first,
      end,
      slots,
      ctx,
      maxBatch,
      maxRewind,
      options,
      mtpPlan(weights),
    );
  } catch (e) {
    if (scoped) {
      await gpu.device.popErrorScope().catch(() => {});
      await gpu.device.popErrorScope().catch(() => {});
    }
    mem.destroy();
    throw e;
  }
}

/** The device could not back a stage's buffers: fewer slots, positions or snapshots may fit. */
export class GpuOutOfMemoryError extends RangeError {
  override name = "GpuOutOfMemoryError";
}

/** TANDEM_MMA=emulate: GpuStageOptions.emulateTensorCores for every stage of the process. */
function tensorCoresEmulatedByEnv(): boolean {
  try {
    return Deno.env.get("TANDEM_MMA") === "emulate";
  } catch {
    return false;
  }
}

/**
 * How long a stage waits, once its weights are in, for kernels compiling ahead before it builds
 * the rest synchronously: Dawn under Deno was seen to leave async pipelines unresolved.
 */
const KERNEL_DEADLINE_MS = 30_000;

/**
 * Records (never submits) steps of 1, 2, the products' other PRODUCT_STEP_TOKENS and maxBatch
 * tokens, the shapes between which kernel variants change, so that every variant the stage's
 * steps use is asked for.
 */
function recordSteps(
  enc: StepEncoder,
  plan: ForwardPlan,
  slots: readonly (readonly GpuLayerState[])[],
  maxBatch: number,
  mtp: MtpPlan | undefined,
): void {
  const states = slots[0];
  // With tensor cores a prompt's rows run their own products, at every length.
  for (const prompt of plan.mma ? [false, true] : [false]) {
    recordKind(enc, plan, states, maxBatch, prompt);
  }
  // decodeFused's draw from a step's candidates.
  if (plan.weights.output) {
    const { act } = plan;
    sample(enc, { top: act.top, draws: act.draws, out: act.ids }, {
      topOffset: 0,
      drawsOffset: 0,
      draw: 0,
      outOffset: 1,
    });
  }
  // The MTP block after steps of every length, and its drafts.
  if (mtp) {
    for (const T of new Set([...PRODUCT_STEP_TOKENS.filter((t) => t < maxBatch), maxBatch])) {
      encodeMtpPass(enc, plan, mtp, [{
        seq: { states, base: 1, row: 0, n: T },
        slot: 0,
        before: 0,
      }]);
    }
    encodeMtpDrafts(enc, plan, mtp, states, { before: 0, pos: 1, k: 1 });
  }
  // A rewindable run: the DeltaNet kernels that keep a trail.
  if (maxBatch > 1 && states.some((s) => s.kind === "deltanet" && s.trail)) {
    encodeLayers(enc, plan, [{ states, base: 0, row: 0, n: 2, trail: true }]);
  }
  // One token each of two slots of one buffer: the sequence-table variants.
  if (slots.length > 1 && maxBatch > 1 && slots[1][0]?.index === 1) {
    encodeLayers(enc, plan, [
      { states, base: 0, row: 0, n: 1 },
      { states: slots[1], base: 0, row: 1, n: 1 },
    ]);
  }
}

/** Records steps of 1, 2, PRODUCT_STEP_TOKENS and maxBatch tokens of one kind, with their heads. */
function recordKind(
  enc: StepEncoder,
  plan: ForwardPlan,
  states: readonly GpuLayerState[],
  maxBatch: number,
  prompt: boolean,
): void {
  const greedy = { buffer: plan.act.greedy, offset: 0 };
  for (const T of new Set([...PRODUCT_STEP_TOKENS.filter((t) => t < maxBatch), maxBatch])) {
    encodeLayers(enc, plan, [{ states, base: 0, row: 0, n: T }], 0, prompt);
    if (plan.weights.output) {
      // One word and one pair make logit_adjust record both of its passes.
      const adjust = { maskAt: 0, words: 1, biasAt: 0, pairs: 1 };
      const rows: HeadRow[] = Array.from({ length: T }, (_, row) => ({ row }));
      rows[T - 1] = { row: T - 1, top: true, adjust };
      encodeHead(enc, plan, { rows, topk: 1, greedy, prompt });
    }
  }
  // Rows of a shared step that are not one run of act.x are gathered first.
  if (plan.weights.output && maxBatch >= 3) {
    encodeHead(enc, plan, { rows: [{ row: 0 }, { row: 2 }], topk: 1, greedy, prompt });
  }
}

/**
 * Builds every kernel variant the stage's steps use that is not built yet (compileAhead built
 * them all unless its plan missed one) and waits for their compilation: encoding is synchronous,
 * so no step should have to build a pipeline. Returns the names of the variants used.
 */
async function buildKernels(
  enc: StepEncoder,
  plan: ForwardPlan,
  slots: readonly (readonly GpuLayerState[])[],
  maxBatch: number,
  mtp: MtpPlan | undefined,
): Promise<Set<string>> {
  const used = collectVariants(enc.ctx, () => recordSteps(enc, plan, slots, maxBatch, mtp));
  await settleKernels(enc.ctx);
  return used;
}
