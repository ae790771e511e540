// Model shapes the generator can write: tiny/small test models and the exact published shapes.
// Read by tools/synth/generate_model.ts (and through it tools/make_model.ts, tests/_models.ts).

import type { HParams } from "../../engine/hparams.ts";
import type { Synthesis } from "./weight_synth.ts";

/**
 * A model's shape: engine/hparams.ts's dimensions (legend there) but those a file derives (conv
 * channels, vocabulary, layer kinds) or that depend on the arch, plus what only a file holds.
 */
export interface Preset extends Omit<HParams, "arch" | "ropeSections" | "C" | "V" | "isDeltaNet"> {
  readonly name: PresetName;
  /** IMROPE sections written for qwen35/qwen35moe (qwen3next has none). */
  readonly ropeSections: readonly [number, number, number, number];
  /** Every `fullAttentionInterval`-th block is full attention, the others DeltaNet. */
  readonly fullAttentionInterval: number;
  readonly contextLength: number;
  /** buildVocab arguments; padTo (the published vocab size) only for the full-size shapes. */
  readonly vocab: { readonly mergeCount: number; readonly padTo?: number };
  /** How tensor bytes are made (weight_synth.ts): "blocks" keeps tens of GB fast. */
  readonly synthesis: Synthesis;
}

export type PresetName = "tiny" | "small" | "qwen35moe-35b" | "qwen3next-80b";

/** Layer-typing and RoPE values shared by every preset (docs/model_arch.md §2.2). */
const COMMON = {
  ropeBase: 1e7,
  eps: 1e-6,
  Kc: 4,
  fullAttentionInterval: 4,
} as const;

/**
 * The full-size hybrid shapes share everything but layers, experts and vocab (docs/model_arch.md
 * §2.2).
 */
const FULL_SIZE = {
  ...COMMON,
  D: 2048,
  Hq: 16,
  Hkv: 2,
  Dh: 256,
  nRot: 64,
  ropeSections: [11, 11, 10, 0],
  Nk: 16,
  Nv: 32,
  Dk: 128,
  Dv: 128,
  Fe: 512,
  Fs: 512,
  contextLength: 262144,
  synthesis: "blocks",
} as const;

export const PRESETS: Readonly<Record<PresetName, Preset>> = {
  // Fast on a CPU adapter and in a float64 reference; every row length a multiple of 256.
  tiny: {
    ...COMMON,
    name: "tiny",
    nLayer: 4,
    D: 256,
    Hq: 4,
    Hkv: 2,
    Dh: 64,
    nRot: 16,
    ropeSections: [3, 3, 2, 0],
    Nk: 2,
    Nv: 4,
    Dk: 64,
    Dv: 64,
    E: 8,
    Ku: 2,
    Fe: 256,
    Fs: 256,
    F: 512,
    contextLength: 4096,
    vocab: { mergeCount: 700 },
    synthesis: "quantize",
  },
  // Big enough that GPU kernels see realistic tiling (two attention blocks, 32 experts).
  small: {
    ...COMMON,
    name: "small",
    nLayer: 8,
    D: 1024,
    Hq: 8,
    Hkv: 2,
    Dh: 128,
    nRot: 32,
    ropeSections: [6, 5, 5, 0],
    Nk: 4,
    Nv: 8,
    Dk: 128,
    Dv: 128,
    E: 32,
    Ku: 4,
    Fe: 512,
    Fs: 512,
    F: 2816,
    contextLength: 32768,
    vocab: { mergeCount: 4000 },
    synthesis: "quantize",
  },
  // Qwen3.5/3.6-35B-A3B (qwen35moe), without the MTP block.
  "qwen35moe-35b": {
    ...FULL_SIZE,
    name: "qwen35moe-35b",
    nLayer: 40,
    E: 256,
    Ku: 8,
    // The published file has no dense width; 5120 only serves `--arch qwen35` on this shape.
    F: 5120,
    vocab: { mergeCount: 4000, padTo: 248320 },
  },
  // Qwen3-Next-80B-A3B (qwen3next).
  "qwen3next-80b": {
    ...FULL_SIZE,
    name: "qwen3next-80b",
    nLayer: 48,
    E: 512,
    Ku: 10,
    F: 5120,
    vocab: { mergeCount: 4000, padTo: 151936 },
  },
};

/** The preset called `name`, or a RangeError listing the known names. */
export function presetByName(name: string): Preset {
  if (!Object.hasOwn(PRESETS, name)) {
    throw new RangeError(
      `Cannot use preset "${name}": unknown; use one of ${Object.keys(PRESETS).join(", ")}`,
    );
  }
  return PRESETS[name as PresetName];
}
