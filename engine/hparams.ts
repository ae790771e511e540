// Hyperparameters of a qwen3next / qwen35moe / qwen35 model, read from GGUF metadata.
// The one place that turns `%s.*` keys into sizes; every engine (reference, GPU) starts here.

import { describeValue, type GgufModel, type GgufValue } from "./gguf/gguf_model.ts";
import { readingFile } from "./gguf/model_errors.ts";

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

/** The refusal of the value under `key`: its value as stored and what was expected. */
function refusal(
  kind: typeof SyntaxError | typeof RangeError,
  key: string,
  value: GgufValue | undefined,
  expected: string,
): Error {
  return new kind(
    `Cannot read model hyperparameters: "${key}" is ${describeValue(value)}, expected ${expected}`,
  );
}

/** Where a key's default comes from, when the key is absent. */
interface Default {
  /** undefined where what it comes from is absent too. */
  readonly value: number | undefined;
  /** e.g. "the length of tokenizer.ggml.tokens"; omitted for a constant. */
  readonly from?: string;
}

/**
 * The number under `key` (one value written per layer counts as that value), or its default when
 * absent; a SyntaxError names what stands there instead.
 */
function num(meta: Meta, key: string, expected: string, fallback?: Default): number {
  const v = meta.get(key);
  if (v === undefined) {
    if (fallback?.value !== undefined) return fallback.value;
    const or = fallback?.from ? `, or ${fallback.from} to give its default` : "";
    throw refusal(SyntaxError, key, v, `${expected}${or}`);
  }
  const one = Array.isArray(v) && v.length > 0 && v.every((x) => x === v[0]) ? v[0] : v;
  if (typeof one === "number") return one;
  if (typeof one === "bigint") return Number(one);
  const note = Array.isArray(v) ? ", the same for every layer" : "";
  throw refusal(SyntaxError, key, v, `${expected}${note}`);
}

/**
 * A whole number in [min, max] (`bound` says which key sets max, and its value); the error names
 * the key, the value as stored, and the range.
 */
function count(
  meta: Meta,
  key: string,
  min: number,
  max: number,
  options: { readonly fallback?: Default; readonly bound?: string } = {},
): number {
  const expected = `a whole number ${min}..${max}${options.bound ? ` (${options.bound})` : ""}`;
  const v = num(meta, key, expected, options.fallback);
  if (!Number.isSafeInteger(v) || v < min || v > max) {
    if (!meta.has(key)) {
      throw new RangeError(
        `Cannot read model hyperparameters: "${key}" is missing and its default, ` +
          `${options.fallback?.from}, is ${v}, expected ${expected}`,
      );
    }
    throw refusal(
      RangeError,
      key,
      meta.get(key),
      `${expected}; the file is corrupt or not a supported model`,
    );
  }
  return v;
}

/** A finite number above 0 (epsilons, RoPE bases). */
function positive(meta: Meta, key: string, fallback?: number): number {
  const expected = "a finite number > 0";
  const v = num(meta, key, expected, { value: fallback });
  if (!Number.isFinite(v) || v <= 0) throw refusal(RangeError, key, meta.get(key), expected);
  return v;
}

/** llama.cpp's limit on rope.dimension_sections: up to 4 sections (t, h, w, e). */
const MAX_ROPE_SECTIONS = 4;

/** IMROPE's sections: up to 4 whole numbers, at least one of them above 0. */
function ropeSections(meta: Meta, key: string): number[] {
  const v = meta.get(key);
  const expected = `${MAX_ROPE_SECTIONS} or fewer whole numbers 0..${MAX_DIM} with a sum above 0`;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "number")) {
    throw refusal(SyntaxError, key, v, expected);
  }
  const sections = v as number[];
  const fits = sections.length <= MAX_ROPE_SECTIONS && sections.some((x) => x > 0) &&
    sections.every((x) => Number.isSafeInteger(x) && x >= 0 && x <= MAX_DIM);
  if (!fits) throw refusal(RangeError, key, v, expected);
  return sections;
}

/** The value under `key` as stored, or `used` (its default) where it is absent. */
function shown(meta: Meta, key: string, used: number): string {
  return meta.has(key) ? describeValue(meta.get(key)) : `${used} by default`;
}

/** Refuses `key` unless its value `n` is a multiple of `of`'s value `m`. */
function multiple(meta: Meta, key: string, n: number, of: string, m: number): void {
  if (n % m !== 0) {
    throw new RangeError(
      `Cannot read model hyperparameters: "${key}" is ${shown(meta, key, n)}, expected a ` +
        `multiple of "${of}", which is ${shown(meta, of, m)}`,
    );
  }
}

/**
 * Reads and checks the hyperparameters: a SyntaxError names a missing or mistyped key, a RangeError
 * a value outside its bound or inconsistent with another key (before anything is sized by it).
 * Each names the key, its value and what was expected; the model's file is named by its caller.
 */
export function readHParams(meta: Meta): HParams {
  const archValue = meta.get("general.architecture");
  if (typeof archValue !== "string" || !ARCHS.includes(archValue as Arch)) {
    throw refusal(
      SyntaxError,
      "general.architecture",
      archValue,
      `one of ${ARCHS.map((a) => `"${a}"`).join(", ")}`,
    );
  }
  const arch = archValue as Arch;
  const key = (name: string) => `${arch}.${name}`;
  const dim = (name: string, fallback?: Default) =>
    count(meta, key(name), 1, MAX_DIM, { fallback });
  const blockCount = count(meta, key("block_count"), 1, MAX_LAYERS);
  const nLayer = blockCount - count(meta, key("nextn_predict_layers"), 0, blockCount - 1, {
    fallback: { value: 0 },
    bound: `below "${key("block_count")}", which is ${shown(meta, key("block_count"), blockCount)}`,
  });
  const D = dim("embedding_length");
  const Hq = dim("attention.head_count");
  const Hkv = dim("attention.head_count_kv", { value: Hq, from: key("attention.head_count") });
  multiple(meta, key("attention.head_count"), Hq, key("attention.head_count_kv"), Hkv);
  const Dh = dim("attention.key_length", {
    value: D / Hq,
    from: `${key("embedding_length")} / ${key("attention.head_count")}`,
  });
  const Dk = dim("ssm.state_size");
  const Nk = dim("ssm.group_count");
  const Nv = dim("ssm.time_step_rank");
  multiple(meta, key("ssm.time_step_rank"), Nv, key("ssm.group_count"), Nk);
  const inner = dim("ssm.inner_size");
  multiple(meta, key("ssm.inner_size"), inner, key("ssm.time_step_rank"), Nv);
  const Dv = inner / Nv;
  const moe = arch !== "qwen35";
  const E = moe ? count(meta, key("expert_count"), 1, MAX_EXPERTS) : 0;
  const interval = count(meta, key("full_attention_interval"), 1, MAX_LAYERS, {
    fallback: { value: 4 },
  });
  const recurrent = meta.get(key("attention.recurrent_layers"));
  const isDeltaNet = Array.from(
    { length: nLayer },
    (_, i) => Array.isArray(recurrent) ? Boolean(recurrent[i]) : (i + 1) % interval !== 0,
  );
  const tokens = meta.get("tokenizer.ggml.tokens");
  const V = dim("vocab_size", {
    value: Array.isArray(tokens) ? tokens.length : undefined,
    from: "the length of tokenizer.ggml.tokens",
  });
  return {
    arch,
    nLayer,
    D,
    Hq,
    Hkv,
    Dh,
    nRot: count(meta, key("rope.dimension_count"), 0, Dh, {
      fallback: { value: Dh },
      bound: `at most "${key("attention.key_length")}", which is ${
        shown(meta, key("attention.key_length"), Dh)
      }`,
    }),
    ropeBase: positive(meta, key("rope.freq_base"), 10000),
    ropeSections: arch === "qwen3next" ? [] : ropeSections(meta, key("rope.dimension_sections")),
    eps: positive(meta, key("attention.layer_norm_rms_epsilon")),
    Kc: dim("ssm.conv_kernel"),
    Nk,
    Nv,
    Dk,
    Dv,
    C: 2 * Nk * Dk + Nv * Dv,
    E,
    Ku: moe
      ? count(meta, key("expert_used_count"), 1, E, {
        bound: `at most "${key("expert_count")}", which is ${shown(meta, key("expert_count"), E)}`,
      })
      : 0,
    Fe: moe ? dim("expert_feed_forward_length") : 0,
    Fs: moe ? dim("expert_shared_feed_forward_length") : 0,
    F: moe
      ? count(meta, key("feed_forward_length"), 0, MAX_DIM, { fallback: { value: 0 } })
      : dim("feed_forward_length"),
    V,
    isDeltaNet,
  };
}

/** readHParams of an opened model, whose errors name its file as well. */
export function modelHParams(model: Pick<GgufModel, "path" | "metadata">): HParams {
  return readingFile(model.path, () => readHParams(model.metadata));
}

/** DeltaNet key head used by value head h: interleaved for qwen3next, tiled for qwen35*. */
export function keyHeadOf(hp: HParams, h: number): number {
  return hp.arch === "qwen3next" ? Math.floor(h / (hp.Nv / hp.Nk)) : h % hp.Nk;
}
