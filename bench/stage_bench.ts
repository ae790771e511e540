// One engine's figures (pp, tg, tg on several slots, split decode) in a process of its own.
// Spawned by bench/decode.ts once per GPU provider, so that a crash or a leaked device in one
// provider cannot take the other's figures with it; answers JSON on stdout, logs on stderr.

import { openGguf } from "../engine/gguf/read.ts";
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
  type Figure,
  measure,
  seededIds,
  timeConcurrentDecode,
  timeDecode,
  timeFusedDecode,
  timePrefill,
  timeSampledDecode,
} from "./measure.ts";
import { startWorker } from "./split.ts";

export interface StageBenchOptions {
  readonly model: string;
  readonly backend: Backend;
  /** GPU provider; ignored by the reference backend. */
  readonly gpu: ProviderName;
  readonly pp: readonly number[];
  readonly tg: number;
  /** Slots decoding at once for the aggregate figure; 1 leaves it out. */
  readonly slots: number;
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
  readonly maxBatch?: number;
  /** pp<n>, tg<n>, tg<n>-fused, tg<n>-sampled, tg<n>x<slots>; tokens per run inside. */
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

async function openTimed(
  model: GgufModel,
  options: StageBenchOptions,
  first: number,
  end: number,
  slots: number,
): Promise<{ stage: Stage; seconds: number }> {
  const start = performance.now();
  const stage = await openLocalStage(model, {
    engine: { backend: options.backend, gpu: options.gpu },
    first,
    end,
    slots,
    ctx: Math.max(...options.pp, options.tg),
  });
  return { stage, seconds: (performance.now() - start) / 1000 };
}

/** pp, tg and the several-slot tg on one stage owning every layer. */
async function wholeFigures(
  stage: Stage,
  options: StageBenchOptions,
  vocab: number,
  deadline: Deadline,
): Promise<Record<string, Figure>> {
  const figures: Record<string, Figure> = {};
  const { runs, tg, seed } = options;
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
  figures[`tg${tg}`] = await measure(
    `tg${tg}`,
    tg,
    runs,
    async () => (await timeDecode([stage], firsts[0], tg)).seconds,
    deadline,
    log,
  );
  if (stage.decodeGreedy) {
    figures[`tg${tg}-fused`] = await measure(
      `tg${tg} fused`,
      tg,
      runs,
      async () => (await timeFusedDecode(stage, firsts[0], tg, FUSED_STEPS)).seconds,
      deadline,
      log,
    );
  }
  figures[`tg${tg}-sampled`] = await measure(
    `tg${tg} sampled`,
    tg,
    runs,
    async () => (await timeSampledDecode([stage], firsts[0], tg, BENCH_SAMPLING, seed)).seconds,
    deadline,
    log,
  );
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
  let worker;
  let local: Stage | undefined;
  let remote: Stage | undefined;
  try {
    worker = await startWorker({
      model: options.model,
      first: k,
      end: nLayer,
      backend: options.backend,
      gpu: options.gpu,
      slots: options.slots,
      ctx: Math.max(...options.pp, options.tg),
      startTimeoutS: Math.min(Math.max(deadline.left, 1), 900),
      log: (line) => console.error(line),
    });
    const opened = await openTimed(model, options, 0, k, options.slots);
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
      opened = await openTimed(model, options, 0, hp.nLayer, Math.max(1, options.slots));
    } catch (e) {
      log(`open: ${(e as Error).stack}`);
      return { backend, gpu, adapter, figures: {}, error: (e as Error).message };
    }
    log(`opened ${hp.nLayer} layers in ${opened.seconds.toFixed(1)} s`);
    let figures;
    try {
      figures = await wholeFigures(opened.stage, options, hp.V, deadline);
    } finally {
      opened.stage.close();
    }
    const split = options.split === undefined
      ? undefined
      : await splitFigure(model, options, options.split, hp.nLayer, hp.V, deadline);
    return {
      backend,
      gpu,
      adapter,
      openSeconds: opened.seconds,
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
    slots: flag(whole(1), "slots decoding at once for the aggregate figure", 2),
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
      split: values.split,
      runs: values.runs,
      seed: values.seed,
      deadlineS: values["deadline-s"],
    });
    console.log(JSON.stringify(report));
  });
}
