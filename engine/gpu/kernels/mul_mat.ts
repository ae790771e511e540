// Matrix-vector and matrix-matrix products over quantized weights (wgsl/mul_mat.wgsl), plain or
// indexed by per-token expert ids. Used for every projection of engine/gpu/gpu_forward.ts and the LM head.
//
// Dimensions: T tokens, K input values per row (tensor cols), M output rows, Ku experts per token.

import type { BufferRef } from "../buffers.ts";
import { dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";
import type { GpuTensor } from "../tensor.ts";
import { GgmlType, typeName } from "../../quant/ggml_types.ts";
import { decodeLayout, layoutRows, type MatVecLayout, MUL_MAT_VEC } from "./mul_mat_vec.ts";

/** Weight types the kernel decodes (docs/model_arch.md §6). */
export const MUL_MAT_TYPES: readonly GgmlType[] = [
  GgmlType.F32,
  GgmlType.F16,
  GgmlType.BF16,
  GgmlType.Q8_0,
  GgmlType.Q4_0,
  GgmlType.Q4_1,
  GgmlType.Q5_0,
  GgmlType.Q5_1,
  GgmlType.IQ4_NL,
  GgmlType.Q2_K,
  GgmlType.Q3_K,
  GgmlType.Q4_K,
  GgmlType.Q5_K,
  GgmlType.Q6_K,
  GgmlType.IQ4_XS,
];

/**
 * Rows per workgroup of the decode kernel (wgsl WG / LANES; LANES equals SUBGROUP_MIN_LANES so a
 * row's lanes share a subgroup) and of a prefill tile (BM).
 */
const DECODE_ROWS = 8;
const TILE_ROWS = 64;
/** Token slots a tile of the gathered (MoE prefill) variant takes: moe_gather's `tt`. */
export const PREFILL_TT = 32;
/** Tokens a tile of the dense prefill variant takes (its 16 KB of workgroup memory: 64 rows + 64). */
export const DENSE_TT = 64;
/**
 * Plain products of at most this many tokens run the decode kernel, a grid layer (z) a token:
 * a tile walks all of k in 32-value steps, which costs more than re-reading W a few times.
 */
const DECODE_MAX_TOKENS = 4;

export interface MulMatKey {
  readonly type: GgmlType;
  /**
   * More than one token per call (prefill tiles). Plain calls of up to DECODE_MAX_TOKENS tokens
   * use the unbatched variant.
   */
  readonly batched: boolean;
  /**
   * Weights are an expert stack indexed by `ids`; batched, by a gather table of token tiles
   * per expert (engine/gpu/kernels/moe_gather.ts).
   */
  readonly id?: boolean;
  /** The input is [gate | up] halves and the product uses silu(gate)·up. */
  readonly swiglu?: boolean;
  /** Accumulate into y (residual add). */
  readonly add?: boolean;
  /** x is a raw residual row and the product uses RMSNorm(x)·w (unbatched only). */
  readonly norm?: boolean;
  /** One token's experts summed by routing weight into y (unbatched, with id). */
  readonly sum?: boolean;
}

function tokensPerWg(v: MulMatKey): number {
  return v.batched ? (v.id ? PREFILL_TT : DENSE_TT) : 1;
}

/** A variant per weight type, shape (decode, dense tiles, gathered tiles) and epilogue. */
export const MUL_MAT: KernelFamily<MulMatKey> = {
  file: "mul_mat.wgsl",
  variant: (target, v) => {
    if (!MUL_MAT_TYPES.includes(v.type)) {
      throw new TypeError(
        `Cannot multiply by ${typeName(v.type)} weights: no GPU kernel for this type; supported: ${
          MUL_MAT_TYPES.map(typeName).join(", ")
        }`,
      );
    }
    const subgroups = target.features.subgroups;
    const defines: Record<string, number | true> = { [`TYPE_${typeName(v.type)}`]: true };
    if (v.batched) {
      defines.TILED = true;
      defines.TT = tokensPerWg(v);
    }
    // The IQ4 lookup table in workgroup memory; the dense prefill tile has no 64 bytes to spare.
    if ((v.type === GgmlType.IQ4_NL || v.type === GgmlType.IQ4_XS) && !(v.batched && !v.id)) {
      defines.IQ4_TABLE_WORKGROUP = true;
    }
    if (v.id) defines.ID = true;
    if (v.id && v.batched) defines.GATHERED = true;
    if (v.swiglu) defines.X_SWIGLU = true;
    if (v.add) defines.ADD = true;
    if (v.norm) {
      if (v.batched || v.swiglu) {
        throw new RangeError("Cannot fold RMSNorm into a prefill tile or a SwiGLU input");
      }
      defines.NORM = true;
    }
    if (v.sum) {
      if (v.batched || !v.id) throw new RangeError("Cannot sum experts outside a decode product");
      defines.SUM = true;
    }
    if (subgroups) defines.SUBGROUPS = true;
    const name = `mul_mat_${typeName(v.type)}_t${tokensPerWg(v)}${v.id ? "_id" : ""}${
      v.swiglu ? "_swiglu" : ""
    }${v.add ? "_add" : ""}${v.norm ? "_norm" : ""}${v.sum ? "_sum" : ""}${subgroups ? "_sg" : ""}`;
    return { name, defines };
  },
};

export interface MulMatBuffers {
  readonly w: GpuTensor;
  readonly x: BufferRef;
  readonly y: BufferRef;
  /**
   * Expert stacks only: (T, idsStride) u32 expert ids, or with `gatherTiles` the gather table
   * of engine/gpu/kernels/moe_gather.ts over the same ids.
   */
  readonly ids?: BufferRef;
}

/** Where the operands sit, in f32 elements; defaults: dense rows of K inputs and M outputs. */
export interface MulMatOptions {
  readonly tokens: number;
  /** Experts per token (with ids). */
  readonly nUsed?: number;
  /** The gather table's most tiles (gatherTiles): ids is that table, tiles run TT slots. */
  readonly gatherTiles?: number;
  readonly idsStride?: number;
  readonly xOffset?: number;
  readonly xStrideT?: number;
  /** Per expert rank (with ids), e.g. when each rank has its own input row. */
  readonly xStrideI?: number;
  /** Distance from a gate value to its up value (swiglu). */
  readonly upOffset?: number;
  readonly yOffset?: number;
  readonly yStrideT?: number;
  readonly yStrideI?: number;
  readonly swiglu?: boolean;
  readonly add?: boolean;
  /**
   * x holds raw residual rows and each product reads RMSNorm(x)·w instead (engine/gpu/kernels/
   * rms_norm.ts, the same bits): decode variants only, not gathered experts or prefill tiles.
   */
  readonly norm?: RmsNormInput;
  /**
   * One token's expert products (with ids, unbatched, one part holding every expert) added
   * into y as y[t][row] += Σ_i weights[t,i]·(W_{ids[t,i]}·x[t][i]) (+ weights[t,nUsed]·shared
   * [t][row]), in wgsl/moe_sum.wgsl's order and bits: the end of a decode step's MoE FFN.
   */
  readonly sum?: { readonly weights: BufferRef; readonly shared?: BufferRef };
  /**
   * The decode kernel's layout instead of the device's (bench/kernels/decode_matvec.ts);
   * "staged8" is the earlier decode kernel of wgsl/mul_mat.wgsl.
   */
  readonly decode?: MatVecLayout | "staged8";
}

/** The RMSNorm a product folds into its input. */
export interface RmsNormInput {
  readonly w: BufferRef;
  readonly eps: number;
}

/**
 * Records y = W·x for `tokens` tokens: one dispatch per part of W. Plain: y[t][row] for all
 * rows of W. With ids: y[t][i][row] = W_{ids[t,i]}·x[t][i] for i < nUsed, rows of one expert.
 */
export function mulMat(enc: StepEncoder, b: MulMatBuffers, o: MulMatOptions): void {
  const { w } = b;
  const id = b.ids !== undefined;
  const gatherTiles = id ? o.gatherTiles : undefined;
  const gathered = gatherTiles !== undefined;
  const key: MulMatKey = {
    type: w.type,
    batched: id ? gathered : o.tokens > DECODE_MAX_TOKENS,
    id,
    swiglu: o.swiglu,
    add: o.add,
    norm: o.norm !== undefined,
    sum: o.sum !== undefined,
  };
  if (o.sum && w.parts.length !== 1) {
    throw new RangeError(
      `Cannot sum the experts of "${w.name}" in one product: they span ${w.parts.length} parts`,
    );
  }
  const nUsed = id ? (o.nUsed ?? 1) : 1;
  const rows = id ? w.matrixRows : 0;
  const base = {
    k: w.cols,
    tokens: o.tokens,
    n_used: nUsed,
    x_offset: o.xOffset ?? 0,
    x_stride_t: o.xStrideT ?? w.cols,
    x_stride_i: o.xStrideI ?? 0,
    up_offset: o.upOffset ?? 0,
    y_offset: o.yOffset ?? 0,
    y_stride_t: o.yStrideT ?? (id ? nUsed * w.matrixRows : w.matrixRows * w.experts),
    y_stride_i: o.yStrideI ?? w.matrixRows,
    ids_stride: gatherTiles ?? o.idsStride ?? nUsed,
  };
  if (w.cols % 32 !== 0) {
    throw new RangeError(
      `Cannot multiply by tensor "${w.name}": rows of ${w.cols} values are not a multiple of 32`,
    );
  }
  const ids = b.ids ?? dummyStorage(enc.ctx);
  const nw = o.norm?.w ?? dummyStorage(enc.ctx);
  const rw = o.sum?.weights ?? dummyStorage(enc.ctx);
  const sh = o.sum?.shared ?? dummyStorage(enc.ctx);
  const layout = key.batched || o.decode === "staged8"
    ? undefined
    : (o.decode ?? decodeLayout(enc.ctx, w.type));
  const tileRows = key.batched ? TILE_ROWS : layout ? layoutRows(layout) : DECODE_ROWS;
  for (const part of w.parts) {
    const partRows = id ? rows : part.rows;
    const tiles = Math.ceil(partRows / tileRows);
    const buffers = { w: part.buffer, x: b.x, ids, nw, rw, sh, y: b.y };
    const params = {
      ...base,
      rows: partRows,
      row_base: id ? 0 : part.firstRow,
      expert_first: id ? part.firstRow / w.matrixRows : 0,
      expert_count: id ? part.rows / w.matrixRows : 0,
      row_tiles: tiles,
      sum_shared: o.sum?.shared ? 1 : 0,
      eps: o.norm?.eps ?? 0,
    };
    const grid = {
      tiles,
      z: gathered
        ? o.gatherTiles!
        : o.sum
        ? o.tokens
        : id
        ? o.tokens * nUsed
        : Math.ceil(o.tokens / tokensPerWg(key)),
    };
    if (layout) enc.dispatch(MUL_MAT_VEC, { ...key, layout }, buffers, params, grid);
    else enc.dispatch(MUL_MAT, key, buffers, params, grid);
  }
}
