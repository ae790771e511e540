// The decode matrix-vector product (wgsl/mul_mat_vec.wgsl): its variants, the workgroup layouts
// it can run with, and the layout a device and weight type get. engine/gpu/kernels/mul_mat.ts
// sends every call of up to a few tokens here; bench/kernels/decode_matvec.ts times the layouts.

import type { KernelFamily, KernelTarget } from "../kernel.ts";
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
}

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
  /** One token's experts summed by routing weight into y (with id). */
  readonly sum?: boolean;
}

/** Rows one workgroup of a layout computes. */
export function layoutRows(l: MatVecLayout): number {
  return (l.wg / l.cu) * l.rpt;
}

/** Chunks of 32 values a window covers (wgsl WIN). */
const WINDOW = 64;

/** Workgroup memory a variant declares, in bytes (checked against the device's limit). */
export function workgroupBytes(key: MulMatVecKey): number {
  const rows = layoutRows(key.layout);
  let bytes = 4 * rows * 16 + 4;
  if (key.layout.cu !== 16) bytes += 4 * rows * (WINDOW + 1);
  if (key.layout.xstage) bytes += 16 * WINDOW * 9;
  if (key.norm) bytes += 4 * 128;
  if (key.type === GgmlType.IQ4_NL || key.type === GgmlType.IQ4_XS) bytes += 64;
  return bytes;
}

/** The layout's short name, e.g. "w128c16r2x". */
export function layoutName(l: MatVecLayout): string {
  return `w${l.wg}c${l.cu}r${l.rpt}${l.xstage ? "x" : ""}`;
}

/** The layout decode products run with on `target` for weights of `type`. */
export function decodeLayout(_target: KernelTarget, _type: GgmlType): MatVecLayout {
  return { wg: 128, cu: 16, rpt: 1, xstage: true };
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
    const defines: Record<string, number | true> = {
      [`TYPE_${typeName(v.type)}`]: true,
      WG: layout.wg,
      CU: layout.cu,
      RPT: layout.rpt,
    };
    if (regClasses) defines.REG_CLASSES = true;
    if (layout.xstage) defines.XSTAGE = true;
    if (v.type === GgmlType.IQ4_NL || v.type === GgmlType.IQ4_XS) {
      defines.IQ4_TABLE_WORKGROUP = true;
    }
    defines.DEQUANT_UNROLLED = true;
    if (v.id) defines.ID = true;
    if (v.swiglu) defines.X_SWIGLU = true;
    if (v.add) defines.ADD = true;
    if (v.norm) {
      if (v.swiglu) throw new RangeError("Cannot fold RMSNorm into a SwiGLU input");
      defines.NORM = true;
    }
    if (v.sum) {
      if (!v.id || v.add) throw new RangeError("Cannot sum experts outside an expert product");
      defines.SUM = true;
    }
    if (subgroups) defines.SUBGROUPS = true;
    const name = `mul_mat_vec_${typeName(v.type)}_${layoutName(layout)}${v.id ? "_id" : ""}${
      v.swiglu ? "_swiglu" : ""
    }${v.add ? "_add" : ""}${v.norm ? "_norm" : ""}${v.sum ? "_sum" : ""}${subgroups ? "_sg" : ""}`;
    return { name, defines };
  },
};
