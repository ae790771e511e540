// Where a GPU step's wall time goes on the host: record+submit, wait, and the event-loop pumping
// of the provider (setImmediate turns, their gaps and lengths, CPU time), with outliers logged.
// A diagnostic beside bench/decode.ts: one whole-model stage, timed loading, then step phases of
// the bench's decode workloads (per step, sampled, fused greedy, slots at once).
//
//   deno run -A --v8-flags=--trace-gc bench/host_probe.ts --model M.gguf --gpu dawn
//     [--pp 512] [--tg 64] [--runs 5] [--slots 2] [--variants default,unpaced]
//     [--upload-gb 2] [--no-stage]
//
// `unpaced` runs the same workload with Dawn polling on every event-loop turn, as its binding
// does by itself (engine/gpu/dawn.ts paceDawnPolls). --trace-gc interleaves V8's collections with
// the outlier lines on stdout. --upload-gb times ways of filling GPU buffers from the model file.

import {
  createStorage,
  FILL_PIECE_BYTES,
  FillStaging,
  fillStorage,
} from "../engine/gpu/buffers.ts";
import { paceDawnPolls } from "../engine/gpu/dawn.ts";
import { type GpuContext, openGpu } from "../engine/gpu/device.ts";
import { openGpuStage, type StepProfile } from "../engine/gpu/gpu_stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { readHParams } from "../engine/hparams.ts";
import { PROVIDER_CHOICES } from "../engine/gpu/provider.ts";
import {
  type Command,
  decimal,
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
import {
  BENCH_SAMPLING,
  median,
  seededIds,
  timeConcurrentDecode,
  timeDecode,
  timeFusedDecode,
  timeSampledDecode,
} from "./measure.ts";
import type { Stage } from "../engine/stage.ts";
import { FUSED_STEPS } from "../lib/scheduler/scheduler.ts";
import process from "node:process";

/** setImmediate turns seen since start: how many, how late each ran, how long each took. */
class ImmediateMeter {
  turns = 0;
  maxGapMs = 0;
  maxRunMs = 0;
  busyMs = 0;

  install(): void {
    const original = globalThis.setImmediate;
    const wrapped = (cb: (...args: unknown[]) => void, ...args: unknown[]) => {
      const queued = performance.now();
      return original(() => {
        const start = performance.now();
        this.turns++;
        this.maxGapMs = Math.max(this.maxGapMs, start - queued);
        try {
          cb(...args);
        } finally {
          const ran = performance.now() - start;
          this.busyMs += ran;
          this.maxRunMs = Math.max(this.maxRunMs, ran);
        }
      });
    };
    (globalThis as { setImmediate: unknown }).setImmediate = wrapped;
  }

  reset(): void {
    this.turns = 0;
    this.maxGapMs = 0;
    this.maxRunMs = 0;
    this.busyMs = 0;
  }
}

/** One timed run with what happened on the host while it was in flight. */
interface RunSample {
  readonly what: string;
  readonly wallMs: number;
  /** Stage's own split (the last step of the run). */
  readonly encodeMs?: number;
  readonly waitMs?: number;
  readonly gpuMs?: number;
  readonly turns: number;
  readonly maxGapMs: number;
  readonly maxRunMs: number;
  readonly pumpMs: number;
  /** Process CPU time (user + system) over the run. */
  readonly cpuMs: number;
  readonly atMs: number;
}

function log(line: string): void {
  console.log(`[probe ${(performance.now() / 1000).toFixed(3)}s] ${line}`);
}

function describe(s: RunSample): string {
  const f = (x: number | undefined) => x === undefined ? "-" : x.toFixed(2);
  return `${s.what}: wall ${f(s.wallMs)} ms (encode ${f(s.encodeMs)}, wait ${f(s.waitMs)}, gpu ${
    f(s.gpuMs)
  }), immediates ${s.turns} (max gap ${f(s.maxGapMs)}, max run ${f(s.maxRunMs)}, total ${
    f(s.pumpMs)
  }), cpu ${f(s.cpuMs)} ms`;
}

/**
 * Load phases: file reads, queue writes, when the weights were in, what the open spent after
 * them (the kernels compile while the weights load), and the wait for the queue afterwards.
 */
async function timedOpen(model: GgufModel, gpu: GpuContext, ctx: number, slots: number) {
  let readMs = 0;
  let readBytes = 0;
  let writeMs = 0;
  const read = model.readTensorBytes.bind(model);
  (model as { readTensorBytes: GgufModel["readTensorBytes"] }).readTensorBytes = async (
    name,
    start,
    length,
    into,
  ) => {
    const t = performance.now();
    const out = await read(name, start, length, into);
    readMs += performance.now() - t;
    readBytes += length;
    return out;
  };
  const queue = gpu.device.queue;
  const write = queue.writeBuffer.bind(queue);
  (queue as { writeBuffer: unknown }).writeBuffer = (
    ...args: Parameters<GPUQueue["writeBuffer"]>
  ) => {
    const t = performance.now();
    write(...args);
    writeMs += performance.now() - t;
  };
  const hp = readHParams(model.metadata);
  const samples: StepProfile[] = [];
  const start = performance.now();
  // The stage reports its weights when they are all in; its kernels compiled meanwhile.
  let weightsIn = NaN;
  const stage = await openGpuStage(model, gpu, {
    first: 0,
    end: hp.nLayer,
    slots,
    ctx,
    profile: (p) => samples.push(p),
    log: (line) => {
      if (line.startsWith("GPU weights")) weightsIn = performance.now();
      if (!line.startsWith("Loading weights")) log(line);
    },
  });
  const opened = performance.now();
  await queue.onSubmittedWorkDone();
  const drained = performance.now();
  (queue as { writeBuffer: unknown }).writeBuffer = write;
  (model as { readTensorBytes: unknown }).readTensorBytes = read;
  log(
    `open: ${((opened - start) / 1000).toFixed(2)} s (file reads ${
      (readMs / 1000).toFixed(2)
    } s for ${(readBytes / 1e9).toFixed(2)} GB, writeBuffer ${
      (writeMs / 1000).toFixed(2)
    } s), queue drained ${((drained - opened) / 1000).toFixed(2)} s later; weights in at ${
      ((weightsIn - start) / 1000).toFixed(2)
    } s, the kernels and the rest of the open took ${
      ((opened - weightsIn) / 1000).toFixed(2)
    } s after them`,
  );
  return { stage, samples, hp, openSeconds: (opened - start) / 1000 };
}

async function probeSteps(
  model: GgufModel,
  gpu: GpuContext,
  flags: ProbeFlags,
  meter: ImmediateMeter,
): Promise<void> {
  const { stage, samples, hp } = await timedOpen(
    model,
    gpu,
    Math.max(flags.pp, flags.tg),
    flags.slots,
  );
  const all: RunSample[] = [];
  async function timed(what: string, body: () => Promise<unknown>): Promise<RunSample> {
    meter.reset();
    const before = samples.length;
    const cpu = process.cpuUsage();
    const atMs = performance.now();
    await body();
    const wallMs = performance.now() - atMs;
    const used = process.cpuUsage(cpu);
    const last = samples.length > before ? samples.at(-1) : undefined;
    const s: RunSample = {
      what: `${variant} ${what}`,
      wallMs,
      encodeMs: last?.encodeMs,
      waitMs: last?.waitMs,
      gpuMs: last?.gpuMs,
      turns: meter.turns,
      maxGapMs: meter.maxGapMs,
      maxRunMs: meter.maxRunMs,
      pumpMs: meter.busyMs,
      cpuMs: (used.user + used.system) / 1000,
      atMs,
    };
    all.push(s);
    return s;
  }
  const ids = seededIds(flags.pp, hp.V, 1);
  let variant = "";
  for (variant of flags.variants) {
    if (variant === "unpaced") paceDawnPolls(false);
    const pp: RunSample[] = [];
    for (let r = 0; r <= flags.runs; r++) {
      const s = await timed(
        `pp${flags.pp} run ${r}`,
        // The LM head for the last position alone, as the server (and timePrefill) prefill.
        () => stage.run(0, { kind: "ids", ids }, ids.length, 0, { logits: "last" }),
      );
      if (r > 0) pp.push(s);
    }
    summarize(`${variant} pp${flags.pp}`, pp);
    let greedy: Uint32Array | undefined;
    for (const mode of decodeModes(flags.slots)) {
      const runs: RunSample[] = [];
      const steps: StepProfile[] = [];
      for (let r = 0; r <= Math.min(flags.runs, 3); r++) {
        const before = samples.length;
        let fed: readonly Uint32Array[] = [];
        const s = await timed(`${mode} run ${r}`, async () => {
          fed = await decodeRun(mode, stage, ids, flags.tg);
        });
        if (mode === "tg") greedy ??= fed[0];
        else if (mode !== "sampled" && greedy && fed[0].some((id, i) => id !== greedy![i])) {
          log(`MISMATCH ${variant} ${mode} run ${r}: slot 0 fed other ids than per-step greedy`);
        }
        if (r > 0) {
          runs.push(s);
          steps.push(...samples.slice(before));
        }
      }
      summarize(`${variant} ${mode}${flags.tg}`, runs);
      logSteps(`${variant} ${mode}${flags.tg}`, runs, steps);
    }
    if (variant === "unpaced" && gpu.provider === "dawn") paceDawnPolls(true);
  }
  stage.close();
}

/** The decode workloads of the bench: per step, sampled, fused greedy, and slots at once. */
function decodeModes(slots: number): string[] {
  return ["tg", "sampled", "fused", ...(slots > 1 ? [`x${slots}-tg`] : [])];
}

/**
 * One run of a decode mode from position 0, as bench/stage_bench.ts times it; the ids fed per
 * slot (every greedy mode's slot 0 must feed the same ones: a check of the engine on this GPU).
 */
async function decodeRun(
  mode: string,
  stage: Stage,
  ids: Uint32Array,
  n: number,
): Promise<readonly Uint32Array[]> {
  if (mode === "tg") return [(await timeDecode([stage], ids[0], n)).fed];
  if (mode === "sampled") {
    return [(await timeSampledDecode([stage], ids[0], n, BENCH_SAMPLING, 1)).fed];
  }
  if (mode === "fused") return [(await timeFusedDecode(stage, ids[0], n, FUSED_STEPS)).fed];
  const slots = Number(mode.slice(1, mode.indexOf("-")));
  return (await timeConcurrentDecode([stage], Array.from(ids.subarray(0, slots)), n)).fed;
}

/**
 * Where a decode mode's wall goes per token: the median run's wall over its tokens, against the
 * medians over its submissions of recording (JS), handing over + submit, waiting, and GPU span.
 */
function logSteps(what: string, runs: readonly RunSample[], steps: readonly StepProfile[]): void {
  if (!runs.length || !steps.length) return;
  const tokens = steps.reduce((s, p) => s + p.tokens, 0) / runs.length;
  const perRun = steps.length / runs.length;
  const wall = median(runs.map((r) => r.wallMs)) / tokens;
  const med = (f: (p: StepProfile) => number) => median(steps.map(f));
  const gpu = steps.every((p) => p.gpuMs !== undefined)
    ? median(steps.map((p) => p.gpuMs! / p.tokens))
    : NaN;
  const f = (x: number) => x.toFixed(3);
  log(
    `${what}: ${tokens} tokens in ${perRun} submissions a run; per token wall ${f(wall)} ms, ` +
      `GPU span ${f(gpu)} ms, outside the GPU ${f(wall - gpu)} ms; per submission: record ${
        f(med((p) => p.encodeMs - p.submitMs))
      }, submit ${f(med((p) => p.submitMs))}, wait ${f(med((p) => p.waitMs))}, GPU span ${
        f(med((p) => p.gpuMs ?? NaN))
      } ms, ${med((p) => p.dispatches)} dispatches`,
  );
}

/** Median and max of the walls, and every run over 2x the median in full. */
function summarize(what: string, runs: readonly RunSample[]): void {
  if (runs.length === 0) return;
  const walls = runs.map((r) => r.wallMs);
  const med = median(walls);
  const max = Math.max(...walls);
  const pump = median(runs.map((r) => r.turns));
  log(
    `${what}: ${runs.length} runs, wall min ${Math.min(...walls).toFixed(2)} median ${
      med.toFixed(2)
    } max ${max.toFixed(2)} ms (max/median ${(max / med).toFixed(2)}), median immediates ${pump}`,
  );
  for (const r of runs) if (r.wallMs > 2 * med && r.wallMs > 5) log(`  OUTLIER ${describe(r)}`);
}

/** Upload strategies over the first `gb` GB of the model file, each into fresh 1 GiB buffers. */
async function probeUploads(path: string, gpu: GpuContext, gb: number): Promise<void> {
  const piece = FILL_PIECE_BYTES;
  const total = Math.max(1, Math.floor(gb * 2 ** 30 / piece)) * piece;
  const part = Math.min(1 << 30, gpu.limits.maxBufferSize - (gpu.limits.maxBufferSize % 4));
  const file = await Deno.open(path);
  const readInto = async (buf: Uint8Array, offset: number) => {
    await file.seek(offset, Deno.SeekMode.Start);
    let done = 0;
    while (done < buf.length) {
      const n = await file.read(buf.subarray(done));
      if (n === null) throw new Error(`Cannot read ${path}: it ends at ${offset + done}`);
      done += n;
    }
  };
  async function variant(name: string, body: () => Promise<GPUBuffer[]>): Promise<void> {
    const start = performance.now();
    const made = await body();
    await gpu.device.queue.onSubmittedWorkDone();
    const s = (performance.now() - start) / 1000;
    log(
      `upload ${name}: ${(total / 1e9).toFixed(2)} GB in ${s.toFixed(2)} s = ${
        (total / 1e9 / s).toFixed(2)
      } GB/s`,
    );
    for (const b of made) b.destroy();
  }
  await variant("file read only, one reused piece", async () => {
    const buf = new Uint8Array(piece);
    for (let at = 0; at < total; at += buf.length) await readInto(buf, at);
    return [];
  });
  await variant("as before 2026-12-01: read into a fresh piece, then writeBuffer", async () => {
    const out = Array.from(
      { length: Math.ceil(total / part) },
      (_, i) => createStorage(gpu, `before ${i}`, part),
    );
    for (let at = 0; at < total; at += piece) {
      const buf = new Uint8Array(piece);
      await readInto(buf, at);
      gpu.device.queue.writeBuffer(out[Math.floor(at / part)], at % part, buf);
    }
    return out;
  });
  for (const mapped of [true, false]) {
    const how = mapped ? "mapped at creation" : "two reused pieces and writeBuffer";
    await variant(`fillStorage, ${how}`, async () => {
      const out: GPUBuffer[] = [];
      const staging = new FillStaging();
      for (let at = 0; at < total; at += part) {
        const size = Math.min(part, total - at);
        const fill = (dst: Uint8Array, offset: number) => readInto(dst, at + offset);
        out.push(await fillStorage(gpu, `fill ${at}`, size, fill, { mapped, staging }));
      }
      return out;
    });
  }
  file.close();
}

const PROBE = {
  name: "Host probe",
  usage: "deno run -A --v8-flags=--trace-gc bench/host_probe.ts",
  about: "Times each phase of a GPU stage's steps (record+submit, wait) with the provider's " +
    "event-loop pumping and CPU time, logs runs over twice the median, and times the load " +
    "and ways of filling GPU buffers from the model file.",
  flags: {
    model: requiredFlag(text("PATH"), "the GGUF file"),
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "dawn"),
    pp: flag(whole(1), "prefill length", 512),
    tg: flag(whole(1), "decode steps per run", 64),
    runs: flag(whole(1), "timed runs per workload after one warm-up", 5),
    slots: flag(whole(1), "slots decoding at once (1: no concurrent figure)", 2),
    variants: flag(listOf(oneOf(["default", "unpaced"] as const)), "variants to run", [
      "default",
      "unpaced",
    ]),
    "upload-gb": flag(decimal(0, 1000), "GB of the file to upload per fill strategy", 0),
    "no-stage": switchFlag("skip the stage (uploads only)"),
  },
} satisfies Command<FlagTable>;

type ProbeFlags = FlagValues<typeof PROBE.flags>;

async function main(flags: ProbeFlags): Promise<void> {
  const meter = new ImmediateMeter();
  meter.install();
  const gpu = await openGpu({ gpu: flags.gpu, log });
  if (!flags["no-stage"]) {
    const model = await openGguf(flags.model);
    await probeSteps(model, gpu, flags, meter);
    model.close();
  }
  if (flags["upload-gb"] > 0) await probeUploads(flags.model, gpu, flags["upload-gb"]);
  log("done");
}

if (import.meta.main) await runCommand(PROBE, main);
