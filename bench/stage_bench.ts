// One engine's figures (pp, tg, sampled tg on many slots, tg after a long prefix, split decode) in a
// process of its own; answers JSON on stdout, logs on stderr.
//
// Spawned by bench/decode.ts once per GPU provider, so that a crash or a leaked device in one
// provider cannot take the other's figures with it.

import { openGguf } from "../engine/gguf/read.ts";
import { hasMtpBlock } from "../engine/gguf/stage_shard.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { readHParams } from "../engine/hparams.ts";
import { type Backend, BACKENDS, openLocalStage } from "../engine/open_stage.ts";
import type { ProviderName } from "../engine/gpu/provider.ts";
import {
  type Command,
  flag,
  type FlagTable,
  listOf,
  oneOf,
  requiredFlag,
  runCommand,
  text,
  whole,
} from "../lib/cli.ts";
import type { Stage } from "../engine/stage.ts";
import { FUSED_STEPS } from "../lib/scheduler/scheduler.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import {
  BENCH_SAMPLING,
  Deadline,
  DEFAULT_RUNS,
  type DraftCount,
  type Figure,
  measure,
  OutOfTime,
  seededIds,
  timeConcurrentDecode,
  timeDecode,
  timeFusedDecode,
  timeFusedManyDecode,
  timeMtpDecode,
  timeMtpSampledDecode,
  timePrefill,
  timeSampledDecode,
  timeVerifiedDecode,
} from "./measure.ts";
import { startWorker } from "./split.ts";

export interface StageBenchOptions {
  readonly model: string;
  readonly backend: Backend;
  /** GPU provider; ignored by the reference backend. */
  readonly gpu: ProviderName;
  readonly pp: readonly number[];
  readonly tg: number;
  /** Slots decoding greedily at once for the aggregate figure; 1 leaves it out. */
  readonly slots: number;
  /** Sequences sampled at once, each with its own seed, for the aggregate figures (tgNxS-sampled). */
  readonly concurrency: readonly number[];
  /** Also decode tg tokens after a prefix of this many positions (tgN@P); 0 leaves it out. */
  readonly at: number;
  /** Drafts a verify run takes, for tgN-verifyK-kept and -refused (timeVerifiedDecode). */
  readonly drafts: readonly number[];
  /** Layer where the in-process stage ends and the worker begins; undefined: no split. */
  readonly split?: number;
  readonly runs: number;
  readonly seed: number;
  readonly deadlineS: number;
}

export interface SplitReport {
  /** "0:k + k:n". */
  readonly layers: string;
  readonly workerStartSeconds?: number;
  readonly openSeconds?: number;
  /** tg one sequence at a time through both stages (ms/token in the table). */
  readonly decode: Figure;
  /** tg on `slots` sequences at once through both stages, keeping both stages busy. */
  readonly concurrent?: Figure;
}

/** What this script prints for one backend/provider. */
export interface StageReport {
  readonly backend: Backend;
  readonly gpu: string;
  /** The WebGPU adapter's description (GPU backend only). */
  readonly adapter?: string;
  readonly openSeconds?: number;
  /** Opening the stage of max(concurrency) slots the tg<n>x<s>-sampled figures run on. */
  readonly manySlotsOpenSeconds?: number;
  readonly maxBatch?: number;
  /**
   * pp<n>, tg<n>, tg<n>-fused, tg<n>-sampled, tg<n>x<slots>, tg<n>@<at>, tg<n>x<s>-sampled for each
   * s of the concurrency; tokens per run inside (all sequences' for the several-sequence ones).
   */
  readonly figures: Readonly<Record<string, Figure>>;
  readonly split?: SplitReport;
  /** Set when the stage could not be opened at all. */
  readonly error?: string;
}

function log(line: string): void {
  console.error(`[bench] ${line}`);
}

async function describeAdapter(gpu: string): Promise<string> {
  const { selectProvider } = await import("../engine/gpu/provider.ts");
  const provider = await selectProvider(gpu as "builtin" | "dawn");
  const adapter = await provider.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return `${provider.name}: no adapter`;
  const i = adapter.info;
  return `${provider.name}: ${
    [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(" ")
  }`;
}

/** What a stage is opened with besides its engine: layers [first, end), slots, context, snapshots. */
interface StageSize {
  readonly first: number;
  readonly end: number;
  readonly slots: number;
  readonly ctx: number;
  readonly snapshots?: number;
  readonly maxRewind?: number;
}

async function openTimed(
  model: GgufModel,
  options: StageBenchOptions,
  size: StageSize,
): Promise<{ stage: Stage; seconds: number }> {
  const start = performance.now();
  const stage = await openLocalStage(model, {
    engine: { backend: options.backend, gpu: options.gpu },
    ...size,
  });
  return { stage, seconds: (performance.now() - start) / 1000 };
}

/**
 * The whole-model stage that runs pp, tg and the greedy several-slot tg: its context holds the
 * longest prompt and the decode after the prefix, a snapshot keeps that prefix between runs.
 */
function wholeStageSize(options: StageBenchOptions, nLayer: number): StageSize {
  const { pp, tg, at } = options;
  return {
    first: 0,
    end: nLayer,
    slots: Math.max(1, options.slots),
    ctx: Math.max(...pp, tg, at > 0 ? at + tg : 0),
    snapshots: at > 0 ? 1 : 0,
    maxRewind: options.drafts.length ? Math.max(...options.drafts) + 1 : 0,
  };
}

/** pp, tg, the greedy several-slot tg and tg after a prefix on one stage owning every layer. */
async function wholeFigures(
  stage: Stage,
  options: StageBenchOptions,
  vocab: number,
  deadline: Deadline,
): Promise<{ figures: Record<string, Figure>; plain?: Uint32Array }> {
  const figures: Record<string, Figure> = {};
  const { runs, tg, seed, at } = options;
  for (const n of options.pp) {
    const ids = seededIds(n, vocab, seed);
    figures[`pp${n}`] = await measure(
      `pp${n}`,
      n,
      runs,
      () => timePrefill([stage], ids),
      deadline,
      log,
    );
  }
  const firsts = Array.from(seededIds(options.slots, vocab, seed + 1));
  let plain: Uint32Array | undefined;
  figures[`tg${tg}`] = await measure(
    `tg${tg}`,
    tg,
    runs,
    async () => {
      const run = await timeDecode([stage], firsts[0], tg);
      plain = run.fed;
      return run.seconds;
    },
    deadline,
    log,
  );
  for (const k of plain ? options.drafts : []) {
    for (const kept of [true, false]) {
      const name = `tg${tg}-verify${k}-${kept ? "kept" : "refused"}`;
      figures[name] = await measure(
        `tg${tg}, ${k} drafts a step, ${kept ? "all kept" : "all refused"}`,
        tg,
        runs,
        () => timeVerifiedDecode([stage], plain!, k, kept),
        deadline,
        log,
      );
    }
  }
  if (stage.decodeFused) {
    figures[`tg${tg}-fused`] = await measure(
      `tg${tg} fused`,
      tg,
      runs,
      async () => (await timeFusedDecode(stage, firsts[0], tg, FUSED_STEPS)).seconds,
      deadline,
      log,
    );
  }
  // Sampled as the server samples a sequence running alone: on the device, FUSED_STEPS a
  // readback, where the stage can (the per-step figure, tgN-sampled-step, is then what a split
  // deployment's head does). Both draw the same tokens (the sampler's integer arithmetic),
  // checked here.
  const fused = stage.decodeFused !== undefined;
  let stepwise: Uint32Array | undefined;
  figures[fused ? `tg${tg}-sampled-step` : `tg${tg}-sampled`] = await measure(
    fused ? `tg${tg} sampled, a readback a step` : `tg${tg} sampled`,
    tg,
    runs,
    async () => {
      const run = await timeSampledDecode([stage], firsts[0], tg, BENCH_SAMPLING, seed);
      stepwise = run.fed;
      return run.seconds;
    },
    deadline,
    log,
  );
  if (fused) {
    const draws = { sampling: BENCH_SAMPLING, seed };
    figures[`tg${tg}-sampled`] = await measure(
      `tg${tg} sampled`,
      tg,
      runs,
      async () => {
        const run = await timeFusedDecode(stage, firsts[0], tg, FUSED_STEPS, 0, draws);
        if (stepwise && run.fed.some((id, i) => id !== stepwise![i])) {
          throw new Error(
            `tg${tg} sampled on the device drew other tokens than the head's per-step draws: the GPU sampler (wgsl/sample.wgsl) and lib/sampling/sample.ts disagree`,
          );
        }
        return run.seconds;
      },
      deadline,
      log,
    );
  }
  if (options.slots > 1) {
    const name = `tg${tg}x${options.slots}`;
    figures[name] = await measure(
      name,
      tg * options.slots,
      runs,
      async () => (await timeConcurrentDecode([stage], firsts, tg)).seconds,
      deadline,
      log,
    );
  }
  if (at > 0) {
    // The prefix is prefilled once, in the warm-up, and kept in snapshot 0: each run restores it
    // and decodes the same tg steps from position `at`, as tg does from position 0.
    let saved = false;
    figures[`tg${tg}@${at}`] = await measure(
      `tg${tg} after ${at} positions`,
      tg,
      runs,
      async () => {
        if (!saved) {
          await timePrefill([stage], seededIds(at, vocab, seed));
          await stage.save(0, 0);
          saved = true;
        }
        const base = await stage.restore(0, 0);
        return (await timeDecode([stage], firsts[0], tg, { base })).seconds;
      },
      deadline,
      log,
    );
  }
  return { figures, plain };
}

/**
 * tgN-mtpK: tg's greedy tokens decoded with the model's MTP head drafting K tokens a step
 * (timeMtpDecode; K = 0: plain steps with the block running), on a whole-model stage of its own
 * opened with mtp, where the file has the block. Each figure carries how many drafts were kept:
 * random weights keep almost none, a predictable model (make-model --predictable) all.
 */
async function mtpStage(
  model: GgufModel,
  options: StageBenchOptions,
  nLayer: number,
  plain: Uint32Array,
  deadline: Deadline,
): Promise<Record<string, Figure>> {
  const figures: Record<string, Figure> = {};
  const { tg, runs } = options;
  const drafts = [0, ...options.drafts];
  const size = { first: 0, end: nLayer, slots: 1, ctx: tg, maxRewind: Math.max(...drafts) + 1 };
  let opened;
  try {
    if (deadline.left <= 0) throw new OutOfTime("no time left to open the MTP stage");
    opened = await openLocalStage(model, {
      engine: { backend: options.backend, gpu: options.gpu },
      ...size,
      mtp: true,
    });
  } catch (e) {
    const error = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
    log(`open the MTP stage: ${error}`);
    return Object.fromEntries(drafts.map((k) => [`tg${tg}-mtp${k}`, { tokens: tg, error }]));
  }
  try {
    for (const k of drafts) {
      let count: DraftCount = { drafted: 0, kept: 0 };
      const figure = await measure(
        `tg${tg}, MTP drafts ${k} a step`,
        tg,
        runs,
        async () => {
          const run = await timeMtpDecode(opened, plain, k);
          count = run;
          return run.seconds;
        },
        deadline,
        log,
      );
      const plainName = `tg${tg}-mtp${k}`;
      figures[plainName] = withDrafts(plainName, figure, count, k > 0 ? log : undefined);
      if (k === 0) continue;
      // Sampled as the bench samples tg (BENCH_SAMPLING), each draft kept with its probability.
      let sampled: DraftCount = { drafted: 0, kept: 0 };
      const name = `tg${tg}-mtp${k}-sampled`;
      const timed = await measure(
        `tg${tg} sampled, MTP drafts ${k} a step`,
        tg,
        runs,
        async () => {
          const run = await timeMtpSampledDecode(
            opened,
            plain[0],
            tg,
            k,
            BENCH_SAMPLING,
            options.seed,
          );
          sampled = run;
          return run.seconds;
        },
        deadline,
        log,
      );
      figures[name] = withDrafts(name, timed, sampled, log);
    }
  } finally {
    opened.close();
  }
  return figures;
}

/**
 * Figure `name` with the drafts its last run made and kept (said in `log` where given); a
 * figure that was not measured (skipped, failed) carries none.
 */
function withDrafts(
  name: string,
  figure: Figure,
  count: DraftCount,
  log?: (line: string) => void,
): Figure {
  if (figure.error !== undefined) return figure;
  log?.(`${name}: ${count.kept} of ${count.drafted} drafts kept`);
  return { ...figure, drafts: { drafted: count.drafted, kept: count.kept } };
}

/**
 * tg sampled on s sequences at once for each s of the concurrency, every sequence from its own
 * first id with its own seed (timeConcurrentDecode), on a stage of as many slots: the figures of
 * continuous batching, against tg sampled on one.
 */
async function manySlotFigures(
  stage: Stage,
  options: StageBenchOptions,
  vocab: number,
  deadline: Deadline,
): Promise<Record<string, Figure>> {
  const figures: Record<string, Figure> = {};
  const { runs, tg, seed } = options;
  for (const s of options.concurrency) {
    const firsts = Array.from(seededIds(s, vocab, seed + 1));
    const name = `tg${tg}x${s}-sampled`;
    let stepwise: readonly Uint32Array[] | undefined;
    figures[name] = await measure(
      `tg${tg} sampled on ${s} sequences`,
      tg * s,
      runs,
      async () => {
        const run = await timeConcurrentDecode([stage], firsts, tg, BENCH_SAMPLING, seed);
        stepwise = run.fed;
        return run.seconds;
      },
      deadline,
      log,
    );
    // The same sequences drawn on the device, FUSED_STEPS shared steps a readback, where the
    // stage can; their tokens must be the per-step draws'.
    if (stage.decodeFusedMany && s > 1) {
      figures[`${name}-fused`] = await measure(
        `tg${tg} sampled on ${s} sequences, fused on the device`,
        tg * s,
        runs,
        async () => {
          const run = await timeFusedManyDecode(
            stage,
            firsts,
            tg,
            FUSED_STEPS,
            BENCH_SAMPLING,
            seed,
          );
          if (stepwise && run.fed.some((f, i) => f.some((id, j) => id !== stepwise![i][j]))) {
            throw new Error(
              `tg${tg} sampled on ${s} sequences on the device drew other tokens than their per-step draws: decodeFusedMany and lib/sampling/sample.ts disagree`,
            );
          }
          return run.seconds;
        },
        deadline,
        log,
      );
    }
  }
  return figures;
}

/** Decode through layers 0:k here and k:n in a worker process over loopback TCP. */
async function splitFigure(
  model: GgufModel,
  options: StageBenchOptions,
  k: number,
  nLayer: number,
  vocab: number,
  deadline: Deadline,
): Promise<SplitReport> {
  const layers = `0:${k} + ${k}:${nLayer}`;
  const name = `split tg${options.tg}`;
  if (deadline.left <= 0) {
    const error = "skipped: no time left to start the worker";
    log(`${name}: ${error}`);
    return { layers, decode: { tokens: options.tg, error } };
  }
  let worker;
  let local: Stage | undefined;
  let remote: Stage | undefined;
  try {
    // The split only decodes from position 0: tg positions are all its slots need.
    const size = { first: 0, end: k, slots: options.slots, ctx: options.tg };
    worker = await startWorker({
      model: options.model,
      first: k,
      end: nLayer,
      backend: options.backend,
      gpu: options.gpu,
      slots: size.slots,
      ctx: size.ctx,
      startTimeoutS: Math.min(Math.max(deadline.left, 1), 900),
      log: (line) => console.error(line),
    });
    const opened = await openTimed(model, options, size);
    local = opened.stage;
    remote = await connectRemoteStage(worker.address, { local, model });
    const stages = [local, remote];
    const firsts = Array.from(seededIds(options.slots, vocab, options.seed + 1));
    const decode = await measure(
      name,
      options.tg,
      options.runs,
      async () => (await timeDecode(stages, firsts[0], options.tg)).seconds,
      deadline,
      log,
    );
    const concurrent = options.slots > 1
      ? await measure(
        `${name} x${options.slots}`,
        options.tg * options.slots,
        options.runs,
        async () => (await timeConcurrentDecode(stages, firsts, options.tg)).seconds,
        deadline,
        log,
      )
      : undefined;
    return {
      layers,
      workerStartSeconds: worker.startSeconds,
      openSeconds: opened.seconds,
      decode,
      concurrent,
    };
  } catch (e) {
    log(`${name}: ${(e as Error).stack}`);
    return { layers, decode: { tokens: options.tg, error: (e as Error).message } };
  } finally {
    remote?.close();
    local?.close();
    await worker?.stop();
  }
}

/**
 * The several-sequence figures on a stage of their own, closed after them: max(concurrency) slots
 * of tg positions, so that 64 slots do not each hold the longest prompt's context. A stage that
 * cannot open gives each figure its error.
 */
async function manySlotStage(
  model: GgufModel,
  options: StageBenchOptions,
  nLayer: number,
  vocab: number,
  deadline: Deadline,
): Promise<{ figures: Record<string, Figure>; openSeconds?: number }> {
  const slots = Math.max(...options.concurrency);
  let opened;
  try {
    if (deadline.left <= 0) throw new OutOfTime(`no time left to open ${slots} slots`);
    // A step takes up to maxBatch rows (the context's length by default): one for each sequence.
    const ctx = Math.max(options.tg, slots);
    opened = await openTimed(model, options, { first: 0, end: nLayer, slots, ctx });
  } catch (e) {
    const error = e instanceof OutOfTime
      ? `skipped: ${e.message}`
      : `Cannot open ${slots} slots: ${(e as Error).message}`;
    log(`open ${slots} slots: ${e instanceof OutOfTime ? error : (e as Error).stack}`);
    return {
      figures: Object.fromEntries(
        options.concurrency.map((s) => [
          `tg${options.tg}x${s}-sampled`,
          { tokens: options.tg * s, error },
        ]),
      ),
    };
  }
  log(`opened ${slots} slots in ${opened.seconds.toFixed(1)} s`);
  try {
    return {
      figures: await manySlotFigures(opened.stage, options, vocab, deadline),
      openSeconds: opened.seconds,
    };
  } finally {
    opened.stage.close();
  }
}

/** Every figure of one backend/provider; failures are kept in the report, not thrown. */
export async function benchStage(options: StageBenchOptions): Promise<StageReport> {
  const deadline = new Deadline(options.deadlineS);
  const { backend } = options;
  // The reference backend has no provider; its rows are named "cpu".
  const gpu = backend === "gpu" ? options.gpu : "cpu";
  const adapter = backend === "gpu" ? await describeAdapter(gpu) : undefined;
  if (adapter) log(`adapter ${adapter}`);
  const model = await openGguf(options.model);
  try {
    const hp = readHParams(model.metadata);
    let opened;
    try {
      opened = await openTimed(model, options, wholeStageSize(options, hp.nLayer));
    } catch (e) {
      log(`open: ${(e as Error).stack}`);
      return { backend, gpu, adapter, figures: {}, error: (e as Error).message };
    }
    log(`opened ${hp.nLayer} layers in ${opened.seconds.toFixed(1)} s`);
    const figures: Record<string, Figure> = {};
    let plain: Uint32Array | undefined;
    try {
      const whole = await wholeFigures(opened.stage, options, hp.V, deadline);
      Object.assign(figures, whole.figures);
      plain = whole.plain;
    } finally {
      opened.stage.close();
    }
    if (plain && options.drafts.length && hasMtpBlock(model, hp.nLayer)) {
      Object.assign(figures, await mtpStage(model, options, hp.nLayer, plain, deadline));
    }
    const many = options.concurrency.length > 0
      ? await manySlotStage(model, options, hp.nLayer, hp.V, deadline)
      : undefined;
    Object.assign(figures, many?.figures);
    const split = options.split === undefined
      ? undefined
      : await splitFigure(model, options, options.split, hp.nLayer, hp.V, deadline);
    return {
      backend,
      gpu,
      adapter,
      openSeconds: opened.seconds,
      manySlotsOpenSeconds: many?.openSeconds,
      maxBatch: opened.stage.maxBatch,
      figures,
      split,
    };
  } finally {
    model.close();
  }
}

const STAGE_BENCH = {
  name: "Stage bench",
  usage: "deno run -A bench/stage_bench.ts",
  about: "One engine's bench figures as JSON on stdout (started by bench/decode.ts).",
  flags: {
    model: requiredFlag(text("PATH"), "the GGUF file"),
    backend: flag(oneOf(BACKENDS), "the engine", "gpu"),
    gpu: flag(oneOf<ProviderName>(["builtin", "dawn"]), "the WebGPU provider", "builtin"),
    pp: flag(listOf(whole(1)), "prefill lengths", [512, 2048]),
    tg: flag(whole(1), "decode steps", 128),
    slots: flag(whole(1), "slots decoding greedily at once for the aggregate figure", 2),
    concurrency: flag(
      listOf(whole(0)),
      "sequences sampled at once, each its own seed, on a stage of that many slots (0: none)",
      [0],
    ),
    at: flag(whole(0), "also decode tg tokens after a prefix of this many positions (0: none)", 0),
    drafts: flag(
      listOf(whole(0)),
      "drafts a verify run takes, for tgN-verifyK-kept/-refused (0: none)",
      [0],
    ),
    split: flag(whole(1), "also decode through layers 0:K here + K:n in a worker"),
    runs: flag(whole(1), "timed runs per figure", DEFAULT_RUNS),
    seed: flag(whole(0), "seed of the prompt ids", 1),
    "deadline-s": flag(whole(1), "stop starting measurements after S seconds", 600),
  },
} satisfies Command<FlagTable>;

if (import.meta.main) {
  await runCommand(STAGE_BENCH, async (values) => {
    const report = await benchStage({
      model: values.model,
      backend: values.backend,
      gpu: values.gpu,
      pp: values.pp,
      tg: values.tg,
      slots: values.slots,
      concurrency: values.concurrency.filter((s) => s > 0),
      at: values.at,
      drafts: values.drafts.filter((k) => k > 0),
      split: values.split,
      runs: values.runs,
      seed: values.seed,
      deadlineS: values["deadline-s"],
    });
    console.log(JSON.stringify(report));
  });
}
