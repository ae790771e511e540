// The GPU memory a stage will hold, from the model's header alone: weights by kind, state per slot,
// snapshots, activations. Read by tools/plan.ts before deploying; checked against GpuStage.memory.
//
// Weights follow gpu_weights.ts's upload: matrices stay in their stored type (Q8_0 and Q6_K in
// their GPU layouts, weight_layout.ts), joined into one buffer where the loader joins same-typed
// projections; small vectors become f32. Every buffer is padded as buffers.ts pads it. A matrix
// larger than the device's binding limit is uploaded in parts, each with its own padding: the plan
// counts one part, a few bytes under such a stage.

import type { GgufModel } from "../gguf/gguf_model.ts";
import { hasMtpBlock, type LayerSpan } from "../gguf/stage_shard.ts";
import type { HParams } from "../hparams.ts";
import { defaultMaxBatch } from "../stage.ts";
import { paddedSize } from "./buffers.ts";
import { MTP_VECTORS } from "./gpu_weights.ts";
import { gpuTensorBytes } from "./weight_layout.ts";
import {
  activationFloats,
  activationShape,
  layerStateBytes,
  type StageMemory,
} from "./gpu_stage.ts";

export interface PlanOptions {
  readonly ctx: number;
  readonly slots: number;
  readonly snapshots: number;
  /** Positions of a rewindable run each slot keeps (the stages' maxRewind); default 0. */
  readonly maxRewind?: number;
  /** Positions per run; default the stage's own default. */
  readonly maxBatch?: number;
  /** The device runs prompts on tensor cores (GpuFeatures.subgroupMatrix): their input scratch. */
  readonly tensorCores?: boolean;
  /**
   * The last stage runs the file's MTP block to draft (a whole-model head's --draft, the last
   * worker's --mtp): its weights, its KV cache in every slot and snapshot, the rows it starts
   * from, and the token embedding it needs after a split.
   */
  readonly mtp?: boolean;
  /**
   * The device's maxStorageBufferBindingSize, where it caps a buffer bound whole (the attention
   * partials); default unlimited, as on the GPU box's Dawn.
   */
  readonly maxBindingBytes?: number;
}

export interface StagePlan extends Omit<StageMemory, "total"> {
  readonly span: LayerSpan;
  /**
   * Of one slot: K and V caches (attention layers), conv + recurrent state (DeltaNet), the
   * DeltaNet trail a rewind reads (maxRewind > 0) and the MTP block's KV cache and kept rows.
   */
  readonly perSlot: {
    readonly kv: number;
    readonly recurrent: number;
    readonly trail: number;
    readonly mtp: number;
  };
  readonly maxBatch: number;
  /** Weights, slots, snapshots and activations together. */
  readonly total: number;
}

/** Adds the buffers the loader makes, by kind. */
class Tally {
  readonly bytes = new Map<string, number>();

  constructor(readonly model: GgufModel, readonly hp: HParams) {}

  #add(kind: string, bytes: number): void {
    this.bytes.set(kind, (this.bytes.get(kind) ?? 0) + paddedSize(bytes));
  }

  /** Bytes of a tensor in its GPU layout (weight_layout.ts). */
  #stored(name: string): number {
    const t = this.model.tensors.get(name);
    if (!t) throw new RangeError(`Cannot plan: "${this.model.path}" has no tensor "${name}"`);
    return gpuTensorBytes(t.type, t.shape);
  }

  /** A matrix in its GPU layout, with the word past its last row the dequantizer may read. */
  matrix(kind: string, name: string): void {
    this.#add(kind, this.#stored(name) + 4);
  }

  /** Projections: each run of consecutive same-typed ones joined into one buffer (Loader). */
  projections(kind: string, names: readonly string[]): void {
    const type = (n: string) => this.model.tensors.get(n)?.type;
    for (let i = 0; i < names.length;) {
      let j = i + 1;
      while (j < names.length && type(names[j]) === type(names[i])) j++;
      if (j - i === 1) this.matrix(kind, names[i]);
      else this.#add(kind, names.slice(i, j).reduce((s, n) => s + this.#stored(n), 4));
      i = j;
    }
  }

  /** Small vectors dequantized to f32 into one buffer. */
  vectors(kind: string, names: readonly string[]): void {
    const elements = (n: string) => {
      const t = this.model.tensors.get(n);
      if (!t) throw new RangeError(`Cannot plan: "${this.model.path}" has no tensor "${n}"`);
      return t.shape.reduce((a, b) => a * b, 1);
    };
    this.#add(kind, 4 * names.reduce((s, n) => s + elements(n), 0));
  }
}

function planLayer(t: Tally, il: number): void {
  const { hp, model } = t;
  const p = `blk.${il}`;
  const has = (name: string) => model.tensors.has(`${p}.${name}`);
  t.vectors("norms", [`${p}.attn_norm.weight`]);
  t.vectors("norms", [`${p}.post_attention_norm.weight`]);
  if (hp.isDeltaNet[il]) {
    const qkvz = [`${p}.attn_qkv.weight`, `${p}.attn_gate.weight`];
    if (hp.arch !== "qwen3next") {
      t.projections("deltanet", [...qkvz, `${p}.ssm_beta.weight`, `${p}.ssm_alpha.weight`]);
    } else {
      // qwen3next's row-reordered ssm_in and ssm_ba stay apart from the rest.
      if (has("attn_qkv.weight")) t.projections("deltanet", qkvz);
      else t.matrix("deltanet", `${p}.ssm_in.weight`);
      t.matrix("deltanet", `${p}.ssm_ba.weight`);
    }
    t.vectors("deltanet", [`${p}.ssm_conv1d.weight`]);
    t.vectors("deltanet", [`${p}.ssm_dt.bias`, `${p}.ssm_a`, `${p}.ssm_norm.weight`]);
    t.matrix("deltanet", `${p}.ssm_out.weight`);
  } else {
    if (has("attn_qkv.weight")) t.matrix("attention", `${p}.attn_qkv.weight`);
    else {
      t.projections("attention", ["q", "k", "v"].map((x) => `${p}.attn_${x}.weight`));
    }
    t.vectors("norms", [`${p}.attn_q_norm.weight`]);
    t.vectors("norms", [`${p}.attn_k_norm.weight`]);
    t.matrix("attention", `${p}.attn_output.weight`);
  }
  if (hp.arch === "qwen35") {
    t.projections("dense ffn", [`${p}.ffn_gate.weight`, `${p}.ffn_up.weight`]);
    t.matrix("dense ffn", `${p}.ffn_down.weight`);
    return;
  }
  if (has("ffn_gate_up_exps.weight")) t.matrix("experts", `${p}.ffn_gate_up_exps.weight`);
  else t.projections("experts", [`${p}.ffn_gate_exps.weight`, `${p}.ffn_up_exps.weight`]);
  t.projections("router", [`${p}.ffn_gate_inp.weight`, `${p}.ffn_gate_inp_shexp.weight`]);
  t.matrix("experts", `${p}.ffn_down_exps.weight`);
  t.projections("shared expert", [`${p}.ffn_gate_shexp.weight`, `${p}.ffn_up_shexp.weight`]);
  t.matrix("shared expert", `${p}.ffn_down_shexp.weight`);
}

/** The GPU memory of layers `span` of `model` with these slots, context and snapshots. */
export function planStage(
  model: GgufModel,
  hp: HParams,
  span: LayerSpan,
  options: PlanOptions,
): StagePlan {
  const t = new Tally(model, hp);
  for (let il = span.first; il < span.end; il++) planLayer(t, il);
  const mtp = !!options.mtp && span.end === hp.nLayer && hasMtpBlock(model, hp.nLayer);
  if (mtp) {
    // As gpu_weights.ts loads it: the nextn vectors, the block, then eh_proj.
    const p = `blk.${hp.nLayer}.nextn`;
    for (const v of MTP_VECTORS) t.vectors("mtp", [`${p}.${v}.weight`]);
    planLayer(t, hp.nLayer);
    t.matrix("mtp", `${p}.eh_proj.weight`);
  }
  // The MTP block embeds the tokens on the last stage too.
  const embedding = span.first === 0 || mtp;
  if (embedding) t.matrix("token embedding", "token_embd.weight");
  if (span.end === hp.nLayer) {
    t.vectors("norms", ["output_norm.weight"]);
    const tied = !model.tensors.has("output.weight");
    // A tied head on a stage holding the embedding reuses its buffer.
    if (!(tied && embedding)) {
      t.matrix("lm head", tied ? "token_embd.weight" : "output.weight");
    }
  }
  const perSlot = { kv: 0, recurrent: 0, trail: 0, mtp: 0 };
  let slotBytes = 0;
  const rewind = options.maxRewind ?? 0;
  for (let il = span.first; il < span.end; il++) {
    const [a, b] = layerStateBytes(hp, il, options.ctx);
    const bytes = paddedSize(a) + paddedSize(b);
    if (hp.isDeltaNet[il]) perSlot.recurrent += bytes;
    else perSlot.kv += bytes;
    slotBytes += bytes;
    if (hp.isDeltaNet[il] && rewind > 0) {
      perSlot.trail += 4 * (hp.Kc - 1 + rewind) * hp.C + 4 * rewind * hp.Nv * hp.Dk * hp.Dv;
    }
  }
  let snapshotBytes = slotBytes;
  if (mtp) {
    const [k, v] = layerStateBytes(hp, hp.nLayer, options.ctx);
    const kv = paddedSize(k) + paddedSize(v);
    snapshotBytes += kv;
    perSlot.mtp = kv + 4 * Math.max(1, rewind) * hp.D;
  }
  const maxBatch = options.maxBatch ?? defaultMaxBatch(options.ctx);
  const shape = activationShape(
    hp,
    span,
    options.ctx,
    maxBatch,
    options.tensorCores,
    mtp,
    options.maxBindingBytes,
  );
  const activations = Object.values(activationFloats(hp, maxBatch, options.slots, shape))
    .reduce((s, [, n]) => s + paddedSize(4 * n), 0);
  const weights = [...t.bytes.values()].reduce((s, n) => s + n, 0);
  const slotState = options.slots * (slotBytes + perSlot.trail + perSlot.mtp);
  const snapshots = options.snapshots * snapshotBytes;
  return {
    span,
    weights: t.bytes,
    perSlot,
    slotState,
    snapshots,
    activations,
    maxBatch,
    total: weights + slotState + snapshots + activations,
  };
}
