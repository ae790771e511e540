// The bench model (qwen35moe-35b, tools/synth/presets.ts) and its matrix products, one table for
// the kernel benches: bench/kernels/decode_matvec.ts times the products as decode products,
// prefill_mul_mat.ts as prefill tiles, decode_attention.ts the attention and DeltaNet heads.

import { GgmlType } from "../../engine/quant/ggml_types.ts";
import { PRESETS } from "../../tools/synth/presets.ts";

/** One product of the model: W (rows × k, or `experts` of them) times its input. */
export interface ProductShape {
  readonly name: string;
  readonly type: GgmlType;
  readonly rows: number;
  readonly k: number;
  /** An expert stack, `nUsed` experts a token. */
  readonly experts?: number;
  readonly nUsed?: number;
  /** The input is the raw residual, normed first (a decode product folds the RMSNorm in). */
  readonly norm?: boolean;
  readonly add?: boolean;
  readonly swiglu?: boolean;
}

const preset = PRESETS["qwen35moe-35b"];

/** The bench model's shape, with the DeltaNet conv channels C that engine/hparams.ts derives. */
export const BENCH_MODEL = { ...preset, C: 2 * preset.Nk * preset.Dk + preset.Nv * preset.Dv };

/**
 * The products of one layer, by what they compute, in the order a layer runs them, then the LM
 * head: a bench lists its shapes as Object.values of this, changed where it runs one otherwise.
 */
export function benchProducts() {
  const p = BENCH_MODEL;
  const experts = { type: GgmlType.IQ4_XS, experts: p.E, nUsed: p.Ku };
  return {
    qkvzba: {
      name: "deltanet qkvzba",
      type: GgmlType.Q8_0,
      rows: p.C + p.Nv * p.Dv + 2 * p.Nv,
      k: p.D,
      norm: true,
    },
    qkv: {
      name: "attention qkv",
      type: GgmlType.Q8_0,
      rows: 2 * p.Hq * p.Dh + 2 * p.Hkv * p.Dh,
      k: p.D,
      norm: true,
    },
    outProj: { name: "out proj", type: GgmlType.Q8_0, rows: p.D, k: p.Nv * p.Dv, add: true },
    router: { name: "router", type: GgmlType.F32, rows: p.E + 1, k: p.D, norm: true },
    sharedGateUp: {
      name: "shared gate|up",
      type: GgmlType.Q8_0,
      rows: 2 * p.Fs,
      k: p.D,
      norm: true,
    },
    sharedDown: { name: "shared down", type: GgmlType.Q8_0, rows: p.D, k: p.Fs, swiglu: true },
    expertsGateUp: { name: "experts gate|up", ...experts, rows: 2 * p.Fe, k: p.D, norm: true },
    expertsDown: { name: "experts down", ...experts, rows: p.D, k: p.Fe, swiglu: true },
    lmHead: { name: "LM head", type: GgmlType.Q6_K, rows: p.vocab.padTo!, k: p.D, norm: true },
  } satisfies Record<string, ProductShape>;
}
