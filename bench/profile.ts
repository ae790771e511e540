// Where a step's GPU time goes, per kernel: one whole-model GPU stage, one prefill chunk (at
// position 0, or --at deep in a long prompt) and single-token decode steps as the server runs them
// (LM head for the last position alone), of one greedy sequence or --sequences N sampled at once,
// every dispatch timed by a DispatchProfiler.
//
//   deno run -A bench/profile.ts --model M.gguf [--gpu builtin|dawn] [--allow-software-gpu]
//                                [--prefill 512] [--at 0] [--decode 32] [--sequences 1]

import { openGpuStage, type StepProfile } from "../engine/gpu/gpu_stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { type GpuContext, openGpu } from "../engine/gpu/device.ts";
import { DispatchProfiler, type ProfiledStep } from "../engine/gpu/profiler.ts";
import { readHParams } from "../engine/hparams.ts";
import { PROVIDER_CHOICES } from "../engine/gpu/provider.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  requiredFlag,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../lib/cli.ts";
import { BENCH_SAMPLING, seededIds, timeConcurrentDecode } from "./measure.ts";

/** GPU time of one kernel variant over the steps of a report. */
export interface KernelRow {
  readonly kernel: string;
  readonly dispatches: number;
  readonly ns: number;
}

/** One step (prefill chunk or decode step of every sequence) as the stage timed it (StepProfile). */
export interface StepReport {
  /** Rows of the step: the chunk's positions, or one per sequence decoding. */
  readonly tokens: number;
  /** Dispatches the stage encoded (its own count, StepProfile.dispatches). */
  readonly dispatches: number;
  /** From the step's first run() call until its outputs were back. */
  readonly wallMs: number;
  /**
   * From the step's first run() call to its submit: recording and submitting it, and in a step of
   * several sequences the others' runs joining it (their host-side sampling among them).
   */
  readonly encodeMs: number;
  /** Per-dispatch timings; undefined where the device has no timestamp-query. */
  readonly gpu?: ProfiledStep;
}

export interface ProfileOptions {
  /** Positions of each sequence's profiled chunk, prefilled in one step. */
  readonly prefill: number;
  /**
   * Positions each sequence holds before that chunk (default 0), prefilled in chunks of up to
   * AT_CHUNK: a chunk deep in a long prompt, as a server's chunked prefill runs it.
   */
  readonly at?: number;
  readonly decode: number;
  /**
   * Sequences decoding at once (default 1, greedy): more share each decode step, each sampled
   * with BENCH_SAMPLING from its own seed, as bench/stage_bench.ts's tgNxS-sampled figures run.
   */
  readonly sequences?: number;
  readonly seed?: number;
}

/** Positions a step of the prefix before the profiled chunk takes (ProfileOptions.at). */
export const AT_CHUNK = 2048;

export interface ProfileReport {
  /** The first sequence's chunk (the others are prefilled alike, each from its own seed). */
  readonly prefill: StepReport;
  /** One per decode step, each carrying a row of every sequence. */
  readonly decode: readonly StepReport[];
}

function stepReport(p: StepProfile): StepReport {
  return {
    tokens: p.tokens,
    dispatches: p.dispatches,
    wallMs: p.encodeMs + p.waitMs,
    encodeMs: p.encodeMs,
    gpu: p.kernels,
  };
}

/**
 * Opens all layers of `model` on `gpu` (a slot per sequence, context at + prefill + decode),
 * prefills each sequence's prompt of seeded ids (seed + its slot): `at` positions in chunks of up
 * to AT_CHUNK, then one chunk of `prefill`; then runs `decode` steps of every sequence from
 * position at + prefill (timeConcurrentDecode), each asking the logits of its last position alone
 * as the server's scheduler does, and returns the first sequence's chunk and each decode step.
 */
export async function profileModel(
  model: GgufModel,
  gpu: GpuContext,
  options: ProfileOptions,
): Promise<ProfileReport> {
  const { prefill, decode, sequences = 1, seed = 1, at = 0 } = options;
  if (
    !Number.isInteger(prefill) || prefill < 1 || !Number.isInteger(decode) || decode < 0 ||
    !Number.isInteger(sequences) || sequences < 1 || !Number.isInteger(at) || at < 0
  ) {
    throw new RangeError(
      `Cannot profile a prefill of ${prefill} at ${at} and ${decode} decode steps of ${sequences} sequences: expected prefill ≥ 1, at ≥ 0, decode ≥ 0, sequences ≥ 1`,
    );
  }
  const prefixSteps = Math.ceil(at / AT_CHUNK);
  const hp = readHParams(model.metadata);
  const profiler = gpu.features.timestamps ? new DispatchProfiler(gpu) : undefined;
  const samples: StepProfile[] = [];
  const stage = await openGpuStage(model, gpu, {
    first: 0,
    end: hp.nLayer,
    slots: sequences,
    ctx: at + prefill + decode,
    // A decode step takes a row of every sequence.
    maxBatch: Math.max(prefill, sequences, at > 0 ? AT_CHUNK : 1),
    // The sequences' runs share each step, as the server's do where maps are cheap.
    shareSteps: true,
    profile: (p) => samples.push(p),
    dispatchProfiler: profiler,
    log: () => {},
  });
  try {
    for (let slot = 0; slot < sequences; slot++) {
      const ids = seededIds(at + prefill, hp.V, seed + slot);
      for (let p = 0; p < at; p += AT_CHUNK) {
        const end = Math.min(p + AT_CHUNK, at);
        await stage.run(slot, { kind: "ids", ids: ids.subarray(p, end) }, end - p, p, {
          logits: "none",
        });
      }
      await stage.run(slot, { kind: "ids", ids: ids.subarray(at) }, prefill, at, {
        logits: "last",
      });
    }
    const firsts = Array.from(seededIds(sequences, hp.V, seed + sequences));
    const sampling = sequences > 1 ? BENCH_SAMPLING : undefined;
    await timeConcurrentDecode([stage], firsts, decode, sampling, seed, at + prefill);
    const prompts = sequences * (prefixSteps + 1);
    if (samples.length !== prompts + decode) {
      throw new Error(
        `Cannot profile ${sequences} sequences: their prompts and ${decode} decode steps ran as ${samples.length} steps, expected ${
          prompts + decode
        }`,
      );
    }
    const reports = samples.map(stepReport);
    return { prefill: reports[prefixSteps], decode: reports.slice(prompts) };
  } finally {
    stage.close();
    profiler?.destroy();
  }
}

/** GPU time per kernel variant over `steps`, largest first. */
export function kernelRows(steps: readonly ProfiledStep[]): KernelRow[] {
  const rows = new Map<string, { dispatches: number; ns: number }>();
  for (const step of steps) {
    for (const d of step.dispatches) {
      const row = rows.get(d.kernel) ?? { dispatches: 0, ns: 0 };
      row.dispatches++;
      row.ns += d.endNs - d.startNs;
      rows.set(d.kernel, row);
    }
  }
  return [...rows].map(([kernel, r]) => ({ kernel, ...r })).sort((a, b) =>
    b.ns - a.ns || a.kernel.localeCompare(b.kernel)
  );
}

function mean(values: readonly number[]): number {
  return values.reduce((s, v) => s + v, 0) / Math.max(values.length, 1);
}

const ms = (v: number) => `${v.toFixed(3)} ms`;

/**
 * The summary and kernel table of `steps` (one prefill chunk, or the decode steps averaged):
 * per kernel the dispatches and µs per step, and their share of GPU busy time and of wall time.
 * Wall − GPU busy is what the step spent outside kernels: launch gaps, encoding, readback.
 */
export function formatSteps(title: string, steps: readonly StepReport[]): string {
  const n = steps.length;
  const wall = mean(steps.map((s) => s.wallMs));
  const lines = [
    `${title}: ${n} run${n === 1 ? "" : "s"} of ${steps[0]?.tokens ?? 0} token(s); per run: wall ${
      ms(wall)
    }, encode ${ms(mean(steps.map((s) => s.encodeMs)))}, ${
      mean(steps.map((s) => s.dispatches))
    } dispatches`,
  ];
  const timed = steps.flatMap((s) => s.gpu ? [s.gpu] : []);
  if (timed.length !== n || n === 0) {
    lines.push("  (no timestamp-query on this device: wall times only)");
    return lines.join("\n");
  }
  const rows = kernelRows(timed);
  const busyMs = rows.reduce((s, r) => s + r.ns, 0) / 1e6 / n;
  const spanMs = mean(timed.map((t) => t.spanNs)) / 1e6;
  lines.push(
    `  GPU span ${ms(spanMs)}, GPU busy ${ms(busyMs)}, outside kernels (wall − busy) ${
      ms(wall - busyMs)
    } = ${(100 * (wall - busyMs) / wall).toFixed(1)}% of wall`,
  );
  const width = Math.max(6, ...rows.map((r) => r.kernel.length));
  const header = ["kernel".padEnd(width), "dispatches", "total µs", "% busy", "% wall"];
  lines.push(`  ${header.join("  ")}`);
  for (const r of rows) {
    const us = r.ns / 1e3 / n;
    lines.push(
      `  ${r.kernel.padEnd(width)}  ${String(r.dispatches / n).padStart(10)}  ${
        us.toFixed(1).padStart(8)
      }  ${(100 * us / 1e3 / busyMs).toFixed(1).padStart(6)}  ${
        (100 * us / 1e3 / wall).toFixed(1).padStart(6)
      }`,
    );
  }
  lines.push(
    `  ${"sum".padEnd(width)}  ${
      String(timed.reduce((s, t) => s + t.dispatches.length, 0) / n)
        .padStart(10)
    }  ${(busyMs * 1e3).toFixed(1).padStart(8)}`,
  );
  return lines.join("\n");
}

/** One line per decode step: how wall, span and busy time move along the context. */
export function formatDecodeSteps(steps: readonly StepReport[], prefill: number): string {
  return steps.map((s, i) => {
    const busy = s.gpu ? s.gpu.dispatches.reduce((t, d) => t + d.endNs - d.startNs, 0) / 1e6 : 0;
    const gpu = s.gpu ? `, GPU span ${ms(s.gpu.spanNs / 1e6)}, busy ${ms(busy)}` : "";
    return `  position ${prefill + i}: wall ${ms(s.wallMs)}${gpu}`;
  }).join("\n");
}

const PROFILE = {
  name: "Profile",
  usage: "deno run -A bench/profile.ts",
  about: "GPU time per kernel of one whole-model GPU stage: one prefill chunk, then " +
    "single-token decode steps, as the server runs them (logits of the last position only), " +
    "of one greedy sequence or of several sampled sequences sharing each step.",
  flags: {
    model: requiredFlag(text("PATH"), "the GGUF file"),
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "builtin"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
    prefill: flag(whole(1), "prefill chunk length", 512),
    at: flag(
      whole(0),
      `positions before the profiled chunk, prefilled in chunks of up to ${AT_CHUNK}`,
      0,
    ),
    decode: flag(whole(0), "single-token decode steps after it", 32),
    sequences: flag(
      whole(1),
      "sequences decoding at once, each after its own prompt; more than 1: sampled at " +
        "temperature 0.7, each its own seed, sharing each step",
      1,
    ),
    seed: flag(whole(0), "seed of the prompts' ids and of the sampling", 1),
  },
} satisfies Command<FlagTable>;

async function main(flags: FlagValues<typeof PROFILE.flags>): Promise<void> {
  const { prefill, decode, sequences, at } = flags;
  const gpu = await openGpu({
    gpu: flags.gpu,
    allowSoftware: flags["allow-software-gpu"],
  });
  if (!gpu.features.timestamps) {
    console.log(`The adapter has no timestamp-query (${gpu.summary}): printing wall times only.`);
  }
  const model = await openGguf(flags.model);
  try {
    const report = await profileModel(model, gpu, {
      prefill,
      at,
      decode,
      sequences,
      seed: flags.seed,
    });
    console.log(`GPU: ${gpu.summary}\nmodel: ${flags.model}\n`);
    console.log(formatSteps(at > 0 ? `prefill at ${at}` : "prefill", [report.prefill]));
    if (report.decode.length) {
      const title = sequences > 1
        ? `decode (mean per step of ${sequences} sampled sequences)`
        : "decode (mean per step)";
      console.log(`\n${formatSteps(title, report.decode)}`);
      console.log(formatDecodeSteps(report.decode, at + prefill));
    }
    console.log(
      "\nEach dispatch runs in a compute pass of its own while profiled, so wall times are an upper bound of the unprofiled ones.",
    );
  } finally {
    model.close();
    gpu.device.destroy();
  }
}

if (import.meta.main) await runCommand(PROFILE, main);
