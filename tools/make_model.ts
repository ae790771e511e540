// CLI over the model generator: `deno task make-model --preset tiny --arch qwen35moe ...`.
// Writes the random-weight GGUF (or its shards) that tests, benches and demos load.

import {
  generateModel,
  type Layout,
  MAX_LAYERS,
  modelFileStem,
  type ModelSpec,
  planModel,
  QUANTS,
} from "./synth/generate_model.ts";
import { ARCHS } from "../engine/hparams.ts";
import { type PresetName, PRESETS } from "./synth/presets.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../lib/cli.ts";

const MAKE_MODEL = {
  name: "Make-model",
  usage: "deno task make-model",
  about: "Writes a random-weight GGUF (or its gguf-split shards) of a preset shape, the model " +
    "tests, benches and the demo load.",
  flags: {
    preset: flag(oneOf(Object.keys(PRESETS) as PresetName[]), "the model's shape", "tiny"),
    arch: flag(oneOf(ARCHS), "the architecture", "qwen35moe"),
    layout: flag(oneOf<Layout>(["split", "legacy"]), "qwen3next DeltaNet input layout", "split"),
    quant: flag(oneOf(QUANTS), "weight types", "f32"),
    seed: flag(whole(0), "random seed", 1),
    split: flag(whole(1), "write this many gguf-split shards", 1),
    tied: switchFlag("no output.weight: the LM head reuses token_embd"),
    mtp: switchFlag("append the MTP (nextn) block published qwen35/qwen35moe files carry"),
    predictable: switchFlag(
      "each token's greedy continuation is the next id and the MTP block agrees by construction " +
        "(speculative decoding's best case; the products cost what a random model's do)",
    ),
    layers: flag(
      whole(1, MAX_LAYERS),
      "blocks in the main stack instead of the preset's: its widths, another depth",
    ),
    out: flag(text("PATH"), "the output file (default models/<name>.gguf)"),
  },
} satisfies Command<FlagTable>;

function gb(bytes: number): string {
  return `${(bytes / 1e9).toFixed(bytes < 1e8 ? 4 : 2)} GB`;
}

async function main(values: FlagValues<typeof MAKE_MODEL.flags>): Promise<void> {
  const spec: ModelSpec = {
    preset: values.preset,
    arch: values.arch,
    layout: values.layout,
    quant: values.quant,
    seed: values.seed,
    tied: values.tied,
    mtp: values.mtp,
    predictable: values.predictable,
    layers: values.layers,
  };
  const split = values.split;
  const out = values.out ?? `models/${modelFileStem(spec)}.gguf`;
  const plan = planModel(spec);
  console.log(
    `Writing ${plan.tensors.length} tensors, ${gb(plan.dataBytes)} of weights, to ${out}` +
      (split > 1 ? ` as ${split} shards` : ""),
  );
  const slash = out.lastIndexOf("/");
  if (slash > 0) await Deno.mkdir(out.slice(0, slash), { recursive: true });
  const start = performance.now();
  const paths = await generateModel(out, spec, { split });
  const seconds = (performance.now() - start) / 1000;
  let total = 0;
  for (const path of paths) {
    const { size } = await Deno.stat(path);
    total += size;
    console.log(`${path}  ${gb(size)}`);
  }
  console.log(
    `Wrote ${gb(total)} in ${seconds.toFixed(1)} s (${(total / 1e6 / seconds).toFixed(0)} MB/s)`,
  );
}

if (import.meta.main) await runCommand(MAKE_MODEL, main);
