// rms: the RMSNorm scale inverseSqrt(Σx² · (1/n) + eps) of a row of x, in one summation order
// for every kernel that normalises it (wgsl/rms_norm.wgsl, and wgsl/mul_mat_vec.wgsl's NORM
// variant, which folds the norm into a decode product): so a token's normed input has the same
// bits whichever kernel made it. Order: 256 partials p_j = fma chain of x_i² over i ≡ j (mod 256),
// increasing i; then a tree: p_j + p_{j+128} for j < 128, then halves of 64, 32, ... down to one.
// Contract: the includer declares `var<storage, ...> x: array<f32>` and `const WG` (≥ 128, a
// power of two), and calls rms_scale from uniform control flow with local_invocation_index.

var<workgroup> rms_red: array<f32, 128>;

fn rms_scale(xo: u32, n: u32, eps: f32, lid: u32) -> f32 {
  var part = 0.0;
  if (lid < 128u) {
    var lo = 0.0;
    var hi = 0.0;
    for (var i = lid; i < n; i += 256u) {
      let v = x[xo + i];
      lo = fma(v, v, lo);
    }
    for (var i = lid + 128u; i < n; i += 256u) {
      let v = x[xo + i];
      hi = fma(v, v, hi);
    }
    part = lo + hi;
  }
  return rms_finish(part, n, eps, lid);
}

// The scale from the partials p_lid + p_{lid+128} of invocations lid < 128 (`part`; ignored
// above): for includers that sum the squares from a copy of x (wgsl/mul_mat_vec.wgsl).
fn rms_finish(part: f32, n: u32, eps: f32, lid: u32) -> f32 {
  if (lid < 128u) {
    rms_red[lid] = part;
  }
  workgroupBarrier();
  for (var s = 64u; s > 0u; s >>= 1u) {
    if (lid < s) {
      rms_red[lid] += rms_red[lid + s];
    }
    workgroupBarrier();
  }
  // One fma and one inverseSqrt leave a compiler no choice of how to round: NVIDIA's compiled
  // `1.0 / sqrt(sum / n + eps)` differently in rms_norm and in mul_mat_vec's NORM variant, so
  // the folded norm's scale lost a bit on the H200 (tests/gpu_mul_mat_test.ts caught it).
  let scale = inverseSqrt(fma(rms_red[0], 1.0 / f32(n), eps));
  workgroupBarrier();
  return scale;
}
