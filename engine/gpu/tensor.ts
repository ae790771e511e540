// Weight tensors in GPU memory, still quantized (Q8_0 and Q6_K in the layouts of weight_layout.ts,
// which wgsl/repack.wgsl writes), split into parts that each fit one binding.
// Filled by engine/gpu/gpu_weights.ts into the stage's GpuMemory; read by the kernels
// (engine/gpu/kernels/*) part by part.
//
// A tensor of GGUF shape {cols, rows[, E]} is rows·E rows of `cols` values; a part holds whole
// rows (whole experts for a 3-D stack) so a kernel can work on each part with its own binding.

import type { GgufModel } from "../gguf/gguf_model.ts";
import { GgmlType, rowBytes, typeName } from "../quant/ggml_types.ts";
import { repackRows } from "./kernels/repack.ts";
import { gpuRowBytes, isRepacked } from "./weight_layout.ts";
import {
  dummyStorage,
  type Fill,
  type FillStaging,
  fillStorage,
  type GpuMemory,
  paddedSize,
} from "./buffers.ts";

export interface TensorPart {
  readonly buffer: GPUBuffer;
  /** First row of the whole tensor held here (an expert boundary for a 3-D stack). */
  readonly firstRow: number;
  readonly rows: number;
}

export interface GpuTensor {
  readonly name: string;
  readonly type: GgmlType;
  /** Values per row (GGUF shape[0]). */
  readonly cols: number;
  /** Rows of one matrix (GGUF shape[1]); the experts of a stack each have this many. */
  readonly matrixRows: number;
  /** Matrices stacked (GGUF shape[2], 1 for a plain matrix). */
  readonly experts: number;
  /** Bytes of a row in GPU memory (weight_layout.ts: the file's, or Q8_0's and Q6_K's GPU layouts). */
  readonly rowBytes: number;
  /** Bytes of GPU memory the parts take. */
  readonly bytes: number;
  readonly parts: readonly TensorPart[];
}

export interface UploadOptions {
  /** Largest part in bytes; default: the device's binding and buffer limits. */
  readonly maxPartBytes?: number;
  /** Row permutation: part row r holds file row order[r] (a layout change, see weights/). */
  readonly rowOrder?: Uint32Array;
  /** Called with each number of bytes written, for progress reporting. */
  readonly onBytes?: (bytes: number) => void;
  /** Host pieces reused across the tensors of one load (builtin provider). */
  readonly staging?: FillStaging;
  /** Fill parts mapped at creation or through writeBuffer (default: by provider; tests). */
  readonly mapped?: boolean;
  /**
   * Plan the parts only: read nothing and create no buffers, every part naming a dummy. A
   * stage records its steps against such shapes to compile its kernels while the weights load.
   */
  readonly describe?: boolean;
}

/** Reads `dst.length` bytes of a tensor's data, from byte `start` of it, into `dst`. */
type ReadInto = (dst: Uint8Array<ArrayBuffer>, start: number) => Promise<void>;

/** The row ranges of the parts: whole units (experts) per part, each part within `maxBytes`. */
export function planParts(
  rows: number,
  unitRows: number,
  rowBytes: number,
  maxBytes: number,
): { firstRow: number; rows: number }[] {
  const unitsPerPart = Math.floor(maxBytes / (unitRows * rowBytes));
  if (unitsPerPart < 1) {
    throw new RangeError(
      `Cannot split ${unitRows} rows of ${rowBytes} bytes into GPU bindings of at most ${maxBytes} bytes; the device's maxStorageBufferBindingSize is too small for this model`,
    );
  }
  const per = unitsPerPart * unitRows;
  const parts = [];
  for (let first = 0; first < rows; first += per) {
    parts.push({ firstRow: first, rows: Math.min(per, rows - first) });
  }
  return parts;
}

/** Uploads tensor `name` of `model` as it is stored (quantized), split into parts. */
export function uploadTensor(
  mem: GpuMemory,
  model: GgufModel,
  name: string,
  options: UploadOptions = {},
): Promise<GpuTensor> {
  const info = model.tensors.get(name);
  if (!info) {
    throw new RangeError(`Cannot upload tensor "${name}": "${model.path}" has no such tensor`);
  }
  return uploadRows(
    mem,
    { name, type: info.type, shape: info.shape },
    async (dst, start) => {
      await model.readTensorBytes(name, start, dst.length, dst);
    },
    options,
  );
}

/**
 * Uploads several tensors of one type and row length as one: per expert (3-D stacks) or once
 * (matrices), the rows of `names[0]`, then of `names[1]`, … So projections that read the same
 * input become one matrix product, with results bit-identical to separate ones.
 */
export function uploadConcat(
  mem: GpuMemory,
  model: GgufModel,
  label: string,
  names: readonly string[],
  options: UploadOptions = {},
): Promise<GpuTensor> {
  const infos = names.map((name) => {
    const t = model.tensors.get(name);
    if (!t) {
      throw new RangeError(`Cannot upload tensor "${name}": "${model.path}" has no such tensor`);
    }
    return t;
  });
  const [cols, , experts = 1] = infos[0].shape;
  const type = infos[0].type;
  for (const t of infos) {
    if (t.type !== type || t.shape[0] !== cols || (t.shape[2] ?? 1) !== experts) {
      throw new TypeError(
        `Cannot join tensors ${names.join(", ")}: they differ in type or shape; upload them apart`,
      );
    }
  }
  const rb = rowBytes(type, cols);
  // The joined tensor's bytes as a list of (tensor, byte offset, length) segments.
  const segments: { name: string; start: number; length: number }[] = [];
  for (let e = 0; e < experts; e++) {
    for (const t of infos) {
      const bytes = (t.shape[1] ?? 1) * rb;
      segments.push({ name: t.name, start: e * bytes, length: bytes });
    }
  }
  const rows = infos.reduce((s, t) => s + (t.shape[1] ?? 1), 0);
  const read: ReadInto = async (dst, start) => {
    let at = 0;
    for (const seg of segments) {
      if (at >= start + dst.length) break;
      const lo = Math.max(start, at);
      const hi = Math.min(start + dst.length, at + seg.length);
      if (lo < hi) {
        const into = dst.subarray(lo - start, hi - start);
        await model.readTensorBytes(seg.name, seg.start + lo - at, hi - lo, into);
      }
      at += seg.length;
    }
  };
  const shape = experts > 1 ? [cols, rows, experts] : [cols, rows];
  return uploadRows(mem, { name: label, type, shape }, read, options);
}

/** Uploads a tensor held in memory (`bytes` in GGUF layout); for tests and derived tensors. */
export function uploadTensorBytes(
  mem: GpuMemory,
  desc: TensorDesc,
  bytes: Uint8Array,
  options: UploadOptions = {},
): Promise<GpuTensor> {
  return uploadRows(mem, desc, (dst, start) => {
    dst.set(bytes.subarray(start, start + dst.length));
    return Promise.resolve();
  }, options);
}

/** Name, type and GGUF shape of a tensor. */
export interface TensorDesc {
  readonly name: string;
  readonly type: GgmlType;
  readonly shape: readonly number[];
}

/** The word the dequantizer may read past a part's last row. */
const PART_PADDING = 4;

async function uploadRows(
  mem: GpuMemory,
  desc: TensorDesc,
  read: ReadInto,
  options: UploadOptions,
): Promise<GpuTensor> {
  const { name, type, shape } = desc;
  const [cols, matrixRows = 1, experts = 1, extra = 1] = shape;
  if (extra !== 1) {
    throw new RangeError(
      `Cannot upload tensor "${name}": shape [${shape.join(", ")}] has more than 3 dimensions`,
    );
  }
  const rb = gpuRowBytes(type, cols);
  const rows = matrixRows * experts;
  // Binding sizes must be multiples of 4 and the dequantizer may read one word past a row.
  const { ctx } = mem;
  const limit = Math.min(ctx.limits.maxStorageBufferBindingSize, ctx.limits.maxBufferSize) - 8;
  const maxBytes = Math.min(options.maxPartBytes ?? limit, limit);
  const plan = planParts(rows, experts > 1 ? matrixRows : 1, rb, maxBytes);
  const order = options.rowOrder;
  if (order && (order.length !== rows || experts > 1)) {
    throw new RangeError(
      `Cannot reorder tensor "${name}": ${order.length} row indices for ${rows} rows of a ${shape.length}-D tensor`,
    );
  }
  if (options.describe) {
    const parts = plan.map((p) => ({ ...p, buffer: dummyStorage(ctx) }));
    const bytes = plan.reduce((s, p) => s + paddedSize(p.rows * rb + PART_PADDING), 0);
    return { name, type, cols, matrixRows, experts, rowBytes: rb, bytes, parts };
  }
  const fileRb = rowBytes(type, cols);
  let whole: Uint8Array | undefined;
  if (order) {
    const file = new Uint8Array(rows * fileRb);
    await read(file, 0);
    whole = permuteRows(file, order, fileRb);
  }
  const parts: TensorPart[] = [];
  let bytes = 0;
  for (const p of plan) {
    const first = p.firstRow * fileRb;
    const fill: Fill = whole
      ? (dst, at) => Promise.resolve(dst.set(whole.subarray(first + at, first + at + dst.length)))
      : (dst, at) => read(dst, first + at);
    const label = `${name}[${p.firstRow}+${p.rows}]`;
    const fillOptions = {
      padding: PART_PADDING,
      staging: options.staging,
      onPiece: options.onBytes,
      mapped: options.mapped,
    };
    let buffer: GPUBuffer;
    if (isRepacked(type)) {
      // The file's rows go up as they are, and the GPU lays them out: the host only reads.
      const stored = await fillStorage(
        ctx,
        `${label} as stored`,
        p.rows * fileRb,
        fill,
        fillOptions,
      );
      try {
        buffer = mem.storage(label, p.rows * rb + PART_PADDING);
        repackRows(ctx, type, cols, p.rows, stored, buffer);
      } finally {
        stored.destroy();
      }
    } else {
      buffer = await mem.fill(label, p.rows * rb, fill, fillOptions);
    }
    parts.push({ buffer, firstRow: p.firstRow, rows: p.rows });
    bytes += buffer.size;
  }
  return { name, type, cols, matrixRows, experts, rowBytes: rb, bytes, parts };
}

function permuteRows(src: Uint8Array, order: Uint32Array, rb: number): Uint8Array {
  const out = new Uint8Array(src.length);
  for (let r = 0; r < order.length; r++) {
    out.set(src.subarray(order[r] * rb, order[r] * rb + rb), r * rb);
  }
  return out;
}

/** "Q4_K [2048 x 512 x 256]" for logs and errors. */
export function describeTensor(t: GpuTensor): string {
  const dims = t.experts > 1 ? [t.cols, t.matrixRows, t.experts] : [t.cols, t.matrixRows];
  return `${typeName(t.type)} [${dims.join(" x ")}]`;
}
