// Matrix-vector and matrix-matrix products over quantized weights, plain or indexed by per-token
// expert ids: prefill tiles here (wgsl/mul_mat.wgsl), decode products of up to MATVEC_MAX_TOKENS
// tokens through engine/gpu/kernels/mul_mat_vec.ts, tensor-core products (`mma`) through
// engine/gpu/kernels/mul_mat_mma.ts. Used for every projection of engine/gpu/gpu_forward.ts and
// the LM head.
//
// Dimensions: T tokens, K input values per row (tensor cols), M output rows, Ku experts per token.

import type { BufferRef } from "../buffers.ts";
import { dummyStorage } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, KernelTarget } from "../kernel.ts";
import type { GpuTensor } from "../tensor.ts";
import { GgmlType, typeName } from "../../quant/ggml_types.ts";
import {
  decodeLayout,
  layoutRows,
  LM_HEAD_ROWS,
  type MatVecLayout,
  type MatVecTokens,
  MUL_MAT_VEC,
  type MulMatVecKey,
  PREFETCH_TYPES,
  SLOT_WIDE_FROM_TOKENS,
  slotLayout,
  WIDE_ROWS,
  workgroupBytes,
} from "./mul_mat_vec.ts";
import { type MmaPrecision, mmaTakes, type MmaTile, mulMatMma } from "./mul_mat_mma.ts";

/** Weight types the kernels decode (docs/model_arch.md §6). */
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

/** Rows a prefill tile may take (wgsl BM): 128 needs 16 KB of workgroup memory for its weights. */
export type TileRows = 64 | 128;
/** Token slots a tile of the gathered (MoE prefill) variant takes: moe_gather's `tt`. */
export const PREFILL_TT = 32;
/**
 * Tokens a tile of the dense prefill variant takes, the most (tileFor gives products of few rows
 * 32): a 64 × 64 tile fits the WebGPU default of 16 KB of workgroup memory.
 */
export const DENSE_TT = 64;
/** A prefill tile's shape: rows × token slots (32 or 64; a gathered tile's is PREFILL_TT). */
export interface TileShape {
  readonly rows: TileRows;
  readonly tokens: 32 | 64;
}
/**
 * A step of at most this many tokens is a decode step to the forward pass (engine/gpu/
 * gpu_forward.ts): its RMSNorms fold into the products that read them, the router pairs with the
 * shared expert's gate|up (mulMatPair), the experts run a product a (token, rank) slot and the
 * shared expert's down closes the MoE layer (moeSum). A longer step normalises once, gathers the
 * experts' slots (moe_gather) and sums them apart (moeDownSum).
 */
export const DECODE_MAX_TOKENS = 4;

/**
 * Plain products of at most this many tokens run the decode kernel, each workgroup multiplying
 * every weight chunk it loads with several tokens (decodeTokens): a tile stages every chunk of W in
 * workgroup memory between two barriers, which costs more than reading W a few times from L2 until
 * its 32 or 64 slots fill. On the H100 eight tokens a workgroup still beat the tiles at 128 rows for
 * every product under WIDE_ROWS (the output projection 210 against 369 µs, the router 41 against
 * 140) and lost at 256 (docs/PERFORMANCE-NOTES.md, "Steps of many rows").
 */
export const MATVEC_MAX_TOKENS = 128;

/**
 * Expert products of at most this many tokens run the decode kernel: a (token, rank) slot a
 * workgroup in the forward pass, or over a gather table. Past it the gathered tiles: at 128 rows
 * on the H100 the experts' down took 508 µs in them against 655 a slot a workgroup.
 */
export const EXPERT_MATVEC_MAX_TOKENS = 64;

/**
 * Plain products of WIDE_ROWS rows or more (the joined projections, the LM head) take the decode
 * kernel only to this many tokens: past it their tiles, which read x once for 64 or 128 rows, beat
 * eight tokens a workgroup reading W again for every eight (H100: 135 against 158 µs for the
 * qkvz|ba of 32 rows, 2.4 against 3.6 ms for the LM head; docs/PERFORMANCE-NOTES.md).
 */
export const MATVEC_WIDE_MAX_TOKENS = 16;

/**
 * Whether the forward pass runs a step's experts a (token, rank) slot a workgroup, the shared
 * expert's down (`sharedRows` rows, a decode product there) summing the layer in its epilogue.
 */
export function expertsPerSlot(tokens: number, sharedRows: number): boolean {
  return tokens <= EXPERT_MATVEC_MAX_TOKENS && matVecTakes(tokens, sharedRows);
}

/** Whether mulMat runs a plain product of `tokens` tokens over `rows` rows as decode products. */
export function matVecTakes(tokens: number, rows: number): boolean {
  return tokens <= (rows >= WIDE_ROWS ? MATVEC_WIDE_MAX_TOKENS : MATVEC_MAX_TOKENS);
}

/**
 * Token counts between which mulMat's choice of kernels changes: a step of each of these rows
 * (that fits) asks for every variant steps use (engine/gpu/gpu_stage.ts compiles them ahead).
 */
export const PRODUCT_STEP_TOKENS: readonly number[] = [
  1,
  2,
  SLOT_WIDE_FROM_TOKENS,
  3,
  DECODE_MAX_TOKENS + 1,
  MATVEC_WIDE_MAX_TOKENS + 1,
  EXPERT_MATVEC_MAX_TOKENS + 1,
  MATVEC_MAX_TOKENS + 1,
];

/**
 * Tokens (gathered: slots) a decode workgroup takes in a product of `tokens` tokens of `rows`
 * rows: one alone; two for two (a pair reads each weight once, measured against one a workgroup)
 * and wherever the RMSNorm is folded; four for three or four, and to 16 but for the LM head; eight
 * beyond, each group reading W once (from L2 after the first). On the H100 four a workgroup took
 * 10-45% less time than eight at 8 and 16 tokens, except the LM head's, and at 4 tokens the LM
 * head 1638 µs against two's 2326 (bench/kernels/decode_steps.ts); four slots of an expert,
 * which rarely has more at these lengths.
 */
export function decodeTokens(
  tokens: number,
  o: { readonly gathered?: boolean; readonly norm?: boolean; readonly rows?: number },
): MatVecTokens {
  if (o.gathered) return o.norm ? 2 : 4;
  if (tokens <= 1) return 1;
  if (tokens <= 2 || o.norm) return 2;
  return tokens <= 4 || (tokens <= 16 && (o.rows ?? 0) < LM_HEAD_ROWS) ? 4 : 8;
}

/**
 * Rows of a step up to which the LM head folds the final RMSNorm into its product: a folded norm
 * keeps a workgroup to two tokens (decodeTokens), and at four rows the LM head's two-token
 * workgroups took 0.7 ms longer than four-token ones after a separate norm (H100).
 */
export const HEAD_FOLD_MAX_ROWS = 2;

/** A prefill tile variant. */
export interface MulMatKey {
  readonly type: GgmlType;
  /**
   * Weights are an expert stack and a tile takes the slots a gather table of token tiles per
   * expert gives it (engine/gpu/kernels/moe_gather.ts).
   */
  readonly id?: boolean;
  /** The input is [gate | up] halves and the product uses silu(gate)·up. */
  readonly swiglu?: boolean;
  /** Accumulate into y (residual add). */
  readonly add?: boolean;
  /** Load the next chunk during this one's products (PREFETCH_TYPES only). */
  readonly prefetch?: boolean;
  /** The tile's shape; default 64 rows × (PREFILL_TT gathered, else DENSE_TT) slots. */
  readonly tile?: TileShape;
  /** Pad the staged x rows (wgsl X_PAD) where the device's workgroup memory holds them; false: never. */
  readonly pad?: boolean;
}

/** Workgroup memory a tile stages a chunk in: 32 values of each row and of each slot, as f32. */
function tileBytes(t: TileShape): number {
  return 128 * (t.rows + t.tokens);
}

/** What X_PAD adds to a tile's staging: two vec4s after each of the chunk's 32 x rows. */
const X_PAD_BYTES = 32 * 2 * 16;

function defaultTile(id: boolean): TileShape {
  return { rows: 64, tokens: id ? PREFILL_TT : DENSE_TT };
}

/** Refuses a weight type no kernel decodes. */
function checkType(type: GgmlType): void {
  if (!MUL_MAT_TYPES.includes(type)) {
    throw new TypeError(
      `Cannot multiply by ${typeName(type)} weights: no GPU kernel for this type; supported: ${
        MUL_MAT_TYPES.map(typeName).join(", ")
      }`,
    );
  }
}

/** A variant per weight type, tile shape (dense or gathered) and epilogue. */
export const MUL_MAT: KernelFamily<MulMatKey> = {
  file: "mul_mat.wgsl",
  variant: (target, v) => {
    checkType(v.type);
    const { rows: bm, tokens: tt } = v.tile ?? defaultTile(!!v.id);
    if (v.id && tt !== PREFILL_TT) {
      throw new RangeError(
        `Cannot tile gathered experts by ${tt} slots: the gather table's are ${PREFILL_TT}`,
      );
    }
    const defines: Record<string, number | true> = {
      [`TYPE_${typeName(v.type)}`]: true,
      BM: bm,
      TT: tt,
    };
    // The IQ4 lookup table in workgroup memory; the 64 × 64 dense tile has no 64 bytes to spare.
    const table = (v.type === GgmlType.IQ4_NL || v.type === GgmlType.IQ4_XS) &&
      (v.id || tt < DENSE_TT);
    if (table) defines.IQ4_TABLE_WORKGROUP = true;
    const bytes = tileBytes({ rows: bm, tokens: tt }) + (table ? 64 : 0);
    if (bytes > target.limits.maxComputeWorkgroupStorageSize) {
      throw new RangeError(
        `Cannot run a ${bm} × ${tt} prefill tile: it needs ${bytes} bytes of workgroup memory, the device allows ${target.limits.maxComputeWorkgroupStorageSize}; use a smaller tile`,
      );
    }
    if (v.id) {
      defines.ID = true;
      defines.GATHERED = true;
    }
    if (v.swiglu) defines.X_SWIGLU = true;
    if (v.add) defines.ADD = true;
    const prefetch = v.prefetch && PREFETCH_TYPES.includes(v.type);
    if (prefetch) defines.PREFETCH = true;
    // Unpadded, a warp's x stores fall 4 to a bank; padded, the tiles ran the same or up to 3%
    // faster on an H200 (docs/PERFORMANCE.md "Prefill tiles", tenth session).
    const pad = v.pad !== false &&
      bytes + X_PAD_BYTES <= target.limits.maxComputeWorkgroupStorageSize;
    if (pad) defines.X_PAD = true;
    const name = `mul_mat_${typeName(v.type)}_${bm === 64 ? "" : `r${bm}`}t${tt}${
      prefetch ? "p" : ""
    }${pad ? "x" : ""}${v.id ? "_id" : ""}${v.swiglu ? "_swiglu" : ""}${v.add ? "_add" : ""}`;
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
  /**
   * Scratch of a tensor-core product (`mma` where the device has them): its input rows as f16
   * and their scales, mmaScratchBytes of engine/gpu/kernels/mul_mat_mma.ts.
   */
  readonly mmaX?: GPUBuffer;
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
   * rms_norm.ts, the same bits): decode products only, not gathered experts or prefill tiles.
   */
  readonly norm?: RmsNormInput;
  /** Decode of one token, no ids: the DeltaNet conv as the product's epilogue. */
  readonly conv?: ConvEpilogue;
  /** Decode, no ids, no add: the MoE layer's sum as the product's epilogue. */
  readonly moeSum?: MoeSumEpilogue;
  /**
   * The decode layout instead of decodeLayout's, a decode product at any length (bench/kernels/
   * decode_matvec.ts).
   */
  readonly decode?: MatVecLayout;
  /**
   * Decode products: the tokens a workgroup takes instead of decodeTokens', a decode product at
   * any length (bench/kernels/decode_steps.ts); 1 where the layout is not cu 16.
   */
  readonly decodeTokens?: MatVecTokens;
  /** Prefill tiles: whether to prefetch (default yes; bench/kernels/prefill_mul_mat.ts compares). */
  readonly prefetch?: boolean;
  /**
   * The prefill tiles, in this shape instead of tileFor's, whatever the token count (bench/
   * kernels/prefill_mul_mat.ts; decode_steps.ts times them against the decode products).
   */
  readonly tile?: TileShape;
  /** Prefill tiles: false leaves x unpadded (MulMatKey.pad; the kernel bench compares). */
  readonly pad?: boolean;
  /**
   * Run these tokens on tensor cores, whatever their count, where the device has subgroup
   * matrices (GpuFeatures.subgroupMatrix; today's kernels otherwise) and the weight type is one
   * mmaTakes (not F32 or BF16): weights and inputs as f16 pairs, f32 sums in one order, within
   * f32's rounding of the exact product, so a token's bits depend only on its rows, never on the
   * run it is in. Needs b.mmaX and, for expert stacks, a gather table (gatherTiles); not with
   * `norm`, `conv`, `moeSum`, `decode`, `tile` or `pad`.
   */
  readonly mma?: boolean;
  /** Tensor-core products: the tile instead of mmaTileFor's (bench/kernels/prefill_mma.ts). */
  readonly mmaTile?: MmaTile;
  /** Tensor-core products: "f16" instead of "split" (bench/kernels/prefill_mma.ts compares). */
  readonly mmaPrecision?: MmaPrecision;
  /**
   * With `mma`: run the tensor-core path on any device, its matrix operations emulated by f32
   * code over the same staged f16 values (tests of its staging, tiles and epilogue without
   * tensor cores; slow).
   */
  readonly mmaEmulate?: boolean;
}

/** The RMSNorm a product folds into its input. */
export interface RmsNormInput {
  readonly w: BufferRef;
  readonly eps: number;
}

/**
 * A one-token DeltaNet projection's outputs at columns below `channels` are the raw conv inputs:
 * the product also runs the causal conv + SiLU on them into u and advances the conv state, as
 * ssmConv would (engine/gpu/kernels/ssm_conv.ts, the same bits), a dispatch fewer.
 */
export interface ConvEpilogue {
  /** (channels, kc) f32 taps. */
  readonly w: BufferRef;
  /** (kc − 1, channels) f32 from stateOffset floats, the inputs before this token, oldest first. */
  readonly state: BufferRef;
  readonly stateOffset?: number;
  /** (channels) f32 outputs. */
  readonly u: BufferRef;
  readonly channels: number;
  readonly kc: number;
}

/**
 * The product is the shared expert's down of a MoE layer: y += Σ_i weights[t,i]·experts[t,i] in
 * rank order + weights[t,k]·(this product), as moeSum adds it (engine/gpu/kernels/moe_sum.ts, the
 * same bits), a dispatch fewer.
 */
export interface MoeSumEpilogue {
  /** (T, k, rows) f32: each token's routed experts' down products. */
  readonly experts: BufferRef;
  /** (T, k + 1) f32: their routing weights, then the shared expert's gate. */
  readonly weights: BufferRef;
  readonly k: number;
}

/**
 * The tile a prefill product of `rows` rows (a part's, or an expert's) runs on `target`. Measured
 * on an H200 under Dawn at 512 tokens (docs/PERFORMANCE.md "Prefill tiles"): 128-row tiles read x
 * once for twice the rows, 19-30% off the gathered experts and 4-7% off the dense products of
 * 2048 rows and more, but leave too few workgroups for the shared expert's 1024 rows; the router's
 * few hundred rows want 32-token tiles for the same reason.
 */
export function tileFor(target: KernelTarget, rows: number, id: boolean): TileShape {
  const tile: TileShape = id
    ? { rows: 128, tokens: PREFILL_TT }
    : rows < 512
    ? { rows: 64, tokens: 32 }
    : { rows: rows < 2048 ? 64 : 128, tokens: DENSE_TT };
  // The IQ4 table's 64 bytes are the most a tile adds to its staging.
  const fits = tileBytes(tile) + 64 <= target.limits.maxComputeWorkgroupStorageSize;
  return fits ? tile : defaultTile(id);
}

/**
 * The decode variant of a product of `rows` rows a part: the layout (o.decode or decodeLayout's)
 * and the tokens a workgroup takes (o.decodeTokens or decodeTokens'), fewer where the layout or
 * the device's workgroup memory cannot take them.
 */
function decodeKey(
  target: KernelTarget,
  type: GgmlType,
  rows: number,
  o: MulMatOptions,
  e: { readonly id: boolean; readonly gathered: boolean },
): MulMatVecKey {
  const plain = !e.id || e.gathered;
  const asked = !plain || o.conv ? 1 : o.decodeTokens ??
    decodeTokens(o.tokens, { gathered: e.gathered, norm: !!o.norm, rows });
  const layout = o.decode ?? (plain ? decodeLayout(rows, e.id, asked) : slotLayout(type, o.tokens));
  const key = {
    type,
    layout,
    id: e.id,
    gathered: e.gathered,
    swiglu: o.swiglu,
    add: o.add,
    norm: !!o.norm,
    conv: !!o.conv,
    moeSum: !!o.moeSum,
  };
  let tokens: MatVecTokens = layout.cu === 16 ? asked : 1;
  while (
    tokens > 1 &&
    workgroupBytes({ ...key, tokens }) > target.limits.maxComputeWorkgroupStorageSize
  ) {
    tokens = tokens / 2 as MatVecTokens;
  }
  return { ...key, tokens };
}

/**
 * Records y = W·x for `tokens` tokens: one dispatch per part of W. Plain: y[t][row] for all
 * rows of W. With ids: y[t][i][row] = W_{ids[t,i]}·x[t][i] for i < nUsed, rows of one expert.
 */
export function mulMat(enc: StepEncoder, b: MulMatBuffers, o: MulMatOptions): void {
  const { w } = b;
  checkType(w.type);
  const id = b.ids !== undefined;
  const gathered = id && o.gatherTiles !== undefined;
  // A layout or token count asked for is a decode product at any length (the kernel benches').
  const asked = o.decode !== undefined || o.decodeTokens !== undefined;
  const decode = o.tile === undefined && (asked ||
    (id ? !gathered || o.tokens <= EXPERT_MATVEC_MAX_TOKENS : matVecTakes(o.tokens, w.matrixRows)));
  if (o.norm && (!decode || o.swiglu)) {
    throw new RangeError("Cannot fold RMSNorm into a prefill tile or a SwiGLU input");
  }
  if ((o.conv || o.moeSum) && (!decode || id || o.add)) {
    throw new RangeError(
      "Cannot run the conv or the MoE sum as the epilogue of a prefill, expert or accumulating product",
    );
  }
  if (o.conv && (o.tokens !== 1 || o.conv.kc < 2)) {
    throw new RangeError(
      `Cannot run a conv of ${o.conv.kc} taps over ${o.tokens} tokens as an epilogue: one token, 2 or more taps`,
    );
  }
  if (w.cols % 32 !== 0) {
    throw new RangeError(
      `Cannot multiply by tensor "${w.name}": rows of ${w.cols} values are not a multiple of 32`,
    );
  }
  // F32 and BF16 weights (the router, F32 models) keep their exact products: their values can
  // exceed what f16 holds.
  if (o.mma && mmaTakes(w.type) && (enc.ctx.features.subgroupMatrix || o.mmaEmulate)) {
    mulMatMma(enc, b, o);
    return;
  }
  const nUsed = id ? (o.nUsed ?? 1) : 1;
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
    ids_stride: gathered ? o.gatherTiles! : o.idsStride ?? nUsed,
    eps: o.norm?.eps ?? 0,
  };
  const ids = b.ids ?? dummyStorage(enc.ctx);
  for (const part of w.parts) {
    const rows = id ? w.matrixRows : part.rows;
    const at = {
      rows,
      row_base: id ? 0 : part.firstRow,
      expert_first: id ? part.firstRow / w.matrixRows : 0,
      expert_count: id ? part.rows / w.matrixRows : 0,
    };
    if (decode) {
      // Workgroups of `tokens` tokens, reading each weight chunk once for all of them: plain, a
      // row tile's groups of tokens side by side; gathered, a grid layer per tile of an expert's
      // slots; else a grid layer per (token, rank) slot of an expert stack.
      const key = decodeKey(enc.ctx, w.type, rows, o, { id, gathered });
      const tiles = Math.ceil(rows / layoutRows(key.layout));
      const tokens = key.tokens ?? 1;
      const z = gathered ? o.gatherTiles! : id ? o.tokens * nUsed : 1;
      const grid = id ? tiles : tiles * Math.ceil(o.tokens / tokens);
      const nw = o.norm?.w ?? dummyStorage(enc.ctx);
      const buffers: Record<string, BufferRef> = { w: part.buffer, x: b.x, ids, nw, y: b.y };
      const params: Record<string, number> = { ...base, ...at, row_tiles: tiles };
      if (o.conv) {
        Object.assign(buffers, { cw: o.conv.w, cstate: o.conv.state, u: o.conv.u });
        Object.assign(params, {
          conv_channels: o.conv.channels,
          conv_kc: o.conv.kc,
          conv_state_offset: o.conv.stateOffset ?? 0,
        });
      }
      if (o.moeSum) {
        Object.assign(buffers, { eo: o.moeSum.experts, ew: o.moeSum.weights });
        Object.assign(params, { sum_k: o.moeSum.k, sum_d: w.matrixRows });
      }
      enc.dispatch(MUL_MAT_VEC, key, buffers, params, { tiles: grid, z });
    } else {
      const tile = o.tile ?? tileFor(enc.ctx, rows, id);
      const tiles = Math.ceil(rows / tile.rows);
      const key = {
        type: w.type,
        id,
        swiglu: o.swiglu,
        add: o.add,
        prefetch: o.prefetch ?? true,
        tile,
        pad: o.pad,
      };
      enc.dispatch(MUL_MAT, key, { w: part.buffer, x: b.x, ids, y: b.y }, {
        ...base,
        ...at,
        row_tiles: tiles,
      }, { tiles, z: gathered ? o.gatherTiles! : Math.ceil(o.tokens / tile.tokens) });
    }
  }
}

/**
 * The pair's layout in a step of several rows: 128 threads a row apart, each workgroup taking two
 * tokens (decodeTokens with the norm folded), so the router and the shared gate|up are read once
 * for every two rows where the one-row layout (64 threads across a row's chunks) reads them a row
 * at a time. The same bits: every layout sums a row in one order.
 */
const PAIR_MULTI_LAYOUT: MatVecLayout = { wg: 128, cu: 16, rpt: 1, xstage: true };

/**
 * Records y = W·x and y2 = W2·x for a decode step of a few tokens in one dispatch, W2 F32 and
 * both of one part: the MoE router beside the shared expert's gate|up, on the same (normed)
 * input. Each output has the bits mulMat gives it alone (the same layout and summation order);
 * false, recording nothing, where the pair does not apply (then call mulMat twice).
 */
export function mulMatPair(
  enc: StepEncoder,
  b: {
    readonly w: GpuTensor;
    readonly w2: GpuTensor;
    readonly x: BufferRef;
    readonly y: BufferRef;
    readonly y2: BufferRef;
  },
  o: {
    readonly tokens: number;
    readonly norm?: RmsNormInput;
    readonly yOffset?: number;
    readonly yStrideT?: number;
    readonly y2Offset?: number;
    readonly y2StrideT?: number;
    readonly decode?: MatVecLayout;
  },
): boolean {
  const { w, w2 } = b;
  if (
    o.tokens > DECODE_MAX_TOKENS || w2.type !== GgmlType.F32 || w.parts.length !== 1 ||
    w2.parts.length !== 1 || w.cols !== w2.cols || w.cols % 32 !== 0 || w.experts > 1 ||
    w2.experts > 1
  ) {
    return false;
  }
  checkType(w.type);
  const rows = w.parts[0].rows;
  const rows2 = w2.parts[0].rows;
  const layout = o.decode ?? (o.tokens > 1 ? PAIR_MULTI_LAYOUT : decodeLayout(rows, false));
  const tiles = Math.ceil(rows / layoutRows(layout));
  const tiles2 = Math.ceil(rows2 / layoutRows(layout));
  // mulMat's choice of tokens a workgroup for this layout, fewer where workgroup memory is short
  const plain = decodeKey(
    enc.ctx,
    w.type,
    rows,
    { tokens: o.tokens, norm: o.norm, decode: layout },
    {
      id: false,
      gathered: false,
    },
  );
  const tn = plain.tokens ?? 1;
  const key = { ...plain, pairF32: true };
  const buffers = {
    w: w.parts[0].buffer,
    x: b.x,
    ids: dummyStorage(enc.ctx),
    nw: o.norm?.w ?? dummyStorage(enc.ctx),
    y: b.y,
    w2: w2.parts[0].buffer,
    y2: b.y2,
  };
  enc.dispatch(MUL_MAT_VEC, key, buffers, {
    k: w.cols,
    rows,
    tokens: o.tokens,
    n_used: 1,
    row_base: 0,
    expert_first: 0,
    expert_count: 0,
    x_offset: 0,
    x_stride_t: w.cols,
    x_stride_i: 0,
    up_offset: 0,
    y_offset: o.yOffset ?? 0,
    y_stride_t: o.yStrideT ?? rows,
    y_stride_i: rows,
    ids_stride: 1,
    row_tiles: tiles,
    eps: o.norm?.eps ?? 0,
    rows2,
    row_tiles2: tiles2,
    y2_offset: o.y2Offset ?? 0,
    y2_stride_t: o.y2StrideT ?? rows2,
  }, { tiles: (tiles + tiles2) * Math.ceil(o.tokens / tn), z: 1 });
  return true;
}
