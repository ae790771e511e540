// Prefill products on tensor cores (wgsl/mul_mat_mma.wgsl, after wgsl/mma_input.wgsl): the path
// engine/gpu/kernels/mul_mat.ts takes for `mma` products where the device has subgroup matrices.
//
// Dimensions: T tokens, K input values per row (tensor cols), M output rows, Ku experts per token.

import { type BufferRef, type BufferSlice, dummyStorage } from "../buffers.ts";
import type { GpuContext } from "../device.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily, KernelTarget } from "../kernel.ts";
import { GgmlType, typeName } from "../../quant/ggml_types.ts";
import { mmaInput } from "./mma_input.ts";
import { type MulMatBuffers, type MulMatOptions, PREFILL_TT } from "./mul_mat.ts";
import { PREFETCH_TYPES } from "./mul_mat_vec.ts";

/**
 * A tensor-core tile: rows × token slots, staged in one buffer or two (wgsl STAGES). Four
 * subgroups split it 2 × 2 (64 and 128 slots) or 4 × 1 (32 slots), each into 16 × 16 results.
 */
export interface MmaTile {
  readonly rows: 64 | 128;
  readonly tokens: 32 | 64 | 128;
  readonly stages: 1 | 2;
}

/**
 * How a tensor-core product carries its f32 operands in f16. "split" (the engine's): each weight
 * and input value as two f16, three matrix multiplies a step, within f32's rounding of the exact
 * product. "f16": each rounded to one f16, one multiply a step, ~3e-4 off (the kernel bench times
 * it beside "split", for what the accuracy costs).
 */
export type MmaPrecision = "split" | "f16";

/**
 * Weight types the tensor cores take: every type whose dequantized values lie in f16's range on
 * f16's grid (docs/PERFORMANCE-NOTES.md "Tensor cores"). F32 and BF16 reach 3.4e38, beyond any pair of
 * f16, and keep the f32 tiles' exact products.
 */
export function mmaTakes(type: GgmlType): boolean {
  return type !== GgmlType.F32 && type !== GgmlType.BF16;
}

/** A tensor-core variant; the input rows come from mma_input. */
export interface MulMatMmaKey {
  readonly type: GgmlType;
  readonly tile: MmaTile;
  /** Default "split". */
  readonly precision?: MmaPrecision;
  /** Weights are an expert stack and a tile takes the slots of a gather table's tile. */
  readonly id?: boolean;
  /** Accumulate into y (residual add). */
  readonly add?: boolean;
  /** Load the chunk after the staged one during the products (PREFETCH_TYPES only). */
  readonly prefetch?: boolean;
  /** The matrix operations as f32 code, on any device (wgsl EMULATE; MulMatOptions.mmaEmulate). */
  readonly emulate?: boolean;
}

/** f16 values each weight and input value takes: two (hi and lo) under "split". */
function parts(precision: MmaPrecision = "split"): 1 | 2 {
  return precision === "split" ? 2 : 1;
}

/**
 * Workgroup memory of a tile: per stage, a chunk's 32 values of each row and of each slot as f16,
 * two of each under "split" (twice that with its f16 values kept as f32), padded (8 values a k run
 * of rows, 8 a slot); 4 KB of results on their way out, 12 bytes a slot, the gather tile and the
 * IQ4 table.
 */
export function mmaWorkgroupBytes(
  t: MmaTile,
  stageF32 = false,
  precision?: MmaPrecision,
): number {
  const p = parts(precision);
  const staged = 64 * (p * t.rows + 8) + 16 * (4 * p + 1) * t.tokens;
  return (stageF32 ? 2 : 1) * t.stages * staged + 4096 + 12 * t.tokens + 4 + 64;
}

/** Whether a variant keeps its staged f16 values as f32: emulated, on a device without f16. */
export function mmaStagesF32(target: KernelTarget, emulate: boolean | undefined): boolean {
  return !!emulate && !target.features.f16;
}

/** Subgroups along rows and slots, and 16 × 16 results each along both. */
function subgroupLayout(t: MmaTile): { sgr: number; sgc: number; fm: number; fn: number } {
  const sgc = t.tokens >= 64 ? 2 : 1;
  const sgr = 4 / sgc;
  return { sgr, sgc, fm: t.rows / 16 / sgr, fn: t.tokens / 16 / sgc };
}

/** A variant per weight type, tile, staging and epilogue. */
export const MUL_MAT_MMA: KernelFamily<MulMatMmaKey> = {
  file: "mul_mat_mma.wgsl",
  variant: (target, v) => {
    const t = v.tile;
    const stageF32 = mmaStagesF32(target, v.emulate);
    const bytes = mmaWorkgroupBytes(t, stageF32, v.precision);
    if (bytes > target.limits.maxComputeWorkgroupStorageSize) {
      throw new RangeError(
        `Cannot run a ${t.rows} × ${t.tokens} tensor-core tile in ${t.stages} stage(s): it needs ${bytes} bytes of workgroup memory, the device allows ${target.limits.maxComputeWorkgroupStorageSize}; use a smaller tile`,
      );
    }
    const { sgr, sgc, fm, fn } = subgroupLayout(t);
    const defines: Record<string, number | true> = {
      [`TYPE_${typeName(v.type)}`]: true,
      BM: t.rows,
      BN: t.tokens,
      SGR: sgr,
      SGC: sgc,
      FM: fm,
      FN: fn,
      STAGES: t.stages,
    };
    const split = parts(v.precision) === 2;
    if (split) defines.SPLIT = true;
    if (v.type === GgmlType.IQ4_NL || v.type === GgmlType.IQ4_XS) {
      defines.IQ4_TABLE_WORKGROUP = true;
    }
    if (v.id) defines.GATHERED = true;
    if (v.add) defines.ADD = true;
    if (v.emulate) defines.EMULATE = true;
    if (stageF32) defines.STAGE_F32 = true;
    const prefetch = v.prefetch && PREFETCH_TYPES.includes(v.type);
    if (prefetch) defines.PREFETCH = true;
    const name = `mul_mat_mma_${typeName(v.type)}_r${t.rows}t${t.tokens}s${t.stages}${
      prefetch ? "p" : ""
    }${split ? "" : "_f16"}${v.id ? "_id" : ""}${v.add ? "_add" : ""}${v.emulate ? "_emu" : ""}${
      stageF32 ? "32" : ""
    }`;
    return { name, defines };
  },
};

/**
 * The tile a tensor-core product of `rows` rows (a part's, or an expert's) runs for tiles of at
 * most `slots` tokens (the run's tokens, or a gather table's tile): 128 rows × 128 slots where
 * both are plentiful, each weight staged once for many tokens; fewer slots for short runs and
 * fewer rows for small matrices, so the grid still fills the GPU; one stage (measured), falling
 * back to fewer rows where the device's workgroup memory is short. Any tile gives the same bits.
 */
export function mmaTileFor(
  target: KernelTarget,
  rows: number,
  slots: number,
  id: boolean,
  emulate = false,
  precision?: MmaPrecision,
): MmaTile {
  const big = rows >= 2048;
  const tokens = id || slots <= 32 ? 32 : slots <= 64 || !big ? 64 : 128;
  // One stage: on the H100 under Dawn the double-staged tiles ran 1.2-3.5x slower than the same
  // tiles staged once (docs/PERFORMANCE-NOTES.md, "Tensor cores", 2026-12-06), their larger
  // workgroup memory leaving fewer workgroups to hide each other's loads.
  const wanted: MmaTile = { rows: big || (id && rows >= 128) ? 128 : 64, tokens, stages: 1 };
  const tiles: MmaTile[] = [
    wanted,
    { rows: 64, tokens: wanted.tokens, stages: 1 },
    { rows: 64, tokens: 32, stages: 1 },
  ];
  const stageF32 = mmaStagesF32(target, emulate);
  const bytes = (t: MmaTile) => mmaWorkgroupBytes(t, stageF32, precision);
  const fits = tiles.find((t) => bytes(t) <= target.limits.maxComputeWorkgroupStorageSize);
  if (!fits) {
    throw new RangeError(
      `Cannot run tensor-core products: the smallest tile needs ${
        bytes(tiles[3])
      } bytes of workgroup memory, the device allows ${target.limits.maxComputeWorkgroupStorageSize}`,
    );
  }
  return fits;
}

/** Bytes of xscale before xh in the scratch: rows f32, up to a binding offset. */
function scaleBytes(target: KernelTarget, rows: number): number {
  const align = target.limits.minStorageBufferOffsetAlignment;
  return Math.ceil((rows * 4) / align) * align;
}

/** Bytes of scratch an input value takes: hi and lo, two f16 ("split"; "f16" uses half). */
export const MMA_X_VALUE_BYTES = 4;

/**
 * Bytes of the scratch buffer (MulMatBuffers.mmaX) a tensor-core product of `rows` input rows of
 * `k` values needs: a scale per row, then the rows as f16 pairs. Rows: the tokens, or tokens × Ku
 * for expert products whose ranks each have an input row (the experts' down).
 */
export function mmaScratchBytes(target: KernelTarget, rows: number, k: number): number {
  return scaleBytes(target, rows) + rows * k * MMA_X_VALUE_BYTES;
}

/** The scale and f16 windows of the scratch for `rows` rows of `k` values. */
function scratchSlices(
  ctx: GpuContext,
  scratch: GPUBuffer,
  rows: number,
  k: number,
  precision: MmaPrecision | undefined,
): { xscale: BufferSlice; xh: BufferSlice } {
  const need = mmaScratchBytes(ctx, rows, k);
  if (scratch.size < need) {
    throw new RangeError(
      `Cannot run a tensor-core product of ${rows} rows of ${k} inputs: its scratch holds ${scratch.size} bytes, it needs ${need} (mmaScratchBytes)`,
    );
  }
  const at = scaleBytes(ctx, rows);
  return {
    xscale: { buffer: scratch, offset: 0, size: rows * 4 },
    xh: { buffer: scratch, offset: at, size: rows * k * 2 * parts(precision) },
  };
}

/**
 * Records y = W·x on tensor cores, as mulMat's options place the operands: mma_input writes each
 * input row (token, or token × rank) once as f16 pairs with its scale into b.mmaX, then one
 * dispatch per part of W. Dense, or over a gather table (ids with gatherTiles); SwiGLU inputs and
 * `add` as in the f32 tiles. Weights of a type mmaTakes; not with a folded norm, the decode
 * epilogues or the f32 tiles' layout options.
 */
export function mulMatMma(enc: StepEncoder, b: MulMatBuffers, o: MulMatOptions): void {
  const { w } = b;
  const id = b.ids !== undefined;
  if (!mmaTakes(w.type)) {
    throw new RangeError(
      `Cannot run ${typeName(w.type)} weights on tensor cores: their values exceed f16's range`,
    );
  }
  if (o.norm || o.conv || o.moeSum || o.decode || o.tile || o.pad !== undefined) {
    throw new RangeError(
      "Cannot run a tensor-core product with a folded RMSNorm, a decode epilogue or the f32 tiles' layout options",
    );
  }
  if (id && o.gatherTiles === undefined) {
    throw new RangeError("Cannot run expert products on tensor cores without a gather table");
  }
  if (!b.mmaX) {
    throw new RangeError("Cannot run a tensor-core product without its scratch buffer (mmaX)");
  }
  const k = w.cols;
  const nUsed = id ? (o.nUsed ?? 1) : 1;
  const ranks = id && (o.xStrideI ?? 0) !== 0 ? nUsed : 1;
  const precision = o.mmaPrecision;
  const { xscale, xh } = scratchSlices(enc.ctx, b.mmaX, o.tokens * ranks, k, precision);
  mmaInput(enc, { x: b.x, xh, xscale }, {
    k,
    tokens: o.tokens,
    ranks,
    xOffset: o.xOffset ?? 0,
    xStrideT: o.xStrideT ?? k,
    xStrideI: o.xStrideI ?? 0,
    swiglu: !!o.swiglu,
    upOffset: o.upOffset ?? 0,
    split: parts(precision) === 2,
  });
  const ids: BufferRef = b.ids ?? dummyStorage(enc.ctx);
  const prefetch = (o.prefetch ?? true) && PREFETCH_TYPES.includes(w.type);
  const emulate = o.mmaEmulate;
  for (const part of w.parts) {
    const rows = id ? w.matrixRows : part.rows;
    const slots = id ? PREFILL_TT : o.tokens;
    const tile = o.mmaTile ?? mmaTileFor(enc.ctx, rows, slots, id, emulate, precision);
    const tiles = Math.ceil(rows / tile.rows);
    const key = { type: w.type, tile, precision, id, add: o.add, prefetch, emulate };
    enc.dispatch(MUL_MAT_MMA, key, {
      w: part.buffer,
      xh,
      xscale,
      ids,
      y: b.y,
    }, {
      k,
      rows,
      tokens: o.tokens,
      n_used: nUsed,
      row_base: id ? 0 : part.firstRow,
      expert_first: id ? part.firstRow / w.matrixRows : 0,
      expert_count: id ? part.rows / w.matrixRows : 0,
      xh_stride_t: ranks,
      xh_stride_i: ranks > 1 ? 1 : 0,
      y_offset: o.yOffset ?? 0,
      y_stride_t: o.yStrideT ?? (id ? nUsed * w.matrixRows : w.matrixRows * w.experts),
      y_stride_i: o.yStrideI ?? w.matrixRows,
      ids_stride: o.gatherTiles ?? 0,
      row_tiles: tiles,
    }, { tiles, z: id ? o.gatherTiles! : Math.ceil(o.tokens / tile.tokens) });
  }
}
