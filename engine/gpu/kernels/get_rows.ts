// Embedding lookup (wgsl/get_rows.wgsl): y[t] = dequantized row ids[t] of a quantized table.
// The first step of the first stage in engine/gpu/gpu_forward.ts.

import type { BufferRef } from "../buffers.ts";
import type { StepEncoder } from "../encoder.ts";
import type { KernelFamily } from "../kernel.ts";
import type { GpuTensor } from "../tensor.ts";
import { type GgmlType, typeName } from "../../quant/ggml_types.ts";
import { MUL_MAT_TYPES } from "./mul_mat.ts";

const WG = 64;

/** A variant per table type. */
export const GET_ROWS: KernelFamily<GgmlType> = {
  file: "get_rows.wgsl",
  variant: (_, type) => {
    if (!MUL_MAT_TYPES.includes(type)) {
      throw new TypeError(`Cannot look up rows of a ${typeName(type)} table: no GPU decoder`);
    }
    return { name: `get_rows_${typeName(type)}`, defines: { [`TYPE_${typeName(type)}`]: true } };
  },
};

/** Records y[t] = table row ids[idsOffset + t] for t < tokens (one dispatch per part). */
export function getRows(
  enc: StepEncoder,
  b: { readonly w: GpuTensor; readonly ids: BufferRef; readonly y: BufferRef },
  o: { readonly tokens: number; readonly idsOffset?: number },
): void {
  const { w } = b;
  const tiles = Math.ceil(w.cols / 32 / WG);
  for (const part of w.parts) {
    enc.dispatch(GET_ROWS, w.type, { w: part.buffer, ids: b.ids, y: b.y }, {
      cols: w.cols,
      tokens: o.tokens,
      row_first: part.firstRow,
      row_count: part.rows,
      ids_offset: o.idsOffset ?? 0,
      chunk_tiles: tiles,
    }, { tiles, z: o.tokens });
  }
}
