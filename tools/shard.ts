// `deno task shard`: cuts a model (one GGUF or a gguf-split) into one GGUF per pipeline stage.
// Before deployment: each head or worker then reads only its own shard (engine/gguf/stage_shard.ts).
//
//   deno task shard --model M.gguf --stages 0:20,20:40 --out DIR    prints the written paths

import { KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS } from "../engine/gguf/format.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { openGguf } from "../engine/gguf/read.ts";
import {
  KEY_FINGERPRINT,
  KEY_SHARD_END,
  KEY_SHARD_FIRST,
  type LayerSpan,
  shardSpan,
  stageShardPath,
  stageTensorNames,
} from "../engine/gguf/stage_shard.ts";
import { modelHParams } from "../engine/hparams.ts";
import {
  type Command,
  type FlagTable,
  layerRange,
  listOf,
  MODEL_FLAG,
  requiredFlag,
  runCommand,
  text,
} from "../lib/cli.ts";
import { hex, modelFingerprint } from "../lib/wire/hello.ts";
import { type GgufMetaEntry, metaEntryOf, writeGguf } from "./gguf/gguf_write.ts";

export const SHARD = {
  name: "Shard",
  usage: "deno task shard",
  about: "Writes one GGUF per pipeline stage, DIR/<model>.layers-a-b.gguf, and prints their " +
    "paths, one per line: the stage's layers, the token embedding with the first stage, the " +
    "output norm and LM head with the last, and every metadata key of the model.",
  flags: {
    model: MODEL_FLAG,
    stages: requiredFlag(
      listOf(layerRange),
      "the stages' layers, contiguous from 0 to the model's last layer, e.g. 0:20,20:40",
    ),
    out: requiredFlag(text("DIR"), "the directory the shards are written to"),
  },
} satisfies Command<FlagTable>;

/** The split.* keys describe the input's files, not the model: a shard is one plain file. */
const INPUT_ONLY_KEYS = new Set([KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS]);

/** Checks that `stages` cover layers 0..nLayer in order, naming the first that does not. */
export function checkStages(stages: readonly LayerSpan[], nLayer: number): void {
  const given = stages.map((s) => `${s.first}:${s.end}`).join(",");
  stages.forEach((s, i) => {
    const from = i === 0 ? 0 : stages[i - 1].end;
    if (s.first !== from) {
      throw new RangeError(
        `Cannot use --stages ${given}: stage ${i + 1} starts at layer ${s.first}, expected ` +
          `${from}; the stages must be contiguous from layer 0`,
      );
    }
  });
  const last = stages[stages.length - 1].end;
  if (last !== nLayer) {
    throw new RangeError(
      `Cannot use --stages ${given}: the last stage ends at layer ${last} but the model has ` +
        `${nLayer} layers; end it at ${nLayer}`,
    );
  }
}

/**
 * The tensors of each stage's shard: what the stage reads, plus, with the last stage (which owns
 * the LM head), whatever no stage reads (e.g. multi-token-prediction blocks), so nothing is lost.
 */
function shardTensors(model: GgufModel, nLayer: number, stages: readonly LayerSpan[]) {
  const sets = stages.map((s) => new Set(stageTensorNames(model, nLayer, s)));
  const unread = [...model.tensors.keys()].filter((n) => !sets.some((set) => set.has(n)));
  for (const name of unread) sets[sets.length - 1].add(name);
  // File order, so a shard reads front to back like the model it came from.
  return sets.map((set) => [...model.tensors.values()].filter((t) => set.has(t.name)));
}

/**
 * Writes one GGUF per stage into `outDir` and returns their paths in stage order. Every metadata
 * key is copied with its stored type; each shard also records its layers and the fingerprint
 * of the whole model (lib/wire/hello.ts), which its stage then reports in the hello.
 */
export async function writeStageShards(
  modelPath: string,
  stages: readonly LayerSpan[],
  outDir: string,
): Promise<string[]> {
  const model = await openGguf(modelPath);
  try {
    const { nLayer } = modelHParams(model);
    const held = shardSpan(model, nLayer);
    if (held) {
      throw new RangeError(
        `Cannot shard "${modelPath}": it is already a stage shard (layers ${held.first}:` +
          `${held.end}); shard the whole model instead`,
      );
    }
    checkStages(stages, nLayer);
    const fingerprint = hex(await modelFingerprint(model));
    const copied = [...model.metadata]
      .filter(([key]) => !INPUT_ONLY_KEYS.has(key))
      .map(([key, value]) => metaEntryOf(key, value, model.metadataTypes.get(key)!));
    await Deno.mkdir(outDir, { recursive: true });
    const tensors = shardTensors(model, nLayer, stages);
    const paths: string[] = [];
    for (const [i, { first, end }] of stages.entries()) {
      const path = stageShardPath(outDir, modelPath, { first, end });
      const meta: GgufMetaEntry[] = [
        ...copied,
        { key: KEY_SHARD_FIRST, type: "u32", value: first },
        { key: KEY_SHARD_END, type: "u32", value: end },
        { key: KEY_FINGERPRINT, type: "string", value: fingerprint },
      ];
      // Written under a temporary name, so an interrupted run leaves no file that looks whole.
      const partial = `${path}.partial`;
      await writeGguf(partial, meta, tensors[i], (t) => model.readTensor(t.name));
      await Deno.rename(partial, path);
      paths.push(path);
    }
    return paths;
  } finally {
    model.close();
  }
}

if (import.meta.main) {
  await runCommand(SHARD, async (flags) => {
    for (const p of await writeStageShards(flags.model, flags.stages, flags.out)) console.log(p);
  });
}
