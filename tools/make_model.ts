// CLI over the model generator: `deno task make-model --preset tiny --arch qwen35moe ...`.
// Writes the random-weight GGUF (or its shards) that tests, benches and demos load.

import {
  generateModel,
  type Layout,
  modelFileStem,
  type ModelSpec,
  planModel,
  type Quant,
  QUANTS,
} from "./synth/generate_model.ts";
import { type Arch, ARCHS } from "../engine/hparams.ts";
import { type PresetName, PRESETS } from "./synth/presets.ts";
import { parseCommandLine } from "../lib/cli.ts";

const USAGE = `Usage: deno task make-model [options]
  --preset ${Object.keys(PRESETS).join("|")}   model shape (default tiny)
  --arch ${ARCHS.join("|")}                   architecture (default qwen35moe)
  --layout split|legacy                          qwen3next DeltaNet input layout (default split)
  --quant ${QUANTS.join("|")}   weight types (default f32)
  --seed N                                       random seed (default 1)
  --split N                                      write N gguf-split shards (default 1)
  --tied                                         no output.weight: the LM head reuses token_embd
  --out PATH                                     output file (default models/<name>.gguf)`;

function fail(message: string): never {
  console.error(`${message}\n\n${USAGE}`);
  Deno.exit(2);
}

function oneOf<T extends string>(flag: string, value: string, allowed: readonly T[]): T {
  if (!allowed.includes(value as T)) {
    fail(`Cannot use --${flag} "${value}": use one of ${allowed.join(", ")}`);
  }
  return value as T;
}

function positiveInt(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < min) {
    fail(`Cannot use --${flag} "${value}": expected an integer ≥ ${min}`);
  }
  return n;
}

function gb(bytes: number): string {
  return `${(bytes / 1e9).toFixed(bytes < 1e8 ? 4 : 2)} GB`;
}

async function main(): Promise<void> {
  const values = parseCommandLine({
    args: Deno.args,
    options: {
      preset: { type: "string", default: "tiny" },
      arch: { type: "string", default: "qwen35moe" },
      layout: { type: "string", default: "split" },
      quant: { type: "string", default: "f32" },
      seed: { type: "string", default: "1" },
      split: { type: "string", default: "1" },
      tied: { type: "boolean", default: false },
      out: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
  }, fail);
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const spec: ModelSpec = {
    preset: oneOf<PresetName>("preset", values.preset, Object.keys(PRESETS) as PresetName[]),
    arch: oneOf<Arch>("arch", values.arch, ARCHS),
    layout: oneOf<Layout>("layout", values.layout, ["split", "legacy"]),
    quant: oneOf<Quant>("quant", values.quant, QUANTS),
    seed: positiveInt("seed", values.seed, 0),
    tied: values.tied,
  };
  const split = positiveInt("split", values.split, 1);
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

if (import.meta.main) await main();
