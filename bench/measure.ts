// Timed workloads over a chain of stages: prefill, greedy decode, concurrent decode on slots.
// Called by bench/decode.ts for the in-process engine and for the split over loopback TCP.

import { chainMaxBatch, runPipeline } from "../engine/pipeline.ts";
import {
  fusedManyMostSteps,
  type LastOutput,
  type Stage,
  type StageRunOptions,
} from "../engine/stage.ts";
import {
  sampleToken,
  type SamplingParams,
  speculativeToken,
  SplitMix64,
} from "../lib/sampling/sample.ts";

/** One bench figure: tokens per run and the seconds of each run, or why it is missing. */
export interface Figure {
  readonly tokens: number;
  readonly timing?: Timing;
  readonly error?: string;
  /** Speculative decoding's drafts, where the figure drafted (tgN-mtpK). */
  readonly drafts?: DraftCount;
}

/** Seconds of each timed run (warm-up excluded): their median, fastest and slowest. */
export interface Timing {
  readonly seconds: readonly number[];
  readonly median: number;
  readonly min: number;
  readonly max: number;
}

/** Timed runs per figure unless told otherwise: enough for a median and a spread. */
export const DEFAULT_RUNS = 5;

/** The Timing of a non-empty list of run seconds. */
export function timingOf(seconds: readonly number[]): Timing {
  return {
    seconds,
    median: median(seconds),
    min: Math.min(...seconds),
    max: Math.max(...seconds),
  };
}

/** Median of a non-empty list (mean of the middle two for an even count). */
export function median(values: readonly number[]): number {
  if (values.length === 0) throw new RangeError("Cannot take the median of no values");
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/**
 * The nearest-rank p-quantile of a non-empty list (0 < p ≤ 1): the smallest value with at least
 * p of the values at or below it, so a p99 of fewer than 100 values is their largest.
 */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) throw new RangeError("Cannot take a percentile of no values");
  if (!(p > 0 && p <= 1)) throw new RangeError(`Cannot take the ${p} quantile: expected (0, 1]`);
  const s = [...values].sort((a, b) => a - b);
  return s[Math.ceil(p * s.length) - 1];
}

/**
 * Serving under load at one concurrency, as users see it: `clients` clients streaming at once.
 * Our figures through the server (bench/load_bench.ts) and the llama.cpp peer's share this shape,
 * so that the report and the plot read both alike.
 */
/** A client count whose load could not be measured, and why. */
export interface LoadFailure {
  readonly clients: number;
  readonly error: string;
}

/** The measured figures of a load report that may hold failures. */
export function measuredLoad(
  load: readonly (LoadFigure | LoadFailure)[] | undefined,
): LoadFigure[] {
  return (load ?? []).filter((f): f is LoadFigure => !("error" in f));
}

export interface LoadFigure {
  /** Clients streaming at once. */
  readonly clients: number;
  /** Output tokens of every reply over the wall seconds from the first request to the last end. */
  readonly aggregateTokPerS: number;
  /** Median over the replies of ms from sending the request to its first token. */
  readonly ttftP50Ms: number;
  /** 99th percentile (percentile()) of ms between consecutive tokens of a reply, over all replies. */
  readonly gapP99Ms: number;
}

/**
 * n token ids in [0, vocab) from a seeded xorshift32 stream: every engine and peer of a run is
 * fed the same ids, and random ids keep the MoE router from settling on a few experts.
 */
export function seededIds(n: number, vocab: number, seed: number): Uint32Array {
  if (!Number.isInteger(vocab) || vocab < 1) {
    throw new RangeError(`Cannot draw token ids from a vocabulary of ${vocab}`);
  }
  let x = (seed >>> 0) || 0x9e3779b9;
  const ids = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    ids[i] = x % vocab;
  }
  return ids;
}

/**
 * Runs `ids` from position 0 of `slot`, in chunks of the chain's largest batch, as the server
 * prefills a prompt (lib/scheduler/scheduler.ts): chunks before the last compute no logits, the
 * last one only its last position's. Returns seconds.
 */
export async function timePrefill(
  stages: readonly Stage[],
  ids: Uint32Array,
  slot = 0,
): Promise<number> {
  const chunk = chainMaxBatch(stages);
  const start = performance.now();
  for (let at = 0; at < ids.length; at += chunk) {
    const logits = at + chunk >= ids.length ? "last" : "none";
    await runPipeline(stages, slot, ids.subarray(at, at + chunk), at, { logits });
  }
  return (performance.now() - start) / 1000;
}

/** What one decode produced and how long it took. */
export interface DecodeRun {
  readonly seconds: number;
  /** The id fed at each step: `first`, then each step's output (greedy or drawn). */
  readonly fed: Uint32Array;
}

/** Where a decode runs: its slot (default 0) and the position of its first step (default 0). */
export interface DecodeAt {
  readonly slot?: number;
  readonly base?: number;
}

/** How the bench samples ("sampled decode"): what a chat client typically asks for. */
export const BENCH_SAMPLING: SamplingParams = { temperature: 0.7, topK: 40, topP: 0.9 };

/** A sampled decode's draws: the sampler's parameters and the seed of its stream. */
export interface Draws {
  readonly sampling: SamplingParams;
  readonly seed: number;
}

/**
 * n one-token steps of one slot from `at.base`: `first`, then each step's output fed back. With
 * `draws`, each step asks the last stage for its top-k (only those are read back) and the next id
 * is drawn from them, as the server decodes a sampled request; without, the greedy id.
 */
async function decodeSteps(
  stages: readonly Stage[],
  first: number,
  n: number,
  at: DecodeAt,
  draws?: Draws,
): Promise<DecodeRun> {
  const slot = at.slot ?? 0;
  const base = at.base ?? 0;
  const rng = new SplitMix64(BigInt(draws?.seed ?? 0));
  const options = draws ? { topk: draws.sampling.topK } : {};
  const fed = new Uint32Array(n);
  fed[0] = first;
  const start = performance.now();
  for (let i = 0; i < n; i++) {
    const { ids, top } = await runPipeline(stages, slot, fed.subarray(i, i + 1), base + i, options);
    if (i + 1 < n) fed[i + 1] = draws ? sampleToken(ids[0], top, draws.sampling, rng) : ids[0];
  }
  return { seconds: (performance.now() - start) / 1000, fed };
}

/**
 * n greedy one-token steps (llama-bench's tg from an empty context when `at.base` is 0), each
 * feeding the previous step's greedy id.
 */
export function timeDecode(
  stages: readonly Stage[],
  first: number,
  n: number,
  at: DecodeAt = {},
): Promise<DecodeRun> {
  return decodeSteps(stages, first, n, at);
}

/** n sampled one-token steps (decodeSteps), drawn with `sampling` from a stream seeded by `seed`. */
export function timeSampledDecode(
  stages: readonly Stage[],
  first: number,
  n: number,
  sampling: SamplingParams,
  seed: number,
  at: DecodeAt = {},
): Promise<DecodeRun> {
  return decodeSteps(stages, first, n, at, { sampling, seed });
}

/**
 * The n greedy tokens of `plain` (a timeDecode's fed ids) decoded as speculative steps decode
 * them: `drafts` tokens verified with the token before them in one rewindable run of generated
 * rows, from slot 0's position 0. `kept`: the drafts are plain decoding's own next ids, so every
 * one is kept (drafts + 1 tokens a run); otherwise each is wrong, so a run yields one token and
 * a rewind. The two bound speculative decoding at any acceptance rate. Throws if a verified
 * position's greedy id is not plain decoding's.
 */
export async function timeVerifiedDecode(
  stages: readonly Stage[],
  plain: Uint32Array,
  drafts: number,
  kept: boolean,
): Promise<number> {
  const n = plain.length;
  const start = performance.now();
  for (let pos = 0; pos < n;) {
    const k = Math.min(drafts, n - pos - 1);
    const input = plain.slice(pos, pos + k + 1);
    if (!kept) { for (let j = 1; j <= k; j++) input[j] = input[j] === 0 ? 1 : input[j] - 1; }
    const { ids } = await runPipeline(stages, 0, input, pos, {
      logits: "all",
      rows: "decode",
      rewindable: k > 0,
    });
    const next = kept ? k + 1 : 1;
    for (let j = 0; j < next && pos + j + 1 < n; j++) {
      if (ids[j] !== plain[pos + j + 1]) {
        throw new Error(
          `Cannot time verified decoding: position ${pos + j} gave id ${ids[j]}, plain decoding ${
            plain[pos + j + 1]
          }`,
        );
      }
    }
    if (next < k + 1) { for (const stage of stages) await stage.rewind(0, pos + next); }
    pos += next;
  }
  return (performance.now() - start) / 1000;
}

/** A speculative decode's drafts: how many were verified and how many the model kept. */
export interface DraftCount {
  readonly drafted: number;
  readonly kept: number;
}

/**
 * One speculative step of slot 0 at `pos`: up to `k` drafts of the stage's MTP head after `id`,
 * verified with `id` in one run returning every row's greedy id (`drafted`'s options too where
 * there are drafts: rewindable, and the sampled candidates).
 */
async function draftAndVerify(
  stage: Stage,
  pos: number,
  id: number,
  k: number,
  options: StageRunOptions,
  drafted: StageRunOptions,
): Promise<{ readonly draft: Uint32Array; readonly out: LastOutput }> {
  if (!stage.draft) {
    throw new TypeError("Cannot time MTP drafting: the stage runs no MTP block (open it with mtp)");
  }
  const draft = k > 0 ? await stage.draft(0, id, k) : new Uint32Array();
  const input = Uint32Array.of(id, ...draft);
  const out = await stage.run(0, { kind: "ids", ids: input }, input.length, pos, {
    logits: "all",
    rows: "decode",
    ...options,
    ...(draft.length ? drafted : {}),
  });
  if (out.kind !== "ids") {
    throw new TypeError("Cannot time MTP drafting on a stage before the last");
  }
  return { draft, out };
}

/**
 * The greedy tokens `plain` (timeDecode's fed ids) decoded with the model's MTP head drafting:
 * each step drafts up to `drafts` tokens (Stage.draft), verifies them with the token before them
 * in one rewindable run, keeps those the model agrees with and rewinds past the rest, as the
 * scheduler does; every token is checked against plain decoding. 0 drafts: plain steps on a stage
 * running the MTP block (its cost alone).
 */
export async function timeMtpDecode(
  stage: Stage,
  plain: Uint32Array,
  drafts: number,
): Promise<{ seconds: number } & DraftCount> {
  const n = plain.length;
  let drafted = 0;
  let kept = 0;
  const start = performance.now();
  for (let pos = 0; pos < n;) {
    const k = Math.min(drafts, n - pos - 1);
    const { draft, out } = await draftAndVerify(stage, pos, plain[pos], k, {}, {
      rewindable: true,
    });
    let m = 0;
    while (m < draft.length && draft[m] === out.ids[m]) m++;
    for (let j = 0; j <= m && pos + j + 1 < n; j++) {
      if (out.ids[j] !== plain[pos + j + 1]) {
        throw new Error(
          `Cannot time MTP drafting: position ${pos + j} gave id ${out.ids[j]}, plain decoding ${
            plain[pos + j + 1]
          }`,
        );
      }
    }
    if (m < draft.length) await stage.rewind(0, pos + m + 1);
    drafted += draft.length;
    kept += m;
    pos += m + 1;
  }
  return { seconds: (performance.now() - start) / 1000, drafted, kept };
}

/**
 * n tokens sampled with `sampling` (seeded) from `first`, with the model's MTP head drafting up
 * to `drafts` a step: each step verifies its drafts in one rewindable run returning every row's
 * candidates and keeps each draft with the probability the sampler gives it
 * (lib/sampling/sample.ts speculativeToken), as the scheduler does for a sampled request.
 */
export async function timeMtpSampledDecode(
  stage: Stage,
  first: number,
  n: number,
  drafts: number,
  sampling: SamplingParams,
  seed: number,
): Promise<DecodeRun & DraftCount> {
  const rng = new SplitMix64(BigInt(seed));
  const fed = new Uint32Array(n);
  fed[0] = first;
  let drafted = 0;
  let kept = 0;
  const start = performance.now();
  for (let pos = 0; pos < n;) {
    const k = Math.min(drafts, n - pos - 1);
    const { draft, out } = await draftAndVerify(stage, pos, fed[pos], k, {
      topk: sampling.topK,
    }, { rewindable: true, candidates: "every" });
    let m = 0;
    let next = -1;
    while (next < 0) {
      if (m === draft.length) {
        next = sampleToken(out.ids[m], out.tops?.[m] ?? out.top, sampling, rng);
      } else {
        const t = speculativeToken(draft[m], out.ids[m], out.tops![m], sampling, rng);
        if (t.kept) m++;
        else next = t.id;
      }
    }
    if (m < draft.length) await stage.rewind(0, pos + m + 1);
    // The n positions run, as timeSampledDecode's steps; the token after the last is dropped.
    fed.set([...draft.subarray(0, m), next].slice(0, n - pos - 1), pos + 1);
    drafted += draft.length;
    kept += m;
    pos += m + 1;
  }
  return { seconds: (performance.now() - start) / 1000, fed, drafted, kept };
}

/**
 * The same n tokens as timeDecode (greedy) or timeSampledDecode (with `draws`), decoded as the
 * server's scheduler decodes a plain sequence running alone on a whole-model stage: `steps`
 * tokens per readback (Stage.decodeFused), sampled on the device from each step's top-k with the
 * stream's draws.
 */
export async function timeFusedDecode(
  stage: Stage,
  first: number,
  n: number,
  steps: number,
  slot = 0,
  draws?: Draws,
): Promise<DecodeRun> {
  if (!stage.decodeFused) {
    throw new TypeError(
      `Cannot time fused decoding on layers ${stage.first}..${stage.end}: the stage has no decodeFused`,
    );
  }
  const rng = new SplitMix64(BigInt(draws?.seed ?? 0));
  const fed = new Uint32Array(n);
  fed[0] = first;
  const start = performance.now();
  for (let pos = 0; pos < n;) {
    const k = Math.min(steps, n - pos);
    const sampling = draws && {
      params: draws.sampling,
      draws: Uint32Array.from({ length: k }, () => rng.nextU32()),
    };
    const options = sampling ? { topk: draws.sampling.topK, sampling } : {};
    const { ids } = await stage.decodeFused(slot, fed[pos], pos, k, options);
    fed.set(ids.subarray(0, Math.min(k, n - pos - 1)), pos + 1);
    pos += k;
  }
  return { seconds: (performance.now() - start) / 1000, fed };
}

/**
 * timeConcurrentDecode's sequences (slot i from firsts[i] at position 0, drawing from a stream
 * seeded `seed + i`) decoded together on the device: `steps` shared steps a call (fewer where
 * the stage's maxBatch holds fewer: fusedManyMostSteps) of
 * Stage.decodeFusedMany, each row's draw fed to its next step without a readback. Each slot's
 * tokens are what its per-step run draws (the sampler's integer arithmetic).
 */
export async function timeFusedManyDecode(
  stage: Stage,
  firsts: readonly number[],
  n: number,
  steps: number,
  sampling: SamplingParams,
  seed: number,
): Promise<{ readonly seconds: number; readonly fed: readonly Uint32Array[] }> {
  if (!stage.decodeFusedMany) {
    throw new TypeError(
      `Cannot time fused decoding of several sequences on layers ${stage.first}..${stage.end}: the stage has no decodeFusedMany`,
    );
  }
  const rngs = firsts.map((_, slot) => new SplitMix64(BigInt(seed + slot)));
  const fed = firsts.map((first) => {
    const f = new Uint32Array(n);
    f[0] = first;
    return f;
  });
  const most = Math.min(steps, fusedManyMostSteps(stage.maxBatch, firsts.length));
  const start = performance.now();
  for (let pos = 0; pos < n;) {
    const k = Math.min(most, n - pos);
    const seqs = fed.map((f, slot) => ({
      slot,
      id: f[pos],
      base: pos,
      options: {
        topk: sampling.topK,
        sampling: {
          params: sampling,
          draws: Uint32Array.from({ length: k }, () => rngs[slot].nextU32()),
        },
      },
    }));
    const outs = await stage.decodeFusedMany(seqs, k);
    outs.forEach((o, slot) => fed[slot].set(o.ids.subarray(0, Math.min(k, n - pos - 1)), pos + 1));
    pos += k;
  }
  return { seconds: (performance.now() - start) / 1000, fed };
}

/**
 * One independent decode per entry of `firsts` (slot i starts from firsts[i] at position `base`,
 * after a prompt of that many positions, or from an empty context at 0), all in flight at once as
 * separate requests would be; greedy, or with `sampling` each slot i drawing from its own stream
 * seeded `seed + i`. Returns the wall time of the whole set.
 */
export async function timeConcurrentDecode(
  stages: readonly Stage[],
  firsts: readonly number[],
  n: number,
  sampling?: SamplingParams,
  seed = 0,
  base = 0,
): Promise<{ readonly seconds: number; readonly fed: readonly Uint32Array[] }> {
  const start = performance.now();
  const runs = await Promise.all(
    firsts.map((first, slot) =>
      decodeSteps(stages, first, n, { slot, base }, sampling && { sampling, seed: seed + slot })
    ),
  );
  return { seconds: (performance.now() - start) / 1000, fed: runs.map((r) => r.fed) };
}

/** Wall-clock limit shared by every measurement of one bench run. */
export class Deadline {
  readonly #end: number;
  readonly #now: () => number;

  /** `now`: the clock in ms (a test's own, to spend time without waiting). */
  constructor(seconds: number, now: () => number = () => performance.now()) {
    this.#now = now;
    this.#end = now() + seconds * 1000;
  }

  /** Seconds left, negative once passed. */
  get left(): number {
    return (this.#end - this.#now()) / 1000;
  }
}

/** A measurement left out because the run's time was spent. */
export class OutOfTime extends Error {
  override name = "OutOfTime";
}

/**
 * One untimed warm-up, then up to `runs` timed runs of `once` (which returns its own seconds).
 * A run starts only while the time left covers the run before it: the warm-up's time bounds the
 * first alone, since it pays one-time costs (budgeting every run by it left llama.cpp's pp512, whose
 * first call also builds its Vulkan pipelines, 4 timed runs of 5 in the full benches). Fewer runs
 * are made when the deadline comes, and the Timing says how many; with no time for one it throws
 * OutOfTime.
 */
export async function repeat(
  runs: number,
  once: () => Promise<number>,
  deadline: Deadline,
): Promise<Timing> {
  if (deadline.left <= 0) throw new OutOfTime("no time left for a warm-up");
  const warm = await once();
  const seconds: number[] = [];
  let last = warm;
  while (seconds.length < runs && deadline.left >= last) {
    last = await once();
    seconds.push(last);
  }
  if (seconds.length === 0) {
    throw new OutOfTime(
      `the warm-up took ${warm.toFixed(1)} s and ${deadline.left.toFixed(1)} s are left`,
    );
  }
  return timingOf(seconds);
}

/**
 * A Figure from `repeat`: a failure (the engine's error, or OutOfTime) is kept as the figure's
 * error so that one broken workload does not hide the others; `log` gets one line either way.
 */
export async function measure(
  name: string,
  tokens: number,
  runs: number,
  once: () => Promise<number>,
  deadline: Deadline,
  log: (line: string) => void,
): Promise<Figure> {
  try {
    const timing = await repeat(runs, once, deadline);
    log(
      `${name}: ${(tokens / timing.median).toFixed(1)} tok/s, median of ${timing.seconds.length}` +
        ` (slowest/median ${(timing.max / timing.median).toFixed(2)})`,
    );
    return { tokens, timing };
  } catch (e) {
    const error = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
    log(`${name}: ${e instanceof OutOfTime ? error : (e as Error).stack}`);
    return { tokens, error };
  }
}
