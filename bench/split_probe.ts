// Where a split decode step's time goes: the whole model in one stage, then layers 0:k and k:n
// both in this process (no wire), then k:n in a worker over loopback; median ms per step and half,
// and for each GPU stage of this process where its run went (encode, submit, wait, GPU span).
//
//   deno run -A bench/split_probe.ts --model M.gguf [--gpu dawn|builtin] [--steps 128]
//     [--rows whole,local,device,worker] [--unpaced] [--trace-polls N]

import { openGguf } from "../engine/gguf/read.ts";
import { readHParams } from "../engine/hparams.ts";
import { type Backend, BACKENDS, openLocalStage } from "../engine/open_stage.ts";
import { PROVIDER_CHOICES, type ProviderChoice } from "../engine/gpu/provider.ts";
import { isDawnPoll, paceDawnPolls } from "../engine/gpu/dawn.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import type { StepProfile } from "../engine/gpu/gpu_stage.ts";
import type { Stage } from "../engine/stage.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  listOf,
  oneOf,
  requiredFlag,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../lib/cli.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import { median, timeDecode } from "./measure.ts";
import { startWorker } from "./split.ts";

/** Median ms of a greedy decode step through `stages`, and of each stage's share. */
export interface ProbeRow {
  readonly what: string;
  readonly stepMs: number;
  /** Per stage, in order (one entry for the unsplit stage). */
  readonly stageMs: readonly number[];
  /** Per stage, the medians of its runs' profiles (GPU stages of this process only). */
  readonly profiles: readonly (RunBreakdown | undefined)[];
}

/** Medians over a stage's timed runs, ms: where a run's time went (engine/gpu/gpu_stage.ts). */
export interface RunBreakdown {
  /** From the call to submit's return: input written, step taken, submitted. */
  readonly encodeMs: number;
  /** Of encodeMs, handing the step to the provider and queue.submit. */
  readonly submitMs: number;
  /** From submit until the outputs were read back. */
  readonly waitMs: number;
  /** The GPU's span of the step (timestamps). */
  readonly gpuMs: number;
}

function breakdown(samples: readonly StepProfile[]): RunBreakdown | undefined {
  if (!samples.length) return undefined;
  const of = (f: (p: StepProfile) => number) => median(samples.map(f));
  return {
    encodeMs: of((p) => p.encodeMs),
    submitMs: of((p) => p.submitMs),
    waitMs: of((p) => p.waitMs),
    gpuMs: of((p) => p.gpuMs ?? NaN),
  };
}

/**
 * `steps` greedy single-token steps from position 0 (bench/measure.ts timeDecode), twice: the
 * first pass warms the slot's kernels and the stages' encode-ahead, the second is timed, each
 * stage's run on its own; a step is the sum of its stages' runs.
 */
export async function timeSteps(
  stages: readonly Stage[],
  steps: number,
  what: string,
  profiles: ReadonlyMap<Stage, StepProfile[]> = new Map(),
  onTimedRun: (stage: number, start: number, end: number) => void = () => {},
): Promise<ProbeRow> {
  let timing = false;
  const times: number[][] = stages.map(() => []);
  const timed = stages.map((stage, i) =>
    new Proxy(stage, {
      get(target, key) {
        if (key !== "run") return Reflect.get(target, key, target);
        return async (...args: Parameters<Stage["run"]>) => {
          const t = performance.now();
          const out = await target.run(...args);
          const end = performance.now();
          times[i].push(end - t);
          if (timing) onTimedRun(i, t, end);
          return out;
        };
      },
    })
  );
  await timeDecode(timed, 1, steps);
  for (const t of times) t.length = 0;
  for (const samples of profiles.values()) samples.length = 0;
  timing = true;
  await timeDecode(timed, 1, steps);
  const step = times[0].map((_, s) => times.reduce((sum, t) => sum + t[s], 0));
  return {
    what,
    stepMs: median(step),
    stageMs: times.map(median),
    profiles: stages.map((stage) => breakdown(profiles.get(stage) ?? [])),
  };
}

const PROBE = {
  name: "Split probe",
  usage: "deno run -A bench/split_probe.ts",
  about: "Median decode step of the whole model in one stage, of layers 0:k + k:n both in this " +
    "process, and of k:n in a worker over loopback: what a split costs and where.",
  flags: {
    model: requiredFlag(text("PATH"), "the GGUF file"),
    backend: flag(oneOf(BACKENDS), "the engine", "gpu"),
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "dawn"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
    split: flag(whole(1), "k: the first stage's layers are 0:k (default n/2)"),
    steps: flag(whole(1), "timed decode steps a figure (after as many untimed)", 128),
    rows: flag(
      listOf(oneOf(["whole", "local", "device", "worker"] as const)),
      "the figures, in order: one stage; two in this process, each on its own device (local) " +
        "or both on one (device); the second in a worker",
      ["whole", "local", "worker"],
    ),
    "trace-polls": flag(
      whole(0),
      "print when Dawn polled during this many timed steps of each row (submit, polls, outputs " +
        "back), the first stage's runs",
      0,
    ),
    unpaced: switchFlag(
      "Dawn polls on every event-loop turn in this process (engine/gpu/dawn.ts paceDawnPolls): " +
        "what the pacer adds to a wait",
    ),
  },
} satisfies Command<FlagTable>;

/** Every row of the probe, in order; the worker and the stages are closed on return. */
export async function probeSplit(
  flags: FlagValues<typeof PROBE.flags>,
  log: (line: string) => void = () => {},
): Promise<ProbeRow[]> {
  const model = await openGguf(flags.model);
  const stages: Stage[] = [];
  const profiles = new Map<Stage, StepProfile[]>();
  let worker;
  try {
    const { nLayer } = readHParams(model.metadata);
    const k = flags.split ?? Math.floor(nLayer / 2);
    const ctx = Math.max(2, flags.steps);
    const engine = {
      backend: flags.backend as Backend,
      gpu: flags.gpu,
      allowSoftwareGpu: flags["allow-software-gpu"],
    };
    if (flags.rows.includes("device") && engine.backend !== "gpu") {
      throw new RangeError("Cannot put two stages on one device with the reference backend");
    }
    // A GPU stage opens its own device unless given one.
    const open = async (first: number, end: number, device?: GpuContext) => {
      const samples: StepProfile[] = [];
      const stage = engine.backend === "gpu"
        ? await openProfiled(model, engine, { first, end, ctx }, samples, device)
        : await openLocalStage(model, { engine, first, end, slots: 1, ctx });
      stages.push(stage);
      profiles.set(stage, samples);
      return stage;
    };
    const { steps } = flags;
    const traced = flags["trace-polls"];
    // Installed over the pacer once Dawn has loaded (with the first stage): afterOpen().
    let polls: number[] | undefined;
    // A row's first-stage runs to trace: start and end (performance.now() ms).
    let runs: { start: number; end: number }[] = [];
    const onRun = (stage: number, start: number, end: number) => {
      if (stage === 0 && runs.length < traced) runs.push({ start, end });
    };
    const report = (row: ProbeRow, first: Stage) => {
      if (polls) printTrace(row.what, runs, profiles.get(first) ?? [], polls, log);
      runs = [];
      return row;
    };
    const halves = `0:${k} + ${k}:${nLayer}`;
    const rows: ProbeRow[] = [];
    let head: Stage | undefined;
    // Dawn turns its pacing on when it loads, so this goes after a row's stages have opened.
    const afterOpen = () => {
      if (flags.unpaced && engine.gpu === "dawn") paceDawnPolls(false);
      if (traced && engine.gpu === "dawn") polls ??= tracePolls();
    };
    for (const row of flags.rows) {
      if (row === "whole") {
        const whole = await open(0, nLayer);
        afterOpen();
        rows.push(report(
          await timeSteps([whole], steps, `layers 0:${nLayer} in one stage`, profiles, onRun),
          whole,
        ));
      } else if (row === "local") {
        head ??= await open(0, k);
        const tail = await open(k, nLayer);
        afterOpen();
        rows.push(report(
          await timeSteps([head, tail], steps, `${halves}, both in this process`, profiles, onRun),
          head,
        ));
      } else if (row === "device") {
        const device = await openDevice(engine);
        const both = [await open(0, k, device), await open(k, nLayer, device)];
        afterOpen();
        const what = `${halves}, both on one device of this process`;
        rows.push(report(await timeSteps(both, steps, what, profiles, onRun), both[0]));
      } else {
        head ??= await open(0, k);
        worker = await startWorker({
          model: flags.model,
          first: k,
          end: nLayer,
          backend: flags.backend,
          gpu: flags.gpu,
          slots: 1,
          ctx,
          startTimeoutS: 600,
          log,
        });
        const remote = await connectRemoteStage(worker.address, { local: head, model });
        stages.push(remote);
        afterOpen();
        rows.push(report(
          await timeSteps(
            [head, remote],
            steps,
            `${halves} in a worker over loopback`,
            profiles,
            onRun,
          ),
          head,
        ));
      }
    }
    return rows;
  } finally {
    for (const stage of stages.reverse()) stage.close();
    await worker?.stop();
    model.close();
  }
}

/**
 * Every Dawn poll of this process from now on, as performance.now() ms: setImmediate wrapped
 * over the pacer (engine/gpu/dawn.ts), each poll callback handed on looking as native as before.
 */
function tracePolls(): number[] {
  const times: number[] = [];
  const paced = globalThis.setImmediate;
  const traced = (callback: (...args: unknown[]) => void, ...args: unknown[]) => {
    if (!isDawnPoll(callback)) return paced(callback, ...args);
    const recorded = ((...a: unknown[]) => {
      times.push(performance.now());
      callback(...a);
    }).bind(null);
    return paced(Object.defineProperty(recorded, "name", { value: "" }), ...args);
  };
  (globalThis as { setImmediate: unknown }).setImmediate = traced;
  return times;
}

/** Per traced run: when it submitted, each Dawn poll while it ran, when its outputs came back. */
function printTrace(
  what: string,
  runs: readonly { start: number; end: number }[],
  samples: readonly StepProfile[],
  polls: readonly number[],
  log: (line: string) => void,
): void {
  log(`polls of the first stage (${what}), ms from the run's call:`);
  runs.forEach((run, i) => {
    const at = (t: number) => (t - run.start).toFixed(3);
    const during = polls.filter((t) => t >= run.start && t <= run.end);
    const submitted = samples[i] ? ` submitted ${samples[i].encodeMs.toFixed(3)},` : "";
    const gpu = samples[i]?.gpuMs?.toFixed(3) ?? "?";
    log(
      `  run ${i}:${submitted} GPU span ${gpu}, back ${at(run.end)}; polls ${
        during.map(at).join(" ")
      }`,
    );
  });
}

/** A device of the chosen provider (imported on demand, as openLocalStage does). */
async function openDevice(
  engine: { gpu: ProviderChoice; allowSoftwareGpu: boolean },
): Promise<GpuContext> {
  const { openGpu } = await import("../engine/gpu/device.ts");
  return await openGpu({ gpu: engine.gpu, allowSoftware: engine.allowSoftwareGpu });
}

/**
 * A GPU stage of one slot on `device` (default a device of its own), reporting every run's
 * profile into `samples`.
 */
async function openProfiled(
  model: Awaited<ReturnType<typeof openGguf>>,
  engine: { gpu: ProviderChoice; allowSoftwareGpu: boolean },
  range: { first: number; end: number; ctx: number },
  samples: StepProfile[],
  device?: GpuContext,
): Promise<Stage> {
  const { openGpuStage } = await import("../engine/gpu/gpu_stage.ts");
  const gpu = device ?? await openDevice(engine);
  return await openGpuStage(model, gpu, {
    ...range,
    slots: 1,
    profile: (p) => samples.push(p),
  });
}

const ms = (v: number) => v.toFixed(3);

async function main(flags: FlagValues<typeof PROBE.flags>): Promise<void> {
  for (const row of await probeSplit(flags, (line) => console.error(line))) {
    const parts = row.stageMs.length > 1 ? ` (${row.stageMs.map(ms).join(" + ")})` : "";
    console.log(`${row.what}: ${ms(row.stepMs)} ms a step${parts}`);
    row.profiles.forEach((p, i) => {
      if (!p) return;
      console.log(
        `  stage ${i}: run ${ms(row.stageMs[i])} = encode ${ms(p.encodeMs)} (submit ${
          ms(p.submitMs)
        }) + wait ${ms(p.waitMs)} (GPU span ${ms(p.gpuMs)}) + after ${
          ms(row.stageMs[i] - p.encodeMs - p.waitMs)
        }`,
      );
    });
  }
}

if (import.meta.main) await runCommand(PROBE, main);
