// gated_delta_net: the DeltaNet recurrence of a run of tokens for one value head per workgroup,
// then the gated output norm: per token, L2-normalise q and k of the paired key head, decay the
// state by exp(g), delta-rule update with beta, read out with q/√dk, y = RMSNorm(o)·w·silu(z).
// Matches engine/reference/norms.ts l2NormHeads, engine/reference/deltanet.ts deltaNetGates and
// deltaNetStep, engine/reference/norms.ts gatedRmsNorm, token by token (f32).
// Bindings: 0 u: conv output of token t at t·u_stride_t: [q (nk·dk) | k (nk·dk) | v (nv·dv)]
//   | 1 ba: [b (nv) | a (nv)] at t·ba_stride_t | 2 z: gate of head h at z_offset +
//   t·z_stride_t + h·dv | 3 p: [dt_bias (nv) | ssm_a (nv) | norm weight (dv)] f32
//   | 4 state (nv, dk, dv) f32, S_h[i][j] at (h·dk + i)·dv + j | 5 y (t·y_stride_t + h·dv + j)
//   | 6 params.
// Dispatch: (nv); thread j owns column j of its head's state in registers.
// WG = DV (a power of two). Variants: DK, DV (head dims).

#include "_include/reduce.wgsl"

struct Params {
  nk: u32,
  nv: u32,
  tokens: u32,
  interleave: u32,
  u_stride_t: u32,
  ba_stride_t: u32,
  z_offset: u32,
  z_stride_t: u32,
  y_stride_t: u32,
  eps: f32,
}

@group(0) @binding(0) var<storage, read> u: array<f32>;
@group(0) @binding(1) var<storage, read> ba: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
@group(0) @binding(3) var<storage, read> p: array<f32>;
@group(0) @binding(4) var<storage, read_write> state: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

const WG = DV;

var<workgroup> qs: array<f32, DK>;
var<workgroup> ks: array<f32, DK>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) j: u32) {
  let h = wid.x;
  let nk = params.nk;
  let nv = params.nv;
  // Key head of value head h: repeat-interleave (qwen3next) or tiling (qwen35*), §4.6.5.
  let kh = select(h % nk, h / (nv / nk), params.interleave == 1u);
  var s: array<f32, DK>;
  for (var i = 0u; i < DK; i++) {
    s[i] = state[(h * DK + i) * DV + j];
  }
  let dt = p[h];
  let a_log = p[nv + h];
  let wj = p[2u * nv + j];
  let out_scale = 1.0 / sqrt(f32(DK));
  for (var t = 0u; t < params.tokens; t++) {
    let uo = t * params.u_stride_t;
    for (var i = j; i < DK; i += WG) {
      qs[i] = u[uo + kh * DK + i];
      ks[i] = u[uo + nk * DK + kh * DK + i];
    }
    workgroupBarrier();
    var sq = 0.0;
    var sk = 0.0;
    for (var i = 0u; i < DK; i++) {
      sq += qs[i] * qs[i];
      sk += ks[i] * ks[i];
    }
    let rq = 1.0 / max(sqrt(sq), params.eps);
    let rk = 1.0 / max(sqrt(sk), params.eps);
    let b = ba[t * params.ba_stride_t + h];
    let ga = ba[t * params.ba_stride_t + nv + h] + dt;
    let beta = 1.0 / (1.0 + exp(-b));
    let decay = exp(select(log(1.0 + exp(ga)), ga, ga > 20.0) * a_log);
    let v = u[uo + 2u * nk * DK + h * DV + j];
    var kv = 0.0;
    for (var i = 0u; i < DK; i++) {
      s[i] *= decay;
      kv += s[i] * (ks[i] * rk);
    }
    let delta = (v - kv) * beta;
    var o = 0.0;
    for (var i = 0u; i < DK; i++) {
      s[i] += (ks[i] * rk) * delta;
      o += s[i] * (qs[i] * rq);
    }
    o *= out_scale;
    let norm = 1.0 / sqrt(wg_sum(o * o, j) / f32(DV) + params.eps);
    let zv = z[params.z_offset + t * params.z_stride_t + h * DV + j];
    y[t * params.y_stride_t + h * DV + j] = o * norm * wj * (zv / (1.0 + exp(-zv)));
  }
  for (var i = 0u; i < DK; i++) {
    state[(h * DK + i) * DV + j] = s[i];
  }
}
