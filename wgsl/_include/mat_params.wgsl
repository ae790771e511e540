// mat_params: the Params of both matrix products, wgsl/mul_mat.wgsl (prefill tiles) and
// wgsl/mul_mat_vec.wgsl (decode), which engine/gpu/kernels/mul_mat.ts fills from one set of values
// so a token's product reads the same operands in either kernel. Offsets and strides count f32
// elements, per token (_t) and per expert rank (_i); row_tiles is the grid's real row tiles. eps is
// a folded RMSNorm's (mul_mat_vec NORM; 0 elsewhere); the PAIR_F32, CONV and MOE_SUM fields are
// mul_mat_vec's only.

struct Params {
  k: u32,
  rows: u32,
  tokens: u32,
  n_used: u32,
  row_base: u32,
  expert_first: u32,
  expert_count: u32,
  x_offset: u32,
  x_stride_t: u32,
  x_stride_i: u32,
  up_offset: u32,
  y_offset: u32,
  y_stride_t: u32,
  y_stride_i: u32,
  ids_stride: u32,
  row_tiles: u32,
  eps: f32,
#ifdef PAIR_F32
  rows2: u32,
  row_tiles2: u32,
  y2_offset: u32,
  y2_stride_t: u32,
#endif
#ifdef CONV
  conv_channels: u32,
  conv_kc: u32,
  conv_state_offset: u32,
#endif
#ifdef MOE_SUM
  sum_k: u32,
  sum_d: u32,
#endif
}
