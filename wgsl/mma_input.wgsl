// mma_input: the f16 input of the tensor-core products (wgsl/mul_mat_mma.wgsl): each row r of
// activations x (under SWIGLU silu(g)·u, g at the row's values and u up_offset further) as
// v = x / s_r with s_r = 2^(e − 14), e the exponent of the row's largest |x|, so the row's values
// lie below 2^15 in magnitude and no f16 overflows however large they are (hidden states reach
// thousands, SwiGLU inputs more); the product multiplies its sums by s_r. Under SPLIT each v is
// written as two f16, hi = f16(v) (wgsl/_include/f16_round.wgsl) and lo = f16(v − hi): hi + lo holds v to 2^−22 of it (2^−25 of
// the row's largest below that: lo loses the rest to f16's subnormals), which the product's
// three matrix multiplies keep; without SPLIT, hi alone (the single-product variant the kernel
// bench compares). A power of two divides exactly, and the largest |x| is the same whatever order
// the threads meet the values in, so a row's bits depend on the row alone. Matches the products'
// contract in engine/gpu/kernels/mul_mat_mma.ts (the reference: the f32 values).
// Bindings: 0 x (f32; row r = t·n_rank + i at x_offset + t·x_stride_t + i·x_stride_i) | 1 xh (rw:
//   rows of k f16 pairs: under SPLIT per 32-value chunk 16 words of hi pairs, then 16 of lo pairs,
//   k words a row; else the hi pairs, k / 2 words a row) | 2 xscale (rw: s_r, f32) | 3 params.
// Dispatch: (rows folded to 2-D), one workgroup a row. WG = 128. Variants: SWIGLU, SPLIT.

struct Params {
  k: u32,
  rows: u32,
  n_rank: u32,
  x_offset: u32,
  x_stride_t: u32,
  x_stride_i: u32,
  up_offset: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> xh: array<u32>;
@group(0) @binding(2) var<storage, read_write> xscale: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 128u;

#include "_include/reduce.wgsl"
#include "_include/f16_round.wgsl"

// The row's value at x[i]: as the f32 tiles compute it (wgsl/mul_mat.wgsl xmix).
fn value(i: u32) -> f32 {
#ifdef SWIGLU
  let g = x[i];
  return g / (1.0 + exp(-g)) * x[i + params.up_offset];
#else
  return x[i];
#endif
}

// 2^e as an f32, for e in −126..127 (a normal number: the exponent field alone).
fn pow2(e: i32) -> f32 {
  return bitcast<f32>(u32(e + 127) << 23u);
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= params.rows) {
    return;
  }
  let t = row / params.n_rank;
  let i = row % params.n_rank;
  let xo = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
  var m = 0.0;
  for (var j = lid; j < params.k; j += WG) {
    m = max(m, abs(value(xo + j)));
  }
  m = wg_max(m, lid);
  // e = ⌊log2 m⌋ from the exponent field (−127 for 0 and subnormals, 128 past the finite);
  // s = 2^(e − 14) kept normal, as is 1/s: rows below 2^−112 lose their smallest values to
  // f16's subnormals, which leaves their products at 0 within the f32 rounding of a product
  // of such rows.
  let e = i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127;
  let se = clamp(e - 14, -126, 126);
  let inv = pow2(-se);
  if (lid == 0u) {
    xscale[row] = pow2(se);
  }
  let words = params.k / 2u;
#ifdef SPLIT
  let out = row * params.k;
#else
  let out = row * words;
#endif
  for (var p = lid; p < words; p += WG) {
    let v = vec2<f32>(value(xo + 2u * p), value(xo + 2u * p + 1u)) * inv;
#ifdef SPLIT
    // hi is an f16 value, so packing it is exact, and v − hi is exact in f32.
    let hi = vec2<f32>(f16_round(v.x), f16_round(v.y));
    let at = out + 32u * (p / 16u) + p % 16u;
    xh[at] = pack2x16float(hi);
    xh[at + 16u] = pack2x16float(v - hi);
#else
    xh[out + p] = pack2x16float(v);
#endif
  }
}
