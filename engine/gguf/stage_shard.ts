// Stage shards: one GGUF per pipeline stage, holding its layers' tensors and all the model's
// metadata. Written by tools/shard.ts; read where a stage opens (engine/open_stage.ts) and says hello.
//
// A shard is an ordinary GGUF with three extra keys: the layer range it holds and the fingerprint
// of the whole model it was cut from, so stages on shards of one model recognise each other.

import { parseShardPath } from "./format.ts";
import type { GgufModel } from "./gguf_model.ts";
import { quote } from "./header.ts";

export const KEY_SHARD_FIRST = "tandem.shard.first";
export const KEY_SHARD_END = "tandem.shard.end";
export const KEY_FINGERPRINT = "tandem.fingerprint";

/** Layers [first, end) of a model. */
export interface LayerSpan {
  readonly first: number;
  readonly end: number;
}

function shardError(model: GgufModel, problem: string): SyntaxError {
  return new SyntaxError(
    `Cannot read "${model.path}" as a stage shard: ${problem}; write it again with deno task shard`,
  );
}

/** The layers a stage shard holds, or undefined for a whole model. */
export function shardSpan(model: GgufModel, nLayer: number): LayerSpan | undefined {
  const first = model.metadata.get(KEY_SHARD_FIRST);
  const end = model.metadata.get(KEY_SHARD_END);
  if (first === undefined && end === undefined) return undefined;
  const ok = typeof first === "number" && typeof end === "number" && Number.isInteger(first) &&
    Number.isInteger(end) && first >= 0 && first < end && end <= nLayer;
  if (!ok) {
    throw shardError(
      model,
      `"${KEY_SHARD_FIRST}" is ${quote(String(first))} and "${KEY_SHARD_END}" is ` +
        `${quote(String(end))}, expected 0 ≤ first < end ≤ ${nLayer}`,
    );
  }
  return { first, end };
}

/** The whole model's fingerprint a shard records, or undefined for a whole model. */
export function recordedFingerprint(model: GgufModel): Uint8Array | undefined {
  const text = model.metadata.get(KEY_FINGERPRINT);
  if (text === undefined) return undefined;
  if (typeof text !== "string" || !/^[0-9a-f]{64}$/.test(text)) {
    throw shardError(model, `"${KEY_FINGERPRINT}" is not a SHA-256 in hex (64 digits)`);
  }
  return Uint8Array.from(text.match(/../g)!, (h) => parseInt(h, 16));
}

/**
 * Why layers [first, end) cannot be opened from `model`, naming the shard's own range, or
 * undefined when they can (a whole model holds every layer).
 */
export function missingLayers(
  model: GgufModel,
  nLayer: number,
  want: LayerSpan,
): string | undefined {
  const held = shardSpan(model, nLayer);
  if (!held || (want.first >= held.first && want.end <= held.end)) return undefined;
  return `Cannot open layers ${want.first}:${want.end} from "${model.path}": it is a stage shard ` +
    `holding layers ${held.first}:${held.end} only; give this stage the shard written for ` +
    `${want.first}:${want.end} (deno task shard --stages …) or the whole model`;
}

const BLOCK = /^blk\.(\d+)\./;

/**
 * The tensors layers [first, end) read: their blocks, token_embd on the first stage, and
 * output_norm with the LM head (output, or token_embd when tied) on the last.
 */
export function stageTensorNames(model: GgufModel, nLayer: number, span: LayerSpan): string[] {
  const { first, end } = span;
  const names: string[] = [];
  for (const name of model.tensors.keys()) {
    const m = BLOCK.exec(name);
    if (m && Number(m[1]) >= first && Number(m[1]) < end) names.push(name);
  }
  if (first === 0) names.push("token_embd.weight");
  if (end === nLayer) {
    names.push("output_norm.weight");
    if (model.tensors.has("output.weight")) names.push("output.weight");
    else if (first !== 0) names.push("token_embd.weight");
  }
  return names;
}

/** Whether `model` carries an MTP block after its `nLayer` blocks (docs/model_arch.md §3.6). */
export function hasMtpBlock(model: GgufModel, nLayer: number): boolean {
  return model.tensors.has(`blk.${nLayer}.nextn.eh_proj.weight`);
}

const STAGE_SUFFIX = /\.layers-(\d+)-(\d+)$/;

/** Where `deno task shard` writes the shard of `span`: DIR/<model>.layers-a-b.gguf. */
export function stageShardPath(dir: string, modelPath: string, span: LayerSpan): string {
  return `${dir.replace(/\/$/, "")}/${modelStem(modelPath)}.layers-${span.first}-${span.end}.gguf`;
}

/**
 * The model's name from any of its files: "dir/qwen-00001-of-00003.gguf", "dir/qwen.gguf" and
 * "dir/qwen.layers-0-20.gguf" all give "qwen".
 */
export function modelStem(path: string): string {
  const stem = (parseShardPath(path)?.stem ?? path.replace(/\.gguf$/i, "")).replace(
    STAGE_SUFFIX,
    "",
  );
  return stem.slice(stem.lastIndexOf("/") + 1);
}
