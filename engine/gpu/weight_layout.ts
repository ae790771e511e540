// How a weight type's rows lie in GPU memory: as the GGUF file stores them, except Q8_0 and Q6_K,
// which are repacked at upload so that the decode products load a chunk in aligned 16-byte words.
// Read by engine/gpu/tensor.ts (upload), memory_plan.ts (sizes); wgsl/repack.wgsl writes the
// layouts and wgsl/_include/dequant.wgsl reads them.
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
// The values and their rounding are the file's (tests/gpu_weight_layout_test.ts).

import { GgmlType, rowBytes } from "../quant/ggml_types.ts";

const Q6_K_FILE_BLOCK = 210;
/** Bytes of a Q6_K block on the GPU (wgsl/_include/dequant.wgsl's BLOCK_BYTES). */
export const Q6_K_GPU_BLOCK = 288;
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
