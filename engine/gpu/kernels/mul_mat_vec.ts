// The decode matrix-vector product (wgsl/mul_mat_vec.wgsl): its variants, the workgroup layouts
// it can run with, and the layout and tokens a workgroup a product gets. engine/gpu/kernels/
// mul_mat.ts sends every call of up to MATVEC_MAX_TOKENS tokens here; bench/kernels/
// decode_matvec.ts checks and times the layouts and bench/kernels/decode_steps.ts the token counts.

import type { KernelFamily } from "../kernel.ts";
import { GgmlType, typeName } from "../../quant/ggml_types.ts";

/**
 * How a workgroup spreads its rows' (row, chunk) products over its threads: `wg` threads in
 * groups of `cu` that take a window's chunks cu apart, each thread `rpt` rows; `xstage` stages
 * a window of x in workgroup memory instead of each thread reading its chunks of x.
 */
export interface MatVecLayout {
  readonly wg: 128 | 256;
  readonly cu: 16 | 32 | 64;
  readonly rpt: 1 | 2 | 4;
  readonly xstage: boolean;
  /**
   * Chunks of its rows each thread loads before multiplying any (wgsl BURST; default 1): that
   * many times the bytes in flight where few workgroups fill the GPU. Cu 16, at most 2 tokens,
   * no pair, and PREFETCH_TYPES only.
   */
  readonly burst?: 2 | 4;
}

/** Types whose GPU rows lie at 16-byte offsets (engine/gpu/weight_layout.ts), loaded as vec4s. */
const VEC4_TYPES: readonly GgmlType[] = [GgmlType.F32, GgmlType.Q8_0, GgmlType.Q6_K];

/** Weight types whose dequantizer splits into loads and decoding (dequant.wgsl load32). */
export const PREFETCH_TYPES: readonly GgmlType[] = [GgmlType.F32, GgmlType.Q8_0, GgmlType.IQ4_XS];

export interface MulMatVecKey {
  readonly type: GgmlType;
  readonly layout: MatVecLayout;
  /** Weights are an expert stack indexed by `ids` (a (token, rank) slot per grid layer). */
  readonly id?: boolean;
  /** The input is [gate | up] halves and the product uses silu(gate)·up. */
  readonly swiglu?: boolean;
  /** Accumulate into y (residual add). */
  readonly add?: boolean;
  /** x is a raw residual row and the product uses RMSNorm(x)·w. */
  readonly norm?: boolean;
  /** A second product y2 = W2·x, W2 F32, in the same dispatch (mulMatPair). */
  readonly pairF32?: boolean;
  /** One token: the outputs below the conv's channels also run the DeltaNet conv (ConvEpilogue). */
  readonly conv?: boolean;
  /** y += the MoE layer's weighted experts and this product as the shared expert (MoeSumEpilogue). */
  readonly moeSum?: boolean;
  /**
   * Tokens (or, gathered, slots) a workgroup takes, each weight chunk it loads multiplied with
   * all of them: cu 16 layouts, no conv; NORM takes at most 2. Default 1.
   */
  readonly tokens?: MatVecTokens;
  /**
   * With id: ids is a gather table (engine/gpu/kernels/moe_gather.ts) and a workgroup takes the
   * slots of one of its tiles, `tokens` at a time, so each expert's weights are read once.
   */
  readonly gathered?: boolean;
}

/** Rows from which a plain product is an LM head to the decode layouts and token counts. */
export const LM_HEAD_ROWS = 65536;

/** Rows from which a plain product is a joined projection (qkvz|ba, q|gate|k|v) or an LM head. */
export const WIDE_ROWS = 4096;

/** Tokens a decode workgroup can take (wgsl TN). */
export type MatVecTokens = 1 | 2 | 4 | 8;

/** Rows one workgroup of a layout computes. */
export function layoutRows(l: MatVecLayout): number {
  return (l.wg / l.cu) * l.rpt;
}

/**
 * Chunks of 32 values a window covers (wgsl WIN): 64, or fewer where a workgroup takes more
 * tokens, so their staged inputs stay within 18 KB (9 vec4s a chunk a token).
 */
function windowChunks(tokens: MatVecTokens): number {
  return tokens <= 2 ? 64 : 128 / tokens;
}

/** Workgroup memory a variant declares, in bytes (checked against the device's limit). */
export function workgroupBytes(key: MulMatVecKey): number {
  const rows = layoutRows(key.layout);
  const tokens = key.tokens ?? 1;
  const win = windowChunks(tokens);
  let bytes = 4 * rows * 16 + 4;
  if (key.layout.cu !== 16) bytes += 4 * rows * (win + 1);
  if (key.layout.xstage) bytes += 16 * win * 9 * tokens;
  if (key.norm) bytes += 4 * 128;
  if (key.type === GgmlType.IQ4_NL || key.type === GgmlType.IQ4_XS) bytes += 64;
  return bytes;
}

/** The layout's short name, e.g. "w128c16r2x". */
export function layoutName(l: MatVecLayout): string {
  return `w${l.wg}c${l.cu}r${l.rpt}${l.xstage ? "x" : ""}${l.burst ? `b${l.burst}` : ""}`;
}

/** Expert slots (8 × 1024 or 2048 rows) of a short step: 128 threads of two rows. */
const SLOT_NARROW: MatVecLayout = { wg: 128, cu: 16, rpt: 2, xstage: true };

/**
 * The layout a decode product of `rows` rows runs with, its workgroups taking `tokens` tokens
 * each: the fastest on both providers for the bench model's shapes on an H200 (docs/
 * PERFORMANCE.md, "Decode matrix-vector products"), by how many rows there are to spread. Every
 * layout gives the same bits.
 */
export function decodeLayout(rows: number, id: boolean, tokens: MatVecTokens = 1): MatVecLayout {
  if (id) return SLOT_NARROW;
  // The LM head; two rows a thread where a workgroup takes more than two tokens, whose thread
  // holds each of its rows' chunks at once (32 registers a row).
  if (rows >= LM_HEAD_ROWS) return { wg: 256, cu: 16, rpt: tokens > 2 ? 2 : 4, xstage: true };
  // Joined projections (qkvz|ba, q|gate|k|v); and, where a workgroup takes more than two tokens,
  // the output projections and the shared expert: on the H100 their 4 and 8 tokens a workgroup
  // took 30-55% less time in 256 threads of two rows than in 128 of one (bench/kernels/
  // decode_steps.ts, docs/PERFORMANCE-NOTES.md "Steps of many rows").
  if (rows >= WIDE_ROWS || (tokens > 2 && rows >= 1024)) {
    return { wg: 256, cu: 16, rpt: 2, xstage: true };
  }
  // Output projections, the shared expert's down; and fewer rows where a workgroup takes more
  // than two tokens, which only a cu 16 layout can (two where 64 lanes a row do without).
  if (rows >= 2048 || tokens > 2) return { wg: 128, cu: 16, rpt: 1, xstage: true };
  // Few rows (shared expert's gate|up): 64 threads across each row's chunks.
  if (rows >= 512) return { wg: 128, cu: 64, rpt: 2, xstage: true };
  // Fewest (the router's 257): a row a thread, twice the workgroups.
  return { wg: 128, cu: 64, rpt: 1, xstage: true };
}

/** Rows of a step from which the experts, a (token, rank) slot a workgroup, take 64 rows each. */
export const SLOT_WIDE_FROM_TOKENS = 2;

/**
 * The layout of the experts' products a slot a workgroup in a step of `stepTokens` rows: from
 * SLOT_WIDE_FROM_TOKENS, 256 threads of four rows, loading two chunks of each at once where the
 * type's loads split off. On the H100 that took the down 1.35-1.85× and gate|up 1.1-1.2× less
 * time than 128 threads of two rows at 2 to 64 rows (bench/kernels/decode_steps.ts --layouts more,
 * docs/PERFORMANCE-NOTES.md "Experts a slot a workgroup, wider"): a slot's SwiGLU or staged input
 * is computed once for 64 rows instead of 16, and a thread has four rows' chunks in flight. One
 * row keeps decodeLayout's (there its gate|up took 16.6 µs against 12.4).
 */
export function slotLayout(type: GgmlType, stepTokens: number): MatVecLayout {
  if (stepTokens < SLOT_WIDE_FROM_TOKENS) return SLOT_NARROW;
  const wide: MatVecLayout = { wg: 256, cu: 16, rpt: 4, xstage: true };
  return PREFETCH_TYPES.includes(type) ? { ...wide, burst: 2 } : wide;
}

/** A variant per weight type, layout and epilogue. */
export const MUL_MAT_VEC: KernelFamily<MulMatVecKey> = {
  file: "mul_mat_vec.wgsl",
  variant: (target, v) => {
    const { layout } = v;
    const bytes = workgroupBytes(v);
    if (bytes > target.limits.maxComputeWorkgroupStorageSize) {
      throw new RangeError(
        `Cannot use decode layout ${layoutName(layout)}: it needs ${bytes} bytes of workgroup ` +
          `memory, the device allows ${target.limits.maxComputeWorkgroupStorageSize}; use fewer rows`,
      );
    }
    const regClasses = layout.cu === 16;
    const subgroups = regClasses && target.features.subgroups;
    const tokens = v.tokens ?? 1;
    const defines: Record<string, number | true> = {
      [`TYPE_${typeName(v.type)}`]: true,
      WG: layout.wg,
      CU: layout.cu,
      RPT: layout.rpt,
      TN: tokens,
      WIN: windowChunks(tokens),
    };
    if (regClasses) defines.REG_CLASSES = true;
    if (layout.xstage) defines.XSTAGE = true;
    if (v.type === GgmlType.IQ4_NL || v.type === GgmlType.IQ4_XS) {
      defines.IQ4_TABLE_WORKGROUP = true;
    }
    // 16-byte loads (4 values of F32, 16 of Q8_0 and Q6_K) instead of four of 4 bytes.
    if (VEC4_TYPES.includes(v.type)) defines.W_VEC4 = true;
    if (v.id) defines.ID = true;
    if (v.swiglu) defines.X_SWIGLU = true;
    if (v.add) defines.ADD = true;
    if (v.norm) {
      if (v.swiglu) throw new RangeError("Cannot fold RMSNorm into a SwiGLU input");
      defines.NORM = true;
    }
    if (v.pairF32) {
      if (v.id || v.swiglu || v.add) {
        throw new RangeError("Cannot pair an F32 product with experts, SwiGLU or accumulation");
      }
      defines.PAIR_F32 = true;
    }
    const epilogues = [v.pairF32, v.conv, v.moeSum].filter(Boolean).length;
    if (epilogues > 1) throw new RangeError("Cannot give one product more than one epilogue");
    if (v.conv) {
      if (v.id || v.add) {
        throw new RangeError("Cannot run the conv on expert or accumulated outputs");
      }
      defines.CONV = true;
    }
    if (v.moeSum) {
      if (v.id || v.add) {
        throw new RangeError(
          "Cannot close a MoE layer from an expert product or with accumulation",
        );
      }
      defines.MOE_SUM = true;
    }
    if (tokens > 1) {
      if (!regClasses || (v.id && !v.gathered) || v.conv) {
        throw new RangeError(
          `Cannot give a workgroup ${tokens} tokens but in a cu 16 layout of a plain or gathered product without the conv`,
        );
      }
      // Four or more tokens' chunks are read where they are used, not held across the rows.
      if (tokens >= 4) {
        if (v.norm) {
          throw new RangeError(
            `Cannot fold RMSNorm into a workgroup of ${tokens} tokens: 2 at most`,
          );
        }
        defines.X_STREAM = true;
      }
    }
    if (layout.burst) {
      if (!regClasses || tokens > 2 || v.pairF32 || !PREFETCH_TYPES.includes(v.type)) {
        throw new RangeError(
          `Cannot load chunks in bursts for ${typeName(v.type)} in layout ${
            layoutName(layout)
          } with ${tokens} tokens a workgroup${
            v.pairF32 ? " and a pair" : ""
          }: cu 16, at most 2 tokens, no pair, and ${PREFETCH_TYPES.map(typeName).join(", ")} only`,
        );
      }
      defines.BURST = layout.burst;
    }
    if (v.gathered) {
      if (!v.id) throw new RangeError("Cannot gather the slots of a product without experts");
      defines.GATHERED = true;
    }
    if (subgroups) defines.SUBGROUPS = true;
    const name = `mul_mat_vec_${typeName(v.type)}_${layoutName(layout)}${v.id ? "_id" : ""}${
      v.gathered ? "_gathered" : ""
    }${v.swiglu ? "_swiglu" : ""}${v.add ? "_add" : ""}${v.norm ? "_norm" : ""}${
      v.pairF32 ? "_pairf32" : ""
    }${v.conv ? "_conv" : ""}${v.moeSum ? "_moesum" : ""}${tokens > 1 ? `_t${tokens}` : ""}${
      subgroups ? "_sg" : ""
    }`;
    return { name, defines };
  },
};
