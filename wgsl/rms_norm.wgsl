// rms_norm: y = x · 1/sqrt(mean(x²) + eps) · w, row by row. One workgroup per row; threads
// stride the row's columns. Matches engine/reference/norms.ts rmsNorm (ggml rms_norm + mul).
// The scale comes from _include/rms.wgsl, as in mul_mat's NORM variant: the same bits.
// Bindings: 0 x (rows at x_offset + r·x_stride) f32 | 1 w (n) f32 | 2 y (rows at y_offset +
//   r·y_stride) f32 | 3 params.
// Dispatch: (rows folded to 2-D). WG = 256. Variants: none.

#include "_include/rms.wgsl"

struct Params {
  n: u32,
  rows: u32,
  x_offset: u32,
  x_stride: u32,
  y_offset: u32,
  y_stride: u32,
  eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;

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
  let xo = params.x_offset + row * params.x_stride;
  let yo = params.y_offset + row * params.y_stride;
  let scale = rms_scale(xo, params.n, params.eps, lid);
  for (var i = lid; i < params.n; i += WG) {
    y[yo + i] = x[xo + i] * scale * w[i];
  }
}
