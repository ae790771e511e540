// The f16 nearest an f32 (ties to even), as an f32, by integer and exact float steps: the split
// products' high parts (wgsl/mma_input.wgsl, mul_mat_mma.wgsl), whose low parts are v − that.

// Not f32(f16(v)): NVIDIA's Vulkan compiler folds that round trip to v (H100, driver 580,
// 2026-12-06), leaving every low part 0 and the products at f16's precision. For |v| ≤ 65504;
// below f16's smallest normal (2^−14) the nearest multiple of its subnormal step 2^−24.
fn f16_round(v: f32) -> f32 {
  if (abs(v) < 6.103515625e-05) {
    return round(v * 16777216.0) * 5.9604644775390625e-08;
  }
  let u = bitcast<u32>(v);
  return bitcast<f32>((u + 0xfffu + ((u >> 13u) & 1u)) & 0xffffe000u);
}
