// Writes seeded random-weight GGUF models of the hybrid archs (qwen35moe, qwen3next, qwen35).
// The source of every test and bench model: tools/make_model.ts and tests/_models.ts call it.

import { type GgufMetaEntry, writeGguf } from "../gguf/gguf_write.ts";
import { QUANT_TYPES } from "./quantize.ts";
import { blockGeometry, GgmlType, rowBytes, typeName } from "../../engine/quant/ggml_types.ts";
import { CHAT_TEMPLATE } from "./qwen_chat_template.ts";
import type { Arch } from "../../engine/hparams.ts";
import { type Preset, type PresetName, PRESETS } from "./presets.ts";
import { buildVocab, tokenizerEntries, type Vocab } from "./vocab.ts";
import { ChunkPool, type Init, type SynthTensor, tensorData } from "./weight_synth.ts";

/** Weight-type schemes; see SCHEMES and MIXED_CYCLE for what each puts on which tensor. */
export type Quant = "f32" | "f16" | "bf16" | "q8_0" | "q4_k_m" | "iq4_xs" | "mixed";
export const QUANTS: readonly Quant[] = ["f32", "f16", "bf16", "q8_0", "q4_k_m", "iq4_xs", "mixed"];

/** qwen3next DeltaNet input: `attn_qkv`+`attn_gate` ("split") or the fused `ssm_in` ("legacy"). */
export type Layout = "split" | "legacy";

export interface ModelSpec {
  readonly preset: PresetName;
  readonly arch: Arch;
  /** qwen3next only; default "split". */
  readonly layout?: Layout;
  /** Default "f32". */
  readonly quant?: Quant;
  /** Default 1. Every tensor's values depend only on the seed and the tensor's name. */
  readonly seed?: number;
  /** Leave out `output.weight` so the LM head reuses `token_embd.weight`. */
  readonly tied?: boolean;
  /**
   * Append the MTP ("nextn") block that published qwen35/qwen35moe files carry after the main
   * stack (docs/model_arch.md §3.6): a full-attention block plus eh_proj, enorm, hnorm and
   * shared_head_norm, counted in block_count with nextn_predict_layers = 1. Normal decoding never
   * runs it; the main stack's tensors are the same bytes with or without it.
   */
  readonly mtp?: boolean;
  /**
   * A model whose greedy continuation is known and whose MTP block agrees with it by
   * construction, for speculative decoding's best case: output.weight's row t + 1 is
   * token_embd's row t (so a residual near e_t predicts t + 1), every block adds only
   * PREDICTABLE_QUIET of its usual scale to the residual, and the MTP block's eh_proj passes the
   * embedding through ([I | 0]). The products read and compute what a random model's do.
   * Needs an untied head.
   */
  readonly predictable?: boolean;
  /**
   * Blocks in the main stack instead of the preset's (1..MAX_LAYERS): the preset's widths with
   * another depth, e.g. a tiny model with the bench model's 40 layers, whose steps record as many
   * dispatches as the bench model's (bench/host_cost.ts). The first layers' tensors are the
   * preset's bytes.
   */
  readonly layers?: number;
}

/** Most blocks ModelSpec.layers asks for (the published shapes have 40 and 48). */
export const MAX_LAYERS = 256;

/**
 * The scale of every block's output projections in a predictable model: small enough that the
 * residual stays nearest its token's embedding through every layer, large enough that the blocks'
 * values are not negligible (routing still follows each token).
 */
export const PREDICTABLE_QUIET = 0.05;

/**
 * What a tensor does, which decides its weight type. "vector" covers the 1-D tensors (norms,
 * ssm_a, ssm_dt, the shared-expert gate); "ssm_gate_in" the tiny b/a projections.
 */
type Role =
  | "embd"
  | "output"
  | "vector"
  | "conv"
  | "router"
  | "attn"
  | "attn_v"
  | "ssm"
  | "ssm_gate_in"
  | "exps"
  | "exps_down"
  | "shexp"
  | "shexp_down"
  | "ffn"
  | "ffn_down";

export interface TensorDef extends SynthTensor {
  readonly role: Role;
}

export interface ModelPlan {
  readonly meta: GgufMetaEntry[];
  readonly tensors: TensorDef[];
  /** Bytes of tensor data (without header and alignment padding). */
  readonly dataBytes: number;
}

type MatrixRole = Exclude<Role, "vector" | "conv" | "router">;

const { F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS } = GgmlType;

function uniformScheme(type: GgmlType): Readonly<Record<MatrixRole, GgmlType>> {
  return {
    embd: type,
    output: type,
    attn: type,
    attn_v: type,
    ssm: type,
    ssm_gate_in: type,
    exps: type,
    exps_down: type,
    shexp: type,
    shexp_down: type,
    ffn: type,
    ffn_down: type,
  };
}

/**
 * Types of the 2-D/3-D weights. 1-D tensors, `ssm_conv1d` and routers stay F32 (as llama.cpp's
 * quantizer and converter leave them) except in "mixed", which exercises every type everywhere.
 */
const SCHEMES: Readonly<Record<Exclude<Quant, "mixed">, Readonly<Record<MatrixRole, GgmlType>>>> = {
  f32: uniformScheme(F32),
  f16: uniformScheme(F16),
  bf16: uniformScheme(BF16),
  q8_0: uniformScheme(Q8_0),
  // Like llama.cpp's Q4_K_M: Q4_K bulk, Q6_K for the down projections, V and the LM head.
  q4_k_m: {
    embd: Q4_K,
    output: Q6_K,
    attn: Q5_K,
    attn_v: Q6_K,
    ssm: Q5_K,
    ssm_gate_in: Q8_0,
    exps: Q4_K,
    exps_down: Q6_K,
    shexp: Q5_K,
    shexp_down: Q6_K,
    ffn: Q4_K,
    ffn_down: Q6_K,
  },
  // The bench model's shape (docs/PERFORMANCE.md, "The model"): IQ4_XS experts, Q8_0 elsewhere.
  iq4_xs: {
    embd: Q8_0,
    output: Q6_K,
    attn: Q8_0,
    attn_v: Q8_0,
    ssm: Q8_0,
    ssm_gate_in: Q8_0,
    exps: IQ4_XS,
    exps_down: IQ4_XS,
    shexp: Q8_0,
    shexp_down: Q8_0,
    ffn: IQ4_XS,
    ffn_down: IQ4_XS,
  },
};

/**
 * Every non-F32 type the quantizers write (the same set the dequantizers read), assigned in turn
 * to the 2-D/3-D tensors of a "mixed" model so each type is exercised inside a real model.
 */
const MIXED_CYCLE: readonly GgmlType[] = QUANT_TYPES.filter((t) => t !== F32);

/** llama.cpp's LlamaFileType for each scheme ("mixed" has none and writes no key). */
const FILE_TYPE: Readonly<Partial<Record<Quant, number>>> = {
  f32: 0,
  f16: 1,
  q8_0: 7,
  q4_k_m: 15,
  iq4_xs: 30,
  bf16: 32,
};

/** Weight type per tensor: `mixed` counts the matrices seen so far to walk MIXED_CYCLE. */
function typeChooser(quant: Quant): (role: Role) => GgmlType {
  let matrices = 0;
  return (role) => {
    if (role === "vector" || role === "conv") return F32;
    if (quant === "mixed") return MIXED_CYCLE[matrices++ % MIXED_CYCLE.length];
    if (role === "router") return F32;
    return SCHEMES[quant][role];
  };
}

/** N(0, scale²/in): at scale 1 keeps a projection's output at the scale of its normed input. */
function proj(inDim: number, scale = 1): Init {
  return { dist: "normal", a: 0, b: scale / Math.sqrt(inDim) };
}

/** Stored norm weights of the zero-centred norms are 1 + w (docs/model_arch.md §3.7). */
const NORM: Init = { dist: "normal", a: 1, b: 0.1 };

/** The tensor list, in the order HF checkpoints name them (embedding, blocks, final norm, head). */
function planTensors(
  p: Preset,
  arch: Arch,
  layout: Layout,
  o: { readonly tied: boolean; readonly mtp: boolean; readonly predictable: boolean },
  V: number,
): Omit<TensorDef, "type">[] {
  const { D, Hq, Hkv, Dh, Nk, Nv, Dk, Dv, Kc, E, Fe, Fs, F } = p;
  // What a block adds to the residual (its output projections).
  const out = (inDim: number) => proj(inDim, o.predictable ? PREDICTABLE_QUIET : 1);
  const keyDim = Nk * Dk;
  const valueDim = Nv * Dv;
  const C = 2 * keyDim + valueDim;
  const tensors: Omit<TensorDef, "type">[] = [];
  const add = (name: string, shape: number[], role: Role, init: Init) =>
    tensors.push({ name, shape, role, init });
  // Unit-variance embeddings: RMSNorm rescales them anyway, and the residual stream keeps the
  // token's identity at the same scale as what each block adds. A tied head reads the residual
  // back through the same rows, where a unit-scale e_t would make every token predict itself
  // (e_t·e_t ≈ D); at std 0.1 the blocks' outputs dominate the residual instead.
  add("token_embd.weight", [D, V], "embd", { dist: "normal", a: 0, b: o.tied ? 0.1 : 1 });
  const block = (i: number, fullAttention: boolean) => {
    const blk = (s: string) => `blk.${i}.${s}`;
    add(blk("attn_norm.weight"), [D], "vector", NORM);
    if (!fullAttention) {
      if (arch === "qwen3next" && layout === "legacy") {
        add(blk("ssm_in.weight"), [D, 2 * keyDim + 2 * valueDim], "ssm", proj(D));
      } else {
        add(blk("attn_qkv.weight"), [D, C], "ssm", proj(D));
        add(blk("attn_gate.weight"), [D, valueDim], "ssm", proj(D));
      }
      if (arch === "qwen3next") {
        add(blk("ssm_ba.weight"), [D, 2 * Nv], "ssm_gate_in", proj(D));
      } else {
        add(blk("ssm_beta.weight"), [D, Nv], "ssm_gate_in", proj(D));
        add(blk("ssm_alpha.weight"), [D, Nv], "ssm_gate_in", proj(D));
      }
      // K taps summing K unit inputs: N(0, 1/K) keeps the conv output near unit scale.
      add(blk("ssm_conv1d.weight"), [Kc, C], "conv", proj(Kc));
      // softplus(a + dt_bias) with dt_bias in [-4, -1] and |ssm_a| in [e^-1, e] gives per-token
      // decays between ~0.4 and ~0.999: some heads remember the whole prompt, some only the tail.
      add(blk("ssm_dt.bias"), [Nv], "vector", { dist: "uniform", a: -4, b: -1 });
      add(blk("ssm_a"), [Nv], "vector", { dist: "neg-exp-uniform", a: -1, b: 1 });
      add(blk("ssm_norm.weight"), [Dv], "vector", NORM);
      add(blk("ssm_out.weight"), [valueDim, D], "ssm", out(valueDim));
    } else {
      add(blk("attn_q.weight"), [D, 2 * Hq * Dh], "attn", proj(D));
      add(blk("attn_k.weight"), [D, Hkv * Dh], "attn", proj(D));
      add(blk("attn_v.weight"), [D, Hkv * Dh], "attn_v", proj(D));
      add(blk("attn_q_norm.weight"), [Dh], "vector", NORM);
      add(blk("attn_k_norm.weight"), [Dh], "vector", NORM);
      add(blk("attn_output.weight"), [Hq * Dh, D], "attn", out(Hq * Dh));
    }
    add(blk("post_attention_norm.weight"), [D], "vector", NORM);
    if (arch === "qwen35") {
      add(blk("ffn_gate.weight"), [D, F], "ffn", proj(D));
      add(blk("ffn_up.weight"), [D, F], "ffn", proj(D));
      add(blk("ffn_down.weight"), [F, D], "ffn_down", out(F));
    } else {
      // Router logits ~ N(0, 1) per expert and token: different tokens pick different experts.
      add(blk("ffn_gate_inp.weight"), [D, E], "router", proj(D));
      add(blk("ffn_gate_exps.weight"), [D, Fe, E], "exps", proj(D));
      add(blk("ffn_up_exps.weight"), [D, Fe, E], "exps", proj(D));
      add(blk("ffn_down_exps.weight"), [Fe, D, E], "exps_down", out(Fe));
      add(blk("ffn_gate_inp_shexp.weight"), [D], "vector", proj(D));
      add(blk("ffn_gate_shexp.weight"), [D, Fs], "shexp", proj(D));
      add(blk("ffn_up_shexp.weight"), [D, Fs], "shexp", proj(D));
      add(blk("ffn_down_shexp.weight"), [Fs, D], "shexp_down", out(Fs));
    }
  };
  for (let i = 0; i < p.nLayer; i++) block(i, (i + 1) % p.fullAttentionInterval === 0);
  if (o.mtp) {
    const i = p.nLayer;
    block(i, true);
    // The draft's input: [RMSNorm(embedding) | RMSNorm(hidden state)] projected back to D.
    const eh: Init = o.predictable ? { dist: "identity" } : proj(2 * D);
    add(`blk.${i}.nextn.eh_proj.weight`, [2 * D, D], "attn", eh);
    add(`blk.${i}.nextn.enorm.weight`, [D], "vector", NORM);
    add(`blk.${i}.nextn.hnorm.weight`, [D], "vector", NORM);
    add(`blk.${i}.nextn.shared_head_norm.weight`, [D], "vector", NORM);
  }
  add("output_norm.weight", [D], "vector", NORM);
  if (!o.tied) add("output.weight", [D, V], "output", proj(D));
  return tensors;
}

/** A predictable model's LM head: row t + 1 is token_embd's row t, in the head's own type. */
function predictableHead(tensors: TensorDef[]): TensorDef[] {
  const embd = tensors.find((t) => t.name === "token_embd.weight")!;
  return tensors.map((t) =>
    t.name === "output.weight" ? { ...t, init: { dist: "rows-of", source: embd, shift: 1 } } : t
  );
}

function archKeys(p: Preset, arch: Arch, mtp: boolean): GgufMetaEntry[] {
  const u32 = (key: string, value: number): GgufMetaEntry => ({
    key: `${arch}.${key}`,
    type: "u32",
    value,
  });
  const f32 = (key: string, value: number): GgufMetaEntry => ({
    key: `${arch}.${key}`,
    type: "f32",
    value,
  });
  const keys = [
    u32("block_count", p.nLayer + (mtp ? 1 : 0)),
    u32("context_length", p.contextLength),
    u32("embedding_length", p.D),
    u32("attention.head_count", p.Hq),
    u32("attention.head_count_kv", p.Hkv),
    u32("attention.key_length", p.Dh),
    u32("attention.value_length", p.Dh),
    u32("rope.dimension_count", p.nRot),
    f32("rope.freq_base", p.ropeBase),
    f32("attention.layer_norm_rms_epsilon", p.eps),
    u32("full_attention_interval", p.fullAttentionInterval),
    u32("ssm.conv_kernel", p.Kc),
    u32("ssm.state_size", p.Dk),
    u32("ssm.group_count", p.Nk),
    u32("ssm.time_step_rank", p.Nv),
    u32("ssm.inner_size", p.Nv * p.Dv),
  ];
  // qwen35moe files carry no dense width; the 80B qwen3next file does (docs/model_arch.md §2.2).
  if (arch !== "qwen35moe") keys.push(u32("feed_forward_length", p.F));
  if (arch !== "qwen35") {
    keys.push(
      u32("expert_count", p.E),
      u32("expert_used_count", p.Ku),
      u32("expert_feed_forward_length", p.Fe),
      u32("expert_shared_feed_forward_length", p.Fs),
    );
  }
  if (arch !== "qwen3next") {
    keys.push(u32("nextn_predict_layers", mtp ? 1 : 0), {
      key: `${arch}.rope.dimension_sections`,
      type: "array",
      itemType: "i32",
      value: [...p.ropeSections],
    });
  }
  return keys;
}

/** Vocabularies by preset: training the merges takes a moment and plans are made repeatedly. */
const VOCABS = new Map<PresetName, Vocab>();

function vocabOf(p: Preset): Vocab {
  let vocab = VOCABS.get(p.name);
  if (!vocab) VOCABS.set(p.name, vocab = buildVocab(p.vocab));
  return vocab;
}

/** Metadata and tensor list of the model `spec` describes; nothing is drawn or written. */
export function planModel(spec: ModelSpec): ModelPlan {
  const preset = PRESETS[spec.preset];
  if (!preset) {
    throw new RangeError(
      `Cannot plan a model for preset "${spec.preset}": use one of ${
        Object.keys(PRESETS).join(", ")
      }`,
    );
  }
  const layers = spec.layers ?? preset.nLayer;
  if (!Number.isInteger(layers) || layers < 1 || layers > MAX_LAYERS) {
    throw new RangeError(
      `Cannot plan a model of ${spec.layers} layers: expected a whole number from 1 to ${MAX_LAYERS}`,
    );
  }
  const p = { ...preset, nLayer: layers };
  const quant = spec.quant ?? "f32";
  if (!QUANTS.includes(quant)) {
    throw new RangeError(
      `Cannot plan a model with quant "${quant}": use one of ${QUANTS.join(", ")}`,
    );
  }
  const layout = spec.layout ?? "split";
  if (
    layout !== "split" && layout !== "legacy" || (layout === "legacy" && spec.arch !== "qwen3next")
  ) {
    throw new RangeError(
      `Cannot plan a ${spec.arch} model with layout "${layout}": "legacy" (fused ssm_in) exists ` +
        `only for qwen3next; use "split"`,
    );
  }
  const mtp = spec.mtp ?? false;
  if (mtp && spec.arch === "qwen3next") {
    throw new RangeError(
      "Cannot plan a qwen3next model with an MTP block: its files carry no nextn_predict_layers " +
        "(docs/model_arch.md §2.2); use qwen35 or qwen35moe",
    );
  }
  const predictable = spec.predictable ?? false;
  if (predictable && spec.tied) {
    throw new RangeError(
      "Cannot plan a predictable model with a tied head: its LM head is token_embd shifted by " +
        "one row, which needs output.weight; leave out --tied",
    );
  }
  const vocab = vocabOf(p);
  const chooseType = typeChooser(quant);
  const typed = planTensors(
    p,
    spec.arch,
    layout,
    { tied: spec.tied ?? false, mtp, predictable },
    vocab.tokens.length,
  ).map((t) => ({ ...t, type: chooseType(t.role) }));
  const tensors = predictable ? predictableHead(typed) : typed;
  let dataBytes = 0;
  for (const t of tensors) {
    const g = blockGeometry(t.type)!;
    if (t.shape[0] % g.blockSize !== 0) {
      throw new RangeError(
        `Cannot plan "${t.name}" [${t.shape}] as ${typeName(t.type)}: rows of ${t.shape[0]} are ` +
          `not a multiple of its block size ${g.blockSize}; pick a preset with 256-multiple widths`,
      );
    }
    dataBytes += rowBytes(t.type, t.shape[0]) * t.shape.slice(1).reduce((a, b) => a * b, 1);
  }
  const seed = spec.seed ?? 1;
  const fileType = FILE_TYPE[quant];
  const meta: GgufMetaEntry[] = [
    { key: "general.architecture", type: "string", value: spec.arch },
    {
      key: "general.name",
      type: "string",
      value: `tandem ${
        predictable ? "predictable" : "random"
      } ${p.name} ${spec.arch} ${quant} seed ${seed}`,
    },
    ...(fileType === undefined
      ? []
      : [{ key: "general.file_type", type: "u32", value: fileType } as const]),
    { key: "general.quantization_version", type: "u32", value: 2 },
    ...archKeys(p, spec.arch, mtp),
    ...tokenizerEntries(vocab, {
      pre: spec.arch === "qwen3next" ? "qwen2" : "qwen35",
      chatTemplate: CHAT_TEMPLATE,
    }),
  ];
  return { meta, tensors, dataBytes };
}

/** A file stem that names every spec field: "tiny-qwen35moe-q8_0-seed1-tied-mtp". */
export function modelFileStem(spec: ModelSpec): string {
  const parts: string[] = [spec.preset, spec.arch];
  if (spec.arch === "qwen3next") parts.push(spec.layout ?? "split");
  parts.push(spec.quant ?? "f32", `seed${spec.seed ?? 1}`);
  if (spec.layers !== undefined) parts.push(`layers${spec.layers}`);
  if (spec.tied) parts.push("tied");
  if (spec.mtp) parts.push("mtp");
  if (spec.predictable) parts.push("predictable");
  return parts.join("-");
}

/** Models smaller than this are made on the calling thread; starting workers costs more. */
const POOL_MIN_BYTES = 256 << 20;

export interface GenerateOptions {
  /** gguf-split shards; default 1 (one file). */
  readonly split?: number;
  /**
   * Worker threads making tensor bytes; 0 makes them on this thread. Default: one per core (at
   * most 16) for models over 256 MiB, else 0. The bytes do not depend on it.
   */
  readonly workers?: number;
}

/**
 * Writes the model to `path` (or, with split > 1, to gguf-split shards named after it) and
 * returns the written paths. The same spec always gives the same bytes. Memory: one tensor's
 * bytes at a time (twice that while its parts are joined), plus the metadata.
 */
export async function generateModel(
  path: string,
  spec: ModelSpec,
  options: GenerateOptions = {},
): Promise<string[]> {
  const plan = planModel(spec);
  const seed = spec.seed ?? 1;
  const synthesis = PRESETS[spec.preset].synthesis;
  const workers = options.workers ??
    (plan.dataBytes > POOL_MIN_BYTES ? Math.min(navigator.hardwareConcurrency, 16) : 0);
  const pool = workers > 0 ? new ChunkPool(workers) : undefined;
  try {
    return await writeGguf(
      path,
      plan.meta,
      plan.tensors,
      (_, i) =>
        pool
          ? pool.tensor(plan.tensors[i], seed, synthesis)
          : tensorData(plan.tensors[i], seed, synthesis),
      { shards: options.split ?? 1 },
    );
  } finally {
    pool?.close();
  }
}
