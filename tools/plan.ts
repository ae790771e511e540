// `deno task plan`: the GPU memory each stage of a split needs, before anything is deployed.
// Reads only the model's header; the numbers are engine/gpu/memory_plan.ts's, which a GPU test
// holds equal to what a stage allocates.
//
//   deno task plan --model M.gguf --stages 0:20,20:40 --ctx 8192 --slots 2 [--snapshots N]

import { openGguf } from "../engine/gguf/read.ts";
import { formatBytes } from "../engine/gpu/buffers.ts";
import { planStage, type StagePlan } from "../engine/gpu/memory_plan.ts";
import { modelHParams } from "../engine/hparams.ts";
import { DEFAULT_CTX, DEFAULT_MAX_BATCH, DEFAULT_SLOTS } from "../engine/stage.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  layerRange,
  listOf,
  MODEL_FLAG,
  requiredFlag,
  runCommand,
  switchFlag,
  whole,
} from "../lib/cli.ts";
import { defaultSnapshots } from "../lib/scheduler/prefix_cache.ts";
import { checkStages } from "./shard.ts";

export const PLAN = {
  name: "Plan",
  usage: "deno task plan",
  about: "Prints the GPU memory each stage needs (weights by kind, KV cache and recurrent " +
    "state per slot, snapshots, activations) and the total, as the GPU engine allocates it.",
  flags: {
    model: MODEL_FLAG,
    stages: requiredFlag(listOf(layerRange), "the stages' layers, e.g. 0:20,20:40"),
    ctx: flag(whole(1), "positions per slot, as the stages' --ctx (their default)", DEFAULT_CTX),
    slots: flag(whole(1), "slots, as the stages' --slots (their default)", DEFAULT_SLOTS),
    snapshots: flag(
      whole(0),
      "snapshot places, as the stages' --snapshots (default sized as theirs from --ctx and --slots)",
    ),
    rewind: flag(
      whole(0),
      "positions each slot keeps to rewind, as the workers' --rewind (the head's --draft + 1)",
      0,
    ),
    "max-batch": flag(
      whole(1),
      `positions per run, as --max-batch (default ${DEFAULT_MAX_BATCH}, or the context if shorter)`,
    ),
    mtp: switchFlag(
      "the last stage drafts with the file's MTP block (a whole-model head's --draft, the last " +
        "worker's --mtp): count the block, its KV cache in every slot and snapshot, the rows it " +
        "starts from and, after a split, the token embedding",
    ),
    "tensor-cores": switchFlag(
      "the stages run prompts on tensor cores (TANDEM_MMA=1, Dawn on a GPU with subgroup " +
        "matrices; its start-up line lists them): count their f16 input scratch",
    ),
  },
} satisfies Command<FlagTable>;

/** The lines printed for one stage. */
export function formatPlan(p: StagePlan, slots: number, snapshots: number, ctx: number): string[] {
  const weights = [...p.weights.values()].reduce((s, n) => s + n, 0);
  const kinds = [...p.weights].map(([kind, n]) => `${kind} ${formatBytes(n)}`).join(", ");
  const slot = p.perSlot.kv + p.perSlot.recurrent;
  const trail = p.perSlot.trail ? `, rewind trail ${formatBytes(p.perSlot.trail)}` : "";
  const mtp = p.perSlot.mtp ? `, MTP block ${formatBytes(p.perSlot.mtp)}` : "";
  return [
    `stage ${p.span.first}:${p.span.end}`,
    `  weights      ${formatBytes(weights)} (${kinds})`,
    `  per slot     ${formatBytes(slot + p.perSlot.trail + p.perSlot.mtp)} (KV ${
      formatBytes(p.perSlot.kv)
    } for ${ctx} positions, recurrent ` +
    `${formatBytes(p.perSlot.recurrent)}${trail}${mtp}) × ${slots} slots = ${
      formatBytes(p.slotState)
    }`,
    `  snapshots    ${snapshots} × ${formatBytes(p.snapshots / Math.max(1, snapshots))} = ${
      formatBytes(p.snapshots)
    }`,
    `  activations  ${formatBytes(p.activations)} (${p.maxBatch} positions per run)`,
    `  total        ${formatBytes(p.total)}`,
  ];
}

/** What `deno task plan` prints: each stage's lines, then the total of all stages. */
export async function planReport(flags: FlagValues<typeof PLAN.flags>): Promise<string[]> {
  const model = await openGguf(flags.model);
  try {
    const hp = modelHParams(model);
    checkStages(flags.stages, hp.nLayer);
    const { ctx, slots } = flags;
    // Omitted, the stages' own default: the plan must describe the processes as they will run.
    const snapshots = flags.snapshots ?? defaultSnapshots(ctx, slots);
    const options = {
      ctx,
      slots,
      snapshots,
      maxRewind: flags.rewind,
      maxBatch: flags["max-batch"],
      tensorCores: flags["tensor-cores"],
      mtp: flags.mtp,
    };
    const plans = flags.stages.map((span) => planStage(model, hp, span, options));
    return [
      ...plans.flatMap((p) => formatPlan(p, slots, snapshots, ctx)),
      `all stages     ${formatBytes(plans.reduce((s, p) => s + p.total, 0))}`,
    ];
  } finally {
    model.close();
  }
}

if (import.meta.main) {
  await runCommand(PLAN, async (flags) => console.log((await planReport(flags)).join("\n")));
}
