// mul_mat: y[t,i][row] (= or +=) W_e[row] · x[t,i] for every weight type; decode (TT = 1) and
// prefill (TT tokens per workgroup); with ID, e = ids[t, i] picks an expert of a stacked tensor,
// and with GATHERED a workgroup takes up to TT slots routed to one expert (prefill MoE).
// Matches engine/reference/math.ts matVec over engine/quant/dequant.ts rows (f32 accumulation).
// Bindings: 0 w: weight bytes of one part (rows of `k` values, quantized) | 1 x (f32)
//   | 2 ids (u32: expert ids (T, ids_stride) under ID, the gather table under GATHERED, a dummy
//   otherwise) | 3 y (f32) | 4 params.
// Dispatch: (row_tiles folded to 2-D, z) with z = token tiles, T·n_used slots under ID, or the
//   gather table's most tiles under GATHERED (workgroups past its tile count exit).
//   WG = 64 threads = ROWS rows of TPR threads; a row's threads stride its 32-value chunks.
// Variants: TYPE_<type> (one), TT (tokens per workgroup), ID, GATHERED (with ID), X_SWIGLU
//   (x = silu(g)·u with u at g + up_offset), ADD (y += result), SUBGROUPS (row sums by
//   subgroup shuffles). Each slot's sum runs over the same chunks in the same order in every
//   variant, so decode and prefill results are bit-identical.

#ifdef SUBGROUPS
enable subgroups;
#endif

#include "_include/dequant.wgsl"

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
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG = 64u;
const TPR = 16u;
const ROWS = WG / TPR;

#ifndef SUBGROUPS
var<workgroup> partial: array<f32, WG * TT>;
#endif
var<workgroup> chosen: u32;

fn xval(i: u32) -> f32 {
#ifdef X_SWIGLU
  let g = x[i];
  return g / (1.0 + exp(-g)) * x[i + params.up_offset];
#else
  return x[i];
#endif
}

fn x4(i: u32) -> vec4<f32> {
  return vec4<f32>(xval(i), xval(i + 1u), xval(i + 2u), xval(i + 3u));
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let tile = wid.x + wid.y * nwg.x;
  if (tile >= params.row_tiles) {
    return;
  }
  let lane = lid % TPR;
  let r = tile * ROWS + lid / TPR;
  // The token slots this workgroup computes: x and y offsets of each, n of them.
  var xb: array<u32, TT>;
  var yb: array<u32, TT>;
  var n = 0u;
#ifdef ID
#ifdef GATHERED
  // wid.z is a tile of the gather table (wgsl/moe_gather.wgsl): expert | count << 12 | first << 16,
  // with the slots routed to that expert listed from entry `first`.
  if (lid == 0u) {
    chosen = select(0xffffffffu, ids[1u + wid.z], wid.z < ids[0]);
  }
  let packed = workgroupUniformLoad(&chosen);
  if (packed == 0xffffffffu) {
    return;
  }
  let e = packed & 0xfffu;
  n = (packed >> 12u) & 0xfu;
  for (var tt = 0u; tt < TT; tt++) {
    if (tt < n) {
      let slot = ids[1u + params.ids_stride + (packed >> 16u) + tt];
      let t = slot / params.n_used;
      let i = slot % params.n_used;
      xb[tt] = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
      yb[tt] = params.y_offset + t * params.y_stride_t + i * params.y_stride_i;
    }
  }
#else
  // Slot wid.z = (token t, expert rank i).
  let t = wid.z / params.n_used;
  let i = wid.z % params.n_used;
  if (lid == 0u) {
    chosen = ids[t * params.ids_stride + i];
  }
  let e = workgroupUniformLoad(&chosen);
  n = 1u;
  xb[0] = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
  yb[0] = params.y_offset + t * params.y_stride_t + i * params.y_stride_i;
#endif
  // Only the part holding expert e computes it.
  if (e < params.expert_first || e >= params.expert_first + params.expert_count) {
    return;
  }
  let row_in_part = (e - params.expert_first) * params.rows + r;
  let y_row = r;
#else
  let t0 = wid.z * TT;
  n = min(TT, params.tokens - t0);
  for (var tt = 0u; tt < TT; tt++) {
    xb[tt] = params.x_offset + (t0 + tt) * params.x_stride_t;
    yb[tt] = params.y_offset + (t0 + tt) * params.y_stride_t;
  }
  let row_in_part = r;
  let y_row = params.row_base + r;
#endif
  var acc: array<f32, TT>;
  let chunks = params.k / 32u;
  if (r < params.rows) {
    let row_byte = row_in_part * ((params.k / BLOCK_ELEMS) * BLOCK_BYTES);
    for (var c = lane; c < chunks; c += TPR) {
      let wv = dequant32(row_byte, c);
      for (var tt = 0u; tt < TT; tt++) {
        if (tt < n) {
          var s = 0.0;
          for (var v = 0u; v < 8u; v++) {
            s += dot(wv[v], x4(xb[tt] + 32u * c + 4u * v));
          }
          acc[tt] += s;
        }
      }
    }
  }
#ifdef SUBGROUPS
  // Reduction tail 1: a butterfly over the row's TPR lanes, which sit in one subgroup (the
  // device checked that lanes follow local_invocation_index and subgroups have ≥ TPR lanes).
  for (var tt = 0u; tt < TT; tt++) {
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
      acc[tt] += subgroupShuffleXor(acc[tt], s);
    }
  }
#else
  // Reduction tail 2: a tree in workgroup memory laid out [row][lane][tt].
  for (var tt = 0u; tt < TT; tt++) {
    partial[lid * TT + tt] = acc[tt];
  }
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      for (var tt = 0u; tt < TT; tt++) {
        partial[lid * TT + tt] += partial[(lid + s) * TT + tt];
      }
    }
    workgroupBarrier();
  }
  for (var tt = 0u; tt < TT; tt++) {
    acc[tt] = partial[lid * TT + tt];
  }
#endif
  if (lane == 0u && r < params.rows) {
    for (var tt = 0u; tt < TT; tt++) {
      if (tt < n) {
#ifdef ADD
        y[yb[tt] + y_row] += acc[tt];
#else
        y[yb[tt] + y_row] = acc[tt];
#endif
      }
    }
  }
}
