// What the host spends on a decode step: the forward's recording, its encoding for the GPU and its
// submission, timed on Dawn's null backend, where nothing runs on a GPU, so a step's wall time is
// host work alone. Needs no GPU: the same figure on a CI-class machine and on the box's CPU.
//
//   deno run -A bench/host_cost.ts [--layers 40] [--runs 50] [--slots 1,4,16] [--profile]
//
// The model is the tiny preset (qwen35moe, IQ4_XS experts, Q8_0 projections, Q6_K head: the bench
// model's types) deepened to --layers blocks, so a step records as many dispatches as the bench
// model's. A fused step is one of decodeFused's FUSED_STEPS; a shared step runs one token of each
// of S slots (the concurrent figures' steps), each asking for its top 40 as sampled runs do.
// --profile adds the host functions that took the most time (V8's sampling profiler) in the fused
// greedy steps and in the shared steps of the most slots.

import { Session } from "node:inspector/promises";
import { openGpu } from "../engine/gpu/device.ts";
import { type GpuStage, openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { defaultMaxBatch } from "../engine/stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { FUSED_STEPS } from "../lib/scheduler/scheduler.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  listOf,
  runCommand,
  switchFlag,
  whole,
} from "../lib/cli.ts";
import { generateModel, MAX_LAYERS } from "../tools/synth/generate_model.ts";
import { BENCH_SAMPLING, median } from "./measure.ts";

const HOST_COST = {
  name: "Host cost",
  usage: "deno run -A bench/host_cost.ts",
  about: "Times the host's work per decode step (record, encode, submit) on Dawn's null " +
    "backend, where no GPU work runs, for fused steps and for shared steps of several slots.",
  flags: {
    layers: flag(whole(1, MAX_LAYERS), "blocks of the tiny model (the bench model has 40)", 40),
    runs: flag(whole(1, 10_000), "timed calls per workload after as many warm-ups", 50),
    slots: flag(listOf(whole(1, 64)), "slot counts of the shared-step figures", [1, 4, 16]),
    profile: switchFlag("also list the host functions that took the most time"),
  },
} satisfies Command<FlagTable>;

type HostCostFlags = FlagValues<typeof HOST_COST.flags>;

/** Candidates a shared step's runs ask for, as the bench's sampled runs do. */
const TOPK = BENCH_SAMPLING.topK ?? 40;

/** A workload's time a step, ms: the median call's and the fastest's (the least noise). */
interface Cost {
  readonly median: number;
  readonly min: number;
}

function costLine(label: string, c: Cost): string {
  return `  ${label.padEnd(16)} median ${c.median.toFixed(3)}  min ${c.min.toFixed(3)}`;
}

/** `runs` timings of `once` after `runs` untimed ones, each divided by `per`. */
async function timed(runs: number, per: number, once: () => Promise<unknown>): Promise<Cost> {
  const ms: number[] = [];
  for (let i = 0; i < 2 * runs; i++) {
    const t0 = performance.now();
    await once();
    if (i >= runs) ms.push((performance.now() - t0) / per);
  }
  return { median: median(ms), min: Math.min(...ms) };
}

/** Where a one-slot stage's next decodeFused call starts. */
interface Cursor {
  pos: number;
}

/**
 * decodeFused calls of FUSED_STEPS steps, greedy or sampled, from a fixed token (the null backend
 * computes no ids to feed back) at the cursor; ms per step.
 */
async function fusedCost(
  stage: GpuStage,
  at: Cursor,
  runs: number,
  sampled: boolean,
): Promise<Cost> {
  const sampling = { params: BENCH_SAMPLING, draws: new Uint32Array(FUSED_STEPS).fill(1 << 31) };
  const options = sampled ? { topk: TOPK, sampling } : {};
  return await timed(runs, FUSED_STEPS, async () => {
    await stage.decodeFused(0, 1, at.pos, FUSED_STEPS, options);
    at.pos += FUSED_STEPS;
  });
}

/** Shared steps of one token on each of the stage's slots, top-k on each; ms per step. */
async function sharedCost(stage: GpuStage, runs: number): Promise<Cost> {
  let pos = 0;
  return await timed(runs, 1, async () => {
    await Promise.all(
      Array.from(
        { length: stage.slots },
        (_, slot) =>
          stage.run(slot, { kind: "ids", ids: Uint32Array.of(1 + slot) }, 1, pos, {
            logits: "last",
            rows: "decode",
            topk: TOPK,
          }),
      ),
    );
    pos++;
  });
}

/** The functions with the most self time while `work` ran, as lines. */
async function profiled(work: () => Promise<void>): Promise<string[]> {
  const session = new Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.setSamplingInterval", { interval: 50 });
  await session.post("Profiler.start");
  await work();
  const { profile } = await session.post("Profiler.stop");
  session.disconnect();
  const self = new Map<string, number>();
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
  profile.samples?.forEach((id, i) => {
    const frame = nodes.get(id)!.callFrame;
    const where = frame.url ? ` ${frame.url.split("/").slice(-2).join("/")}` : " (native)";
    const name = `${frame.functionName || "(anonymous)"}${where}`;
    self.set(name, (self.get(name) ?? 0) + (profile.timeDeltas?.[i] ?? 0));
  });
  const total = [...self.values()].reduce((a, b) => a + b, 0);
  return [...self].sort((a, b) => b[1] - a[1]).slice(0, 20).map(([name, us]) =>
    `${(100 * us / total).toFixed(1).padStart(5)}%  ${name}`
  );
}

/** Prints a workload's profile lines (profiled) under its name. */
function printProfile(workload: string, lines: readonly string[]): void {
  console.log(`  ${workload}, self time by function:`);
  for (const line of lines) console.log(`    ${line}`);
}

async function main(flags: HostCostFlags): Promise<void> {
  // Dawn reads its options when it loads, at the first openGpu.
  if (Deno.env.get("TANDEM_DAWN_OPTIONS") === undefined) {
    Deno.env.set("TANDEM_DAWN_OPTIONS", "backend=null");
  }
  const gpu = await openGpu({ gpu: "dawn", allowSoftware: true, log: () => {} });
  if (!gpu.summary.includes("null-backend")) {
    throw new Error(
      `Cannot time host work on ${gpu.summary}: its GPU work would count too; unset ` +
        `TANDEM_DAWN_OPTIONS (the bench asks for backend=null itself)`,
    );
  }
  const dir = await Deno.makeTempDir({ prefix: "tandem-host-cost-" });
  const path = `${dir}/tiny-${flags.layers}.gguf`;
  try {
    await generateModel(path, {
      preset: "tiny",
      arch: "qwen35moe",
      quant: "iq4_xs",
      layers: flags.layers,
    });
    const model = await openGguf(path);
    // Each timed or warm-up call takes a step's positions (Dawn's null device holds ~1 GB). A
    // step holds at most maxBatch rows, which defaults to ctx: below one row a slot, a shared
    // step would go as two and the figure would time those.
    const open = (slots: number, perCall: number) => {
      const ctx = 2 * flags.runs * perCall + 2;
      return openGpuStage(model, gpu, {
        first: 0,
        end: flags.layers,
        slots,
        ctx,
        maxBatch: Math.max(slots, defaultMaxBatch(ctx)),
        log: () => {},
      });
    };
    console.log(
      `host cost, tiny qwen35moe iq4_xs of ${flags.layers} layers on ${gpu.summary}, ` +
        `${flags.runs} calls each (ms a step):`,
    );
    const one = await open(1, 3 * FUSED_STEPS);
    await one.run(0, { kind: "ids", ids: Uint32Array.of(1) }, 1, 0, { logits: "last" });
    const at = { pos: 1 };
    console.log(costLine("fused greedy", await fusedCost(one, at, flags.runs, false)));
    console.log(costLine("fused sampled", await fusedCost(one, at, flags.runs, true)));
    if (flags.profile) {
      const lines = await profiled(async () => void await fusedCost(one, at, flags.runs, false));
      printProfile("fused greedy", lines);
    }
    one.close();
    const most = Math.max(...flags.slots);
    for (const s of flags.slots) {
      const stage = await open(s, 1);
      console.log(costLine(`shared, ${s} slots`, await sharedCost(stage, flags.runs)));
      if (flags.profile && s === most) {
        const lines = await profiled(async () => void await sharedCost(stage, flags.runs));
        printProfile(`shared, ${s} slots`, lines);
      }
      stage.close();
    }
    model.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) await runCommand(HOST_COST, main);
