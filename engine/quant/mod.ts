// Public face of engine/quant: GGUF tensor types, f16/bf16 conversions, CPU dequantizers (the
// bit-exact reference for the GPU kernels), reference quantizers and fast random blocks.

/**
 * GGUF quantization formats on the CPU.
 *
 * - {@linkcode dequantize}: blocks → f32, bit-identical to llama.cpp's `dequantize_row_*` for
 *   F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
 * - {@linkcode quantize}: f32 → blocks of the same types (llama.cpp quality, not its bytes).
 * - {@linkcode randomBlocks}: valid random blocks with a chosen std, for benchmark models.
 * - {@linkcode f16ToF32}, {@linkcode f32ToF16}, {@linkcode bf16ToF32}, {@linkcode f32ToBf16}.
 *
 * ```ts
 * import { dequantize, GgmlType, quantize } from "./mod.ts";
 * const blocks = quantize(GgmlType.Q4_K, new Float32Array(256).fill(0.5));
 * const values = dequantize(GgmlType.Q4_K, blocks, 256);
 * ```
 *
 * @module
 */

export { type BlockGeometry, blockGeometry, GgmlType, rowBytes, typeName } from "./types.ts";
export { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./f16.ts";
export { DEQUANT_TYPES, dequantize } from "./dequant.ts";
export { QUANT_TYPES, quantize } from "./quantize.ts";
export { randomBlocks } from "./random_blocks.ts";
