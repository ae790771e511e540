// The weights of one GPU stage: its layers' tensors uploaded still quantized (matrices) or as f32
// (small vectors), arranged so each projection writes its rows into one shared activation row.
// Read from a GgufModel by engine/gpu/gpu_stage.ts; consumed by engine/gpu/gpu_forward.ts.
//
// Dimensions (engine/hparams.ts): D d_model, Hq/Hkv heads, Dh head dim, C conv channels,
// Kc conv taps, Nk/Nv DeltaNet key/value heads, Dk/Dv their dims, E experts, Fe/Fs expert
// widths, F dense width, V vocab. A GGUF {cols, rows} matrix computes rows outputs from cols.
//
// Layout changes happen here by permuting whole quantized rows (exact): legacy qwen3next ssm_in
// becomes [q | k | v | z] and ssm_ba becomes [b | a], so the forward pass sees one layout.

import type { GgufModel, GgufTensorInfo } from "../gguf/gguf_model.ts";
import { hasMtpBlock, stageTensorNames } from "../gguf/stage_shard.ts";
import type { HParams } from "../hparams.ts";
import { dequantize } from "../quant/dequant.ts";
import { dummyStorage, FillStaging, formatBytes, type GpuMemory } from "./buffers.ts";
import { type GpuTensor, uploadConcat, type UploadOptions, uploadTensor } from "./tensor.ts";

/** A matrix whose output rows land at `offset` of a wider activation row. */
export interface Projection {
  readonly w: GpuTensor;
  readonly offset: number;
}

export interface AttentionWeights {
  readonly kind: "attention";
  /** Into a (2·Hq·Dh + 2·Hkv·Dh) row: [q and gate interleaved per head | k | v]. */
  readonly qkv: readonly Projection[];
  readonly qNorm: GPUBuffer; // (Dh) f32
  readonly kNorm: GPUBuffer; // (Dh) f32
  readonly out: GpuTensor; // {Hq·Dh, D}
}

export interface DeltaNetWeights {
  readonly kind: "deltanet";
  /**
   * Into a (C + Nv·Dv + 2·Nv) row: [q (Nk·Dk) | k (Nk·Dk) | v (Nv·Dv) | z (Nv·Dv) | b (Nv) |
   * a (Nv)]: one dispatch where the types allow.
   */
  readonly qkvzba: readonly Projection[];
  readonly conv: GPUBuffer; // (C, Kc) f32
  readonly params: GPUBuffer; // [dt_bias (Nv) | ssm_a (Nv) | ssm_norm (Dv)] f32
  readonly out: GpuTensor; // {Nv·Dv, D}
}

export interface MoeWeights {
  readonly kind: "moe";
  /** Into an (E + 1) row: router logits, then the shared expert's gate logit. */
  readonly router: readonly Projection[];
  /** Expert stacks into a (2·Fe) row per (token, rank): [gate | up]. */
  readonly gateUp: readonly Projection[];
  readonly down: GpuTensor; // {Fe, D, E}
  /** Shared expert into a (2·Fs) row: [gate | up]. */
  readonly sharedGateUp: readonly Projection[];
  readonly sharedDown: GpuTensor; // {Fs, D}
}

export interface DenseWeights {
  readonly kind: "dense";
  /** Into a (2·F) row: [gate | up]. */
  readonly gateUp: readonly Projection[];
  readonly down: GpuTensor; // {F, D}
}

export interface LayerWeights {
  readonly attnNorm: GPUBuffer; // (D) f32
  readonly postNorm: GPUBuffer; // (D) f32, post_attention_norm
  readonly mixer: AttentionWeights | DeltaNetWeights;
  readonly ffn: MoeWeights | DenseWeights;
}

/**
 * The MTP block (docs/model_arch.md §3.6): a full-attention block at index nLayer whose input is
 * eh_proj of [enorm(embedding) | hnorm(hidden)], and whose output shared_head_norm norms for the
 * model's LM head.
 */
export interface MtpWeights {
  readonly layer: LayerWeights;
  readonly enorm: GPUBuffer; // (D) f32
  readonly hnorm: GPUBuffer; // (D) f32
  readonly headNorm: GPUBuffer; // (D) f32, shared_head_norm
  readonly ehProj: GpuTensor; // {2·D, D}
}

export interface StageWeights {
  readonly layers: readonly LayerWeights[];
  /** The MTP block, on a last stage opened with `mtp` whose file has one. */
  readonly mtp?: MtpWeights;
  readonly embedding?: GpuTensor; // {D, V} token_embd (first stage)
  readonly outputNorm?: GPUBuffer; // (D) f32 (last stage)
  readonly output?: GpuTensor; // {D, V} output, or token_embd when tied (last stage)
  /** GPU bytes per tensor class, for the start-up report. */
  readonly bytes: ReadonlyMap<string, number>;
}

export interface LoadStageOptions {
  readonly first: number;
  readonly end: number;
  /** Largest part per tensor (default: the device's binding limit); tests force splits. */
  readonly maxPartBytes?: number;
  /** Progress and the memory report go here. */
  readonly log?: (line: string) => void;
  /**
   * Describe the weights only: check the tensors and plan their parts, reading nothing and
   * creating no buffers (every buffer is a dummy). A stage records its steps against these
   * shapes to compile its kernels while the real load runs.
   */
  readonly describe?: boolean;
  /**
   * Also load the MTP block (and token_embd, which it embeds with) where the stage is the last
   * and the file has one (hasMtpBlock).
   */
  readonly mtp?: boolean;
}

/** The nextn vectors of the MTP block, each uploaded on its own (memory_plan.ts counts them). */
export const MTP_VECTORS = ["enorm", "hnorm", "shared_head_norm"] as const;

/** Bytes above which loading shows progress. */
const PROGRESS_BYTES = 256 * 1024 * 1024;

class Loader {
  readonly bytes = new Map<string, number>();
  /** Host pieces every upload of this load streams through (builtin provider). */
  readonly staging = new FillStaging();
  #done = 0;
  #shown = -1;

  constructor(
    readonly mem: GpuMemory,
    readonly model: GgufModel,
    readonly hp: HParams,
    readonly options: LoadStageOptions,
    readonly total: number,
  ) {}

  info(name: string, shape: readonly number[]): GgufTensorInfo {
    const t = this.model.tensors.get(name);
    if (!t) {
      throw new RangeError(
        `Cannot load the GPU stage: "${this.model.path}" has no tensor "${name}"; the file does not match its architecture metadata`,
      );
    }
    const same = Array.from({ length: Math.max(t.shape.length, shape.length) })
      .every((_, i) => (t.shape[i] ?? 1) === (shape[i] ?? 1));
    if (!same) {
      throw new RangeError(
        `Cannot load "${name}" from "${this.model.path}": shape [${
          t.shape.join(", ")
        }], expected [${shape.join(", ")}]`,
      );
    }
    return t;
  }

  #count(cls: string, n: number): void {
    this.bytes.set(cls, (this.bytes.get(cls) ?? 0) + n);
  }

  #progress(n: number): void {
    this.#done += n;
    if (this.total < PROGRESS_BYTES || !this.options.log) return;
    const step = Math.floor((20 * this.#done) / this.total);
    if (step === this.#shown) return;
    this.#shown = step;
    const gib = (b: number) => (b / 2 ** 30).toFixed(2);
    this.options.log(
      `Loading weights [${"#".repeat(step)}${".".repeat(20 - step)}] ${gib(this.#done)}/${
        gib(this.total)
      } GiB`,
    );
  }

  /** A matrix kept quantized on the GPU. */
  async matrix(
    cls: string,
    name: string,
    shape: readonly number[],
    rowOrder?: Uint32Array,
  ): Promise<GpuTensor> {
    this.info(name, shape);
    const opts: UploadOptions = {
      maxPartBytes: this.options.maxPartBytes,
      rowOrder,
      onBytes: (n) => this.#progress(n),
      staging: this.staging,
      describe: this.options.describe,
    };
    const t = await uploadTensor(this.mem, this.model, name, opts);
    this.#count(cls, t.bytes);
    return t;
  }

  /**
   * Matrices that read the same input and write consecutive parts of one activation row
   * (`offset` of the first, then each after the previous). Each run of neighbours of one type
   * is joined into one tensor, so one dispatch computes the run.
   */
  async projections(
    cls: string,
    offset: number,
    parts: readonly { name: string; shape: readonly number[] }[],
  ): Promise<Projection[]> {
    const infos = parts.map((p) => this.info(p.name, p.shape));
    const out: Projection[] = [];
    let at = offset;
    for (let i = 0; i < parts.length;) {
      let j = i + 1;
      while (j < parts.length && infos[j].type === infos[i].type) j++;
      const names = parts.slice(i, j).map((p) => p.name);
      let w: GpuTensor;
      if (names.length === 1) w = await this.matrix(cls, parts[i].name, parts[i].shape);
      else {
        w = await uploadConcat(this.mem, this.model, names.join("+"), names, {
          maxPartBytes: this.options.maxPartBytes,
          onBytes: (n) => this.#progress(n),
          staging: this.staging,
          describe: this.options.describe,
        });
        this.#count(cls, w.bytes);
      }
      out.push({ w, offset: at });
      at += w.matrixRows;
      i = j;
    }
    return out;
  }

  /** A small tensor dequantized to f32 on the CPU. */
  async vector(name: string, shape: readonly number[]): Promise<Float32Array> {
    const t = this.info(name, shape);
    if (this.options.describe) return new Float32Array(0);
    const n = shape.reduce((a, b) => a * b, 1);
    const bytes = await this.model.readTensor(name);
    this.#progress(bytes.length);
    return dequantize(t.type, bytes, n);
  }

  /** Small f32 vectors concatenated into one GPU buffer. */
  async vectors(cls: string, label: string, parts: Promise<Float32Array>[]): Promise<GPUBuffer> {
    const values = await Promise.all(parts);
    if (this.options.describe) return dummyStorage(this.mem.ctx);
    const all = new Float32Array(values.reduce((s, v) => s + v.length, 0));
    let at = 0;
    for (const v of values) {
      all.set(v, at);
      at += v.length;
    }
    const buffer = this.mem.upload(label, all);
    this.#count(cls, buffer.size);
    return buffer;
  }
}

/** Row order turning a per-key-head grouped tensor into [part 0 of all groups | part 1 | …]. */
function ungroup(groups: number, sizes: readonly number[]): Uint32Array {
  const g = sizes.reduce((a, b) => a + b, 0);
  const order: number[] = [];
  let start = 0;
  for (const size of sizes) {
    for (let kh = 0; kh < groups; kh++) {
      for (let i = 0; i < size; i++) order.push(kh * g + start + i);
    }
    start += size;
  }
  return Uint32Array.from(order);
}

async function attention(l: Loader, il: number): Promise<AttentionWeights> {
  const { D, Hq, Hkv, Dh } = l.hp;
  const p = `blk.${il}`;
  const qDim = 2 * Hq * Dh;
  const kvDim = Hkv * Dh;
  const cls = "attention";
  const qkv = l.model.tensors.has(`${p}.attn_qkv.weight`)
    ? [{ w: await l.matrix(cls, `${p}.attn_qkv.weight`, [D, qDim + 2 * kvDim]), offset: 0 }]
    : await l.projections(cls, 0, [
      { name: `${p}.attn_q.weight`, shape: [D, qDim] },
      { name: `${p}.attn_k.weight`, shape: [D, kvDim] },
      { name: `${p}.attn_v.weight`, shape: [D, kvDim] },
    ]);
  return {
    kind: "attention",
    qkv,
    qNorm: await l.vectors("norms", `${p}.attn_q_norm`, [
      l.vector(`${p}.attn_q_norm.weight`, [Dh]),
    ]),
    kNorm: await l.vectors("norms", `${p}.attn_k_norm`, [
      l.vector(`${p}.attn_k_norm.weight`, [Dh]),
    ]),
    out: await l.matrix(cls, `${p}.attn_output.weight`, [Hq * Dh, D]),
  };
}

async function deltaNet(l: Loader, il: number): Promise<DeltaNetWeights> {
  const { D, Nk, Nv, Dk, Dv, C, Kc, arch } = l.hp;
  const p = `blk.${il}`;
  const r = Nv / Nk;
  const valueDim = Nv * Dv;
  const cls = "deltanet";
  const baOffset = C + valueDim;
  let qkvzba: Projection[];
  if (arch !== "qwen3next") {
    qkvzba = await l.projections(cls, 0, [
      { name: `${p}.attn_qkv.weight`, shape: [D, C] },
      { name: `${p}.attn_gate.weight`, shape: [D, valueDim] },
      { name: `${p}.ssm_beta.weight`, shape: [D, Nv] },
      { name: `${p}.ssm_alpha.weight`, shape: [D, Nv] },
    ]);
  } else {
    // qwen3next's ssm_ba (and legacy ssm_in) group rows per key head: [b (r) | a (r)] and
    // [q (Dk) | k (Dk) | v (r·Dv) | z (r·Dv)] (docs/model_arch.md §4.6.1); reordered, so they
    // stay apart.
    qkvzba = l.model.tensors.has(`${p}.attn_qkv.weight`)
      ? await l.projections(cls, 0, [
        { name: `${p}.attn_qkv.weight`, shape: [D, C] },
        { name: `${p}.attn_gate.weight`, shape: [D, valueDim] },
      ])
      : [{
        w: await l.matrix(
          cls,
          `${p}.ssm_in.weight`,
          [D, C + valueDim],
          ungroup(Nk, [Dk, Dk, r * Dv, r * Dv]),
        ),
        offset: 0,
      }];
    qkvzba.push({
      w: await l.matrix(cls, `${p}.ssm_ba.weight`, [D, 2 * Nv], ungroup(Nk, [r, r])),
      offset: baOffset,
    });
  }
  return {
    kind: "deltanet",
    qkvzba,
    conv: await l.vectors(cls, `${p}.ssm_conv1d`, [l.vector(`${p}.ssm_conv1d.weight`, [Kc, C])]),
    params: await l.vectors(cls, `${p}.ssm params`, [
      l.vector(`${p}.ssm_dt.bias`, [Nv]),
      l.vector(`${p}.ssm_a`, [Nv]),
      l.vector(`${p}.ssm_norm.weight`, [Dv]),
    ]),
    out: await l.matrix(cls, `${p}.ssm_out.weight`, [valueDim, D]),
  };
}

async function moe(l: Loader, il: number): Promise<MoeWeights> {
  const { D, E, Fe, Fs } = l.hp;
  const p = `blk.${il}`;
  const gateUp = l.model.tensors.has(`${p}.ffn_gate_up_exps.weight`)
    ? [{ w: await l.matrix("experts", `${p}.ffn_gate_up_exps.weight`, [D, 2 * Fe, E]), offset: 0 }]
    : await l.projections("experts", 0, [
      { name: `${p}.ffn_gate_exps.weight`, shape: [D, Fe, E] },
      { name: `${p}.ffn_up_exps.weight`, shape: [D, Fe, E] },
    ]);
  return {
    kind: "moe",
    router: await l.projections("router", 0, [
      { name: `${p}.ffn_gate_inp.weight`, shape: [D, E] },
      { name: `${p}.ffn_gate_inp_shexp.weight`, shape: [D] },
    ]),
    gateUp,
    down: await l.matrix("experts", `${p}.ffn_down_exps.weight`, [Fe, D, E]),
    sharedGateUp: await l.projections("shared expert", 0, [
      { name: `${p}.ffn_gate_shexp.weight`, shape: [D, Fs] },
      { name: `${p}.ffn_up_shexp.weight`, shape: [D, Fs] },
    ]),
    sharedDown: await l.matrix("shared expert", `${p}.ffn_down_shexp.weight`, [Fs, D]),
  };
}

async function dense(l: Loader, il: number): Promise<DenseWeights> {
  const { D, F } = l.hp;
  const p = `blk.${il}`;
  return {
    kind: "dense",
    gateUp: await l.projections("dense ffn", 0, [
      { name: `${p}.ffn_gate.weight`, shape: [D, F] },
      { name: `${p}.ffn_up.weight`, shape: [D, F] },
    ]),
    down: await l.matrix("dense ffn", `${p}.ffn_down.weight`, [F, D]),
  };
}

/**
 * Uploads what layers [first, end) need: their blocks, plus token_embd on the first stage and
 * output_norm + the LM head (output, or token_embd when tied) on the last. Logs GPU memory per
 * tensor class.
 */
export async function loadStageWeights(
  mem: GpuMemory,
  model: GgufModel,
  hp: HParams,
  options: LoadStageOptions,
): Promise<StageWeights> {
  const { first, end } = options;
  // The stage's tensor bytes size the progress bar.
  const withMtp = !!options.mtp && end === hp.nLayer && hasMtpBlock(model, hp.nLayer);
  const names = stageTensorNames(model, hp.nLayer, { first, end });
  if (withMtp) {
    const mtpBlock = `blk.${hp.nLayer}.`;
    names.push(...[...model.tensors.keys()].filter((n) => n.startsWith(mtpBlock)));
    if (first !== 0) names.push("token_embd.weight");
  }
  const total = [...new Set(names)]
    .reduce((s, n) => s + (model.tensors.get(n)?.nbytes ?? 0), 0);
  const l = new Loader(mem, model, hp, options, total);
  const layers: LayerWeights[] = [];
  for (let il = first; il < end; il++) layers.push(await layer(l, il));
  let mtp: MtpWeights | undefined;
  if (withMtp) {
    const p = `blk.${hp.nLayer}.nextn`;
    const [enorm, hnorm, headNorm] = await Promise.all(
      MTP_VECTORS.map((v) => l.vectors("mtp", `${p}.${v}`, [l.vector(`${p}.${v}.weight`, [hp.D])])),
    );
    mtp = {
      layer: await layer(l, hp.nLayer),
      enorm,
      hnorm,
      headNorm,
      ehProj: await l.matrix("mtp", `${p}.eh_proj.weight`, [2 * hp.D, hp.D]),
    };
  }
  const embedding = first === 0 || withMtp
    ? await l.matrix("token embedding", "token_embd.weight", [hp.D, hp.V])
    : undefined;
  let outputNorm: GPUBuffer | undefined;
  let output: GpuTensor | undefined;
  if (end === hp.nLayer) {
    outputNorm = await l.vectors("norms", "output_norm", [
      l.vector("output_norm.weight", [hp.D]),
    ]);
    const tied = !model.tensors.has("output.weight");
    output = tied && embedding
      ? embedding
      : await l.matrix("lm head", tied ? "token_embd.weight" : "output.weight", [hp.D, hp.V]);
  }
  const report = [...l.bytes].map(([cls, n]) => `${cls} ${formatBytes(n)}`).join(", ");
  if (!options.describe) options.log?.(`GPU weights for layers ${first}..${end}: ${report}`);
  return { layers, mtp, embedding, outputNorm, output, bytes: l.bytes };
}

/** Block il: its norms, its mixer (DeltaNet or gated attention) and its FFN. */
async function layer(l: Loader, il: number): Promise<LayerWeights> {
  const { hp } = l;
  const p = `blk.${il}`;
  return {
    attnNorm: await l.vectors("norms", `${p}.attn_norm`, [
      l.vector(`${p}.attn_norm.weight`, [hp.D]),
    ]),
    postNorm: await l.vectors("norms", `${p}.post_attention_norm`, [
      l.vector(`${p}.post_attention_norm.weight`, [hp.D]),
    ]),
    mixer: hp.isDeltaNet[il] ? await deltaNet(l, il) : await attention(l, il),
    ffn: hp.arch === "qwen35" ? await dense(l, il) : await moe(l, il),
  };
}
