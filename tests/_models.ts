// Test models: every test gets its GGUF through testModel, generated once into tests/fixtures/models/.
// Between the generator (tools/synth/generate_model.ts) and every test or fixture that runs a model.

import { createHash } from "node:crypto";
import { shardPath, splitPaths } from "../engine/gguf/format.ts";
import {
  generateModel,
  type Layout,
  modelFileStem,
  type ModelSpec,
  type Quant,
} from "../tools/synth/generate_model.ts";
import type { Arch } from "../engine/hparams.ts";

export interface TestModelSpec {
  readonly arch: Arch;
  /** Default "f32". */
  readonly quant?: Quant;
  /** qwen3next only; default "split". */
  readonly layout?: Layout;
  /** gguf-split shards; default 1. */
  readonly split?: number;
  readonly preset?: "tiny";
  /** Default 1. */
  readonly seed?: number;
  readonly tied?: boolean;
  /** With the MTP block published qwen35/qwen35moe files carry (ModelSpec.mtp). */
  readonly mtp?: boolean;
  /** Greedy continuation and MTP drafts known by construction (ModelSpec.predictable). */
  readonly predictable?: boolean;
}

const MODELS_DIR = new URL("./fixtures/models/", import.meta.url);

/**
 * The generator's sources: their hash is part of each cached file's name, so a change to how
 * models are made regenerates them instead of leaving stale files behind.
 */
const GENERATOR_SOURCES = [
  "../tools/synth/generate_model.ts",
  "../tools/synth/weight_synth.ts",
  "../tools/synth/presets.ts",
  "../tools/synth/vocab.ts",
  "../tools/synth/vocab_corpus.txt",
  "../tools/synth/qwen_chat_template.ts",
  "../lib/tokenizer/pre_tokenize.ts",
  "../tools/synth/quantize.ts",
  "../tools/synth/quant_fit.ts",
  "../engine/quant/blocks.ts",
  "../engine/quant/dequant.ts",
  "../engine/quant/f16.ts",
  "../engine/quant/ggml_types.ts",
  "../tools/gguf/gguf_write.ts",
  "../engine/gguf/format.ts",
];

let generatorHash: Promise<string> | undefined;

async function hashGenerator(): Promise<string> {
  const hash = createHash("sha256");
  for (const source of GENERATOR_SOURCES) {
    hash.update(await Deno.readFile(new URL(source, import.meta.url)));
  }
  return hash.digest("hex").slice(0, 10);
}

/** Generations in flight in this process, by path, so parallel callers share one. */
const pending = new Map<string, Promise<string>>();

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

async function generate(
  spec: ModelSpec,
  split: number,
  dir: string,
  stem: string,
  path: string,
): Promise<string> {
  if (await exists(path)) return path;
  // Parallel test files (other processes) may generate the same model: each writes into its own
  // temp folder and renames into place, the first shard last, so a present first shard means a
  // complete model. Renaming over an identical file is harmless.
  const tmp = await Deno.makeTempDir({ dir, prefix: ".tmp-" });
  try {
    const written = await generateModel(`${tmp}/${stem}.gguf`, spec, { split });
    for (const file of [...written.slice(1), written[0]]) {
      await Deno.rename(file, `${dir}${file.slice(tmp.length + 1)}`);
    }
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
  return path;
}

/**
 * The path of the model `spec` describes (its first shard when split), generating it into
 * tests/fixtures/models/ when missing. The same spec always yields the same bytes.
 */
export async function testModel(spec: TestModelSpec): Promise<string> {
  const split = spec.split ?? 1;
  const modelSpec: ModelSpec = {
    preset: spec.preset ?? "tiny",
    arch: spec.arch,
    layout: spec.layout,
    quant: spec.quant,
    seed: spec.seed,
    tied: spec.tied,
    mtp: spec.mtp,
    predictable: spec.predictable,
  };
  generatorHash ??= hashGenerator();
  const dir = decodeURIComponent(MODELS_DIR.pathname);
  await Deno.mkdir(dir, { recursive: true });
  const stem = `${modelFileStem(modelSpec)}-g${await generatorHash}`;
  const path = split > 1 ? shardPath(`${dir}${stem}`, 0, split) : `${dir}${stem}.gguf`;
  let job = pending.get(path);
  if (!job) {
    job = generate(modelSpec, split, dir, stem, path);
    pending.set(path, job);
  }
  return await job;
}

/**
 * sha256 (hex) of a model file; for a gguf-split first shard (`-00001-of-0000N.gguf`) of all N
 * shards joined in order, which is what a fixture records as the model's identity.
 */
export async function sha256File(path: string): Promise<string> {
  const paths = splitPaths(path);
  const hash = createHash("sha256");
  for (const p of paths) {
    // Reading the stream to its end closes the file.
    const file = await Deno.open(p);
    for await (const chunk of file.readable) hash.update(chunk);
  }
  return hash.digest("hex");
}
