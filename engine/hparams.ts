// Hyperparameters of a qwen3next / qwen35moe / qwen35 model, read from GGUF metadata.
// The one place that turns `%s.*` keys into sizes; every engine (reference, GPU) starts here.

import { describeValue, type GgufValue } from "./gguf/gguf_model.ts";

export type Arch = "qwen3next" | "qwen35moe" | "qwen35";
export const ARCHS: readonly Arch[] = ["qwen3next", "qwen35moe", "qwen35"];

/**
 * Dimension legend (docs/model_arch.md §2.1): D d_model, Hq/Hkv query/KV heads, Dh head dim,
 * Nk/Nv DeltaNet key/value heads, Dk/Dv their head dims, Kc conv taps, C conv channels,
 * E experts, Ku experts used, Fe/Fs routed/shared expert width, F dense FFN width, V vocab.
 */
export interface HParams {
  readonly arch: Arch;
  /** Layers run in normal decoding (block_count minus MTP blocks). */
  readonly nLayer: number;
  readonly D: number;
  readonly Hq: number;
  readonly Hkv: number;
  readonly Dh: number;
  /** Rotated dimensions of each head (partial RoPE). */
  readonly nRot: number;
  readonly ropeBase: number;
  /** IMROPE sections for qwen35/qwen35moe; empty for qwen3next (NEOX). */
  readonly ropeSections: readonly number[];
  readonly eps: number;
  readonly Kc: number;
  readonly Nk: number;
  readonly Nv: number;
  readonly Dk: number;
  readonly Dv: number;
  /** Conv channels: 2·Nk·Dk + Nv·Dv. */
  readonly C: number;
  /** 0 for the dense arch. */
  readonly E: number;
  readonly Ku: number;
  readonly Fe: number;
  readonly Fs: number;
  /** Dense FFN width (qwen35). */
  readonly F: number;
  readonly V: number;
  /** true where block i is a gated-DeltaNet block, false where it is full attention. */
  readonly isDeltaNet: readonly boolean[];
}

/** llama.cpp's LLAMA_MAX_LAYERS: the most blocks a model may declare. */
export const MAX_LAYERS = 512;
/** llama.cpp's LLAMA_MAX_EXPERTS. */
export const MAX_EXPERTS = 512;
/**
 * The largest width, head count, head size or vocabulary a model may declare: far above every
 * published model. Tensor shapes are checked against these before any weight or state is sized
 * by them; the bound keeps a hostile header from sizing anything before that check.
 */
export const MAX_DIM = 1 << 24;

type Meta = ReadonlyMap<string, GgufValue>;

function num(meta: Meta, key: string, fallback?: number): number {
  const v = meta.get(key);
  if (v === undefined) {
    if (fallback !== undefined) return fallback;
    throw new SyntaxError(`Cannot read model hyperparameters: metadata key "${key}" is missing`);
  }
  if (Array.isArray(v)) {
    const first = v[0];
    if (typeof first === "number" && v.every((x) => x === first)) return first;
    throw new SyntaxError(
      `Cannot read model hyperparameters: "${key}" varies per layer, which is not supported`,
    );
  }
  if (typeof v === "number") return v;
  if (typeof v === "bigint") return Number(v);
  throw new SyntaxError(
    `Cannot read model hyperparameters: "${key}" is ${typeof v}, expected a number`,
  );
}

/** A whole number in [min, max]; the error names the key and the allowed range. */
function count(meta: Meta, key: string, min: number, max: number, fallback?: number): number {
  const v = num(meta, key, fallback);
  if (!Number.isSafeInteger(v) || v < min || v > max) {
    throw new RangeError(
      `Cannot read model hyperparameters: "${key}" is ${v}, expected a whole number ` +
        `${min}..${max}; the file is corrupt or not a supported model`,
    );
  }
  return v;
}

/** A finite number above 0 (epsilons, RoPE bases). */
function positive(meta: Meta, key: string, fallback?: number): number {
  const v = num(meta, key, fallback);
  if (!Number.isFinite(v) || v <= 0) {
    throw new RangeError(
      `Cannot read model hyperparameters: "${key}" is ${v}, expected a finite number > 0`,
    );
  }
  return v;
}

/**
 * Reads and checks the hyperparameters: a SyntaxError names a missing or mistyped key, a RangeError
 * a count outside its bound (before anything is sized by it).
 */
export function readHParams(meta: Meta): HParams {
  const archValue = meta.get("general.architecture");
  if (typeof archValue !== "string" || !ARCHS.includes(archValue as Arch)) {
    throw new SyntaxError(
      `Cannot load model: general.architecture is ${describeValue(archValue)}, expected one of ${
        ARCHS.join(", ")
      }`,
    );
  }
  const arch = archValue as Arch;
  const key = (name: string) => `${arch}.${name}`;
  const dim = (name: string, fallback?: number) => count(meta, key(name), 1, MAX_DIM, fallback);
  const blockCount = count(meta, key("block_count"), 1, MAX_LAYERS);
  const nLayer = blockCount - count(meta, key("nextn_predict_layers"), 0, blockCount - 1, 0);
  const D = dim("embedding_length");
  const Hq = dim("attention.head_count");
  const Hkv = dim("attention.head_count_kv", Hq);
  const Dh = dim("attention.key_length", D / Hq);
  const Dk = dim("ssm.state_size");
  const Nk = dim("ssm.group_count");
  const Nv = dim("ssm.time_step_rank");
  const Dv = dim("ssm.inner_size") / Nv;
  const moe = arch !== "qwen35";
  const E = moe ? count(meta, key("expert_count"), 1, MAX_EXPERTS) : 0;
  const interval = count(meta, key("full_attention_interval"), 1, MAX_LAYERS, 4);
  const recurrent = meta.get(key("attention.recurrent_layers"));
  const isDeltaNet = Array.from(
    { length: nLayer },
    (_, i) => Array.isArray(recurrent) ? Boolean(recurrent[i]) : (i + 1) % interval !== 0,
  );
  const tokens = meta.get("tokenizer.ggml.tokens");
  const V = dim("vocab_size", Array.isArray(tokens) ? tokens.length : undefined);
  const sections = meta.get(key("rope.dimension_sections"));
  const hp: HParams = {
    arch,
    nLayer,
    D,
    Hq,
    Hkv,
    Dh,
    nRot: count(meta, key("rope.dimension_count"), 0, Dh, Dh),
    ropeBase: positive(meta, key("rope.freq_base"), 10000),
    ropeSections: arch === "qwen3next" ? [] : (Array.isArray(sections) ? sections.map(Number) : []),
    eps: positive(meta, key("attention.layer_norm_rms_epsilon")),
    Kc: dim("ssm.conv_kernel"),
    Nk,
    Nv,
    Dk,
    Dv,
    C: 2 * Nk * Dk + Nv * Dv,
    E,
    Ku: moe ? count(meta, key("expert_used_count"), 1, E) : 0,
    Fe: moe ? dim("expert_feed_forward_length") : 0,
    Fs: moe ? dim("expert_shared_feed_forward_length") : 0,
    F: moe ? count(meta, key("feed_forward_length"), 0, MAX_DIM, 0) : dim("feed_forward_length"),
    V,
    isDeltaNet,
  };
  if (arch !== "qwen3next" && hp.ropeSections.length === 0) {
    throw new SyntaxError(
      `Cannot load model: ${arch}.rope.dimension_sections is missing (required for ${arch})`,
    );
  }
  if (Nv % Nk !== 0 || !Number.isInteger(Dv) || Hq % Hkv !== 0 || nLayer <= 0) {
    throw new SyntaxError(
      `Cannot load model: inconsistent sizes (layers ${nLayer}, Hq ${Hq}, Hkv ${Hkv}, Nk ${Nk}, Nv ${Nv}, Dv ${Dv})`,
    );
  }
  return hp;
}

/** DeltaNet key head used by value head h: interleaved for qwen3next, tiled for qwen35*. */
export function keyHeadOf(hp: HParams, h: number): number {
  return hp.arch === "qwen3next" ? Math.floor(h / (hp.Nv / hp.Nk)) : h % hp.Nk;
}
