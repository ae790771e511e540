// How a weight type's rows lie in GPU memory: as the GGUF file stores them, except Q8_0 and Q6_K,
// which are repacked at upload so that the decode products load a chunk in aligned 16-byte words.
// Read by engine/gpu/tensor.ts (upload), memory_plan.ts (sizes) and wgsl/_include/dequant.wgsl.
//
// The file's blocks (Q8_0 34 bytes, Q6_K 210) lie at alternating word alignments, so a chunk of 32
// values took nine or more misaligned words shifted into place, and Q6_K a dozen bit operations a
// value (its low and high bits in bytes shared with other values): the LM head (417 MB of Q6_K)
// ran at ~0.9 TB/s. On the GPU:
// - Q8_0: eight file blocks as one of 272 bytes, the 256 quants in element order, then the eight
//   d (f16). A row ends in a whole such block (zeros past its values): the file's size wherever
//   the row length is a multiple of 256.
// - Q6_K: 288 bytes a block, the 256 values q (0..63) a byte each in element order, the 16 int8
//   scales (scale e/16 for element e), d (f16), zeros to a 16-byte multiple: 37% more than the
//   file's.
// The values and their rounding are the file's (weight_layout_test.ts).

import { GgmlType, rowBytes, typeName } from "../quant/ggml_types.ts";

const Q6_K_FILE_BLOCK = 210;
/** Bytes of a Q6_K block on the GPU (wgsl/_include/dequant.wgsl's BLOCK_BYTES). */
export const Q6_K_GPU_BLOCK = 288;
const Q8_0_FILE_BLOCK = 34;
/** Bytes of a Q8_0 block of 256 values on the GPU (eight of the file's). */
export const Q8_0_GPU_BLOCK = 272;

/** Bytes one row of `cols` values of `type` takes on the GPU. */
export function gpuRowBytes(type: GgmlType, cols: number): number {
  const file = rowBytes(type, cols);
  if (type === GgmlType.Q6_K) return (file / Q6_K_FILE_BLOCK) * Q6_K_GPU_BLOCK;
  if (type === GgmlType.Q8_0) return Math.ceil(cols / 256) * Q8_0_GPU_BLOCK;
  return file;
}

/** Bytes a tensor of GGUF `shape` takes on the GPU, as one buffer without padding. */
export function gpuTensorBytes(type: GgmlType, shape: readonly number[]): number {
  return shape.slice(1).reduce((a, b) => a * b, 1) * gpuRowBytes(type, shape[0]);
}

/** Whether a type's GPU rows differ from its file rows. */
export function isRepacked(type: GgmlType): boolean {
  return type === GgmlType.Q6_K || type === GgmlType.Q8_0;
}

/**
 * Whole rows of `cols` values of `type` as the file stores them (`src`), in their GPU layout in
 * `dst` (gpuRowBytes a row). Identity for types stored as they are.
 */
export function repackRows(type: GgmlType, cols: number, src: Uint8Array, dst: Uint8Array): void {
  if (!isRepacked(type)) {
    dst.set(src);
    return;
  }
  const fileRb = rowBytes(type, cols);
  const gpuRb = gpuRowBytes(type, cols);
  const rows = src.length / fileRb;
  if (!Number.isInteger(rows) || dst.length !== rows * gpuRb) {
    throw new RangeError(
      `Cannot repack ${src.length} bytes of ${
        typeName(type)
      } into ${dst.length}: not whole rows of ${cols} values`,
    );
  }
  const repack = type === GgmlType.Q6_K ? repackQ6K : repackQ8_0;
  for (let r = 0; r < rows; r++) {
    repack(src.subarray(r * fileRb, (r + 1) * fileRb), dst.subarray(r * gpuRb, (r + 1) * gpuRb));
  }
}

/** Halfwords over `bytes`, whose offset and length the file's even block sizes keep even. */
function halves(bytes: Uint8Array): Uint16Array {
  return new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length >> 1);
}

/** One row of Q8_0: file block b's quants to 32·(b mod 8) of GPU block b/8, its d after them. */
function repackQ8_0(src: Uint8Array, dst: Uint8Array): void {
  const s16 = halves(src);
  const d16 = halves(dst);
  d16.fill(0);
  const blocks = src.length / Q8_0_FILE_BLOCK;
  for (let b = 0; b < blocks; b++) {
    const s = b * (Q8_0_FILE_BLOCK / 2);
    const o = (b >> 3) * (Q8_0_GPU_BLOCK / 2);
    const q = o + 16 * (b & 7);
    for (let h = 0; h < 16; h++) d16[q + h] = s16[s + 1 + h];
    d16[o + 128 + (b & 7)] = s16[s];
  }
}

/**
 * One row of Q6_K, two values at a time: element 128n + 32k + l takes the low nibble k >> 1 of
 * ql[64n + 32(k & 1) + l] and the bits 2k of qh[32n + l] (llama.cpp's dequantize_row_q6_K).
 */
function repackQ6K(src: Uint8Array, dst: Uint8Array): void {
  const s16 = halves(src);
  const d16 = halves(dst);
  for (let i = 0; i < src.length / Q6_K_FILE_BLOCK; i++) {
    const s = i * (Q6_K_FILE_BLOCK / 2);
    const o = i * (Q6_K_GPU_BLOCK / 2);
    for (let n = 0; n < 2; n++) {
      for (let k = 0; k < 4; k++) {
        const ql = s + 32 * n + 16 * (k & 1);
        const qh = s + 64 + 16 * n;
        const shiftLo = 4 * (k >> 1);
        const shiftHi = 2 * k;
        const out = o + 64 * n + 16 * k;
        for (let l = 0; l < 16; l++) {
          d16[out + l] = ((s16[ql + l] >> shiftLo) & 0x0f0f) |
            (((s16[qh + l] >> shiftHi) & 0x0303) << 4);
        }
      }
    }
    for (let h = 0; h < 8; h++) d16[o + 128 + h] = s16[s + 96 + h];
    d16[o + 136] = s16[s + 104];
    d16.fill(0, o + 137, o + Q6_K_GPU_BLOCK / 2);
  }
}
