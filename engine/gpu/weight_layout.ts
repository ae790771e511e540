// How a weight type's rows lie in GPU memory: as the GGUF file stores them, except Q6_K, which is
// repacked at upload so that the decode products spend fewer instructions on each value.
// Read by engine/gpu/tensor.ts (upload), memory_plan.ts (sizes) and wgsl/_include/dequant.wgsl.
//
// Q6_K's 210-byte block keeps a value's low four bits in one byte (shared with another value) and
// its high two in another (shared with three), at offsets that alternate between word alignments:
// a value took two misaligned word pairs and about a dozen bit operations, which held the LM head
// (417 MB of the bench model's 1.7 GB a token) at ~0.9 TB/s. The GPU block is 288 bytes: the 256
// values q (0..63) a byte each in element order, the 16 int8 scales (scale e/16 for element e),
// d (f16), zeros to a 16-byte multiple, so a decode product loads a chunk in 16-byte words. The
// values are the file's: d·sc·(q − 32).

import { GgmlType, rowBytes } from "../quant/ggml_types.ts";

const Q6_K_FILE_BLOCK = 210;
/** Bytes of a Q6_K block on the GPU (wgsl/_include/dequant.wgsl's BLOCK_BYTES). */
export const Q6_K_GPU_BLOCK = 288;

/** Bytes one row of `cols` values of `type` takes on the GPU. */
export function gpuRowBytes(type: GgmlType, cols: number): number {
  const file = rowBytes(type, cols);
  return type === GgmlType.Q6_K ? (file / Q6_K_FILE_BLOCK) * Q6_K_GPU_BLOCK : file;
}

/** Bytes a tensor of GGUF `shape` takes on the GPU, as one buffer without padding. */
export function gpuTensorBytes(type: GgmlType, shape: readonly number[]): number {
  return shape.slice(1).reduce((a, b) => a * b, 1) * gpuRowBytes(type, shape[0]);
}

/** Whether a type's GPU rows differ from its file rows. */
export function isRepacked(type: GgmlType): boolean {
  return type === GgmlType.Q6_K;
}

/**
 * Whole rows of `type` as the file stores them (`src`), in their GPU layout in `dst`
 * (gpuRowBytes per row). Identity for types stored as they are.
 */
export function repackRows(type: GgmlType, src: Uint8Array, dst: Uint8Array): void {
  if (!isRepacked(type)) {
    dst.set(src);
    return;
  }
  const blocks = src.length / Q6_K_FILE_BLOCK;
  if (!Number.isInteger(blocks) || dst.length !== blocks * Q6_K_GPU_BLOCK) {
    throw new RangeError(
      `Cannot repack ${src.length} bytes of Q6_K into ${dst.length}: not whole blocks of ${Q6_K_FILE_BLOCK} bytes`,
    );
  }
  for (let i = 0; i < blocks; i++) {
    const s = i * Q6_K_FILE_BLOCK;
    const o = i * Q6_K_GPU_BLOCK;
    // Element 128n + 32k + l: low nibble k >> 1 of ql[64n + 32(k & 1) + l], high bits 2k of
    // qh[32n + l] (llama.cpp's dequantize_row_q6_K).
    for (let n = 0; n < 2; n++) {
      for (let k = 0; k < 4; k++) {
        const ql = s + 64 * n + 32 * (k & 1);
        const qh = s + 128 + 32 * n;
        const shiftLo = 4 * (k >> 1);
        const shiftHi = 2 * k;
        const out = o + 128 * n + 32 * k;
        for (let l = 0; l < 32; l++) {
          dst[out + l] = ((src[ql + l] >> shiftLo) & 15) | (((src[qh + l] >> shiftHi) & 3) << 4);
        }
      }
    }
    dst.set(src.subarray(s + 192, s + 208), o + 256);
    dst[o + 272] = src[s + 208];
    dst[o + 273] = src[s + 209];
    dst.fill(0, o + 274, o + Q6_K_GPU_BLOCK);
  }
}
