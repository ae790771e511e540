// qk_norm_rope: per-head RMSNorm then partial RoPE (NEOX pairing; IMROPE for text positions) of
// the q and k heads of attention, in one dispatch. q is rewritten in place; k is written as f16
// into the KV cache together with the matching v head. Matches engine/reference/norms.ts rmsNorm
// then engine/reference/rope.ts ropeNeox / ropeImrope with positions [p, p, p, 0].
// Bindings: 0 x: token t's row at x_offset + t·x_stride_t: q head h at h·q_stride_h (in place), k head h at
//   k_offset + h·k_stride_h, its v head at v_offset + h·k_stride_h, f32 | 1 wq, 2 wk (dh) f32
//   norm weights | 3 kc, 4 vc: caches (pos, k_heads, dh) f16 pairs in u32 from word kv_offset
//   (dummies without k heads) | under MULTI 5 seqs: the step's sequence table, 4 u32 an entry
//   (state index, row, tokens, position) | params.
// Dispatch: (tokens·(q_heads + k_heads) folded); a workgroup per head row (a token's q heads,
//   then its k heads), threads stride its dims. WG = 64; dh ≤ 512 and even.
// Variants: MULTI: token t is the one token of table entry seq0 + t, at its row of x and its
//   position, its cache from word kv_offset + index·kv_stride (IMROPE is a uniform param; either
//   head count may be 0).

#include "_include/reduce.wgsl"

struct Params {
  dh: u32,
  n_rot: u32,
  q_heads: u32,
  k_heads: u32,
  tokens: u32,
  x_offset: u32,
  x_stride_t: u32,
  q_stride_h: u32,
  k_offset: u32,
  k_stride_h: u32,
  v_offset: u32,
  pos0: u32,
  sect0: u32,
  sect1: u32,
  sect2: u32,
  sect3: u32,
  theta_scale: f32,
  eps: f32,
  kv_offset: u32,
  kv_stride: u32,
  seq0: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> wq: array<f32>;
@group(0) @binding(2) var<storage, read> wk: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;
#ifdef MULTI
@group(0) @binding(5) var<storage, read> seqs: array<u32>;
@group(0) @binding(6) var<uniform> params: Params;
#else
@group(0) @binding(5) var<uniform> params: Params;
#endif

const WG = 64u;
const MAX_DH = 512u;

var<workgroup> row: array<f32, MAX_DH>;
var<workgroup> outv: array<f32, MAX_DH>;

// θ_i for pair i at position p: θ₀ = p, θ_{i+1} = θ_i·theta_scale, each product in f32 as ggml
// builds its rope cache. IMROPE (sections set) takes pairs whose sector belongs to the 4th
// stream from position 0 (text tokens use [p, p, p, 0]), which gives angle 0.
fn rope_theta(p: f32, i: u32) -> f32 {
  let sum = params.sect0 + params.sect1 + params.sect2 + params.sect3;
  if (sum > 0u) {
    let sector = i % sum;
    let h = sector % 3u == 1u && sector < 3u * params.sect1;
    let wv = sector % 3u == 2u && sector < 3u * params.sect2;
    let t = sector % 3u == 0u && sector < 3u * params.sect0;
    if (!(h || wv || t)) {
      return 0.0;
    }
  }
  var theta = p;
  for (var j = 0u; j < i; j++) {
    theta = theta * params.theta_scale;
  }
  return theta;
}

// Reduces an angle to about [-π, π] (Cody-Waite, 2π = 6.28125 + hi + lo) so sin/cos stay
// accurate at large positions on GPUs whose own reduction is coarse.
fn reduce_angle(a: f32) -> f32 {
  let k = round(a * 0.15915494309189535);
  return ((a - k * 6.28125) - k * 0.0019378662109375) - k * -2.559031372584286e-06;
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let rowi = wid.x + wid.y * nwg.x;
  let heads = params.q_heads + params.k_heads;
  if (rowi >= params.tokens * heads) {
    return;
  }
  let t = rowi / heads;
#ifdef MULTI
  let e = 4u * (params.seq0 + t);
  let xrow = seqs[e + 1u];
  let pos = seqs[e + 3u];
  let kvo = params.kv_offset + seqs[e] * params.kv_stride;
#else
  let xrow = t;
  let pos = params.pos0 + t;
  let kvo = params.kv_offset;
#endif
  let store = rowi % heads >= params.q_heads;
  let h = select(rowi % heads, rowi % heads - params.q_heads, store);
  let dh = params.dh;
  let kxo = params.k_offset + h * params.k_stride_h;
  let xo = params.x_offset + xrow * params.x_stride_t + select(h * params.q_stride_h, kxo, store);
  var ss = 0.0;
  for (var i = lid; i < dh; i += WG) {
    let v = x[xo + i];
    row[i] = v;
    ss += v * v;
  }
  let scale = 1.0 / sqrt(wg_sum(ss, lid) / f32(dh) + params.eps);
  for (var i = lid; i < dh; i += WG) {
    var g = 0.0;
    if (store) {
      g = wk[i];
    } else {
      g = wq[i];
    }
    row[i] = row[i] * scale * g;
  }
  workgroupBarrier();
  let half = params.n_rot / 2u;
  let p = f32(pos);
  for (var i = lid; i < dh; i += WG) {
    var o = row[i];
    if (i < params.n_rot) {
      let pair = select(i - half, i, i < half);
      let theta = reduce_angle(rope_theta(p, pair));
      let c = cos(theta);
      let s = sin(theta);
      if (i < half) {
        o = row[i] * c - row[i + half] * s;
      } else {
        o = row[pair] * s + row[i] * c;
      }
    }
    outv[i] = o;
  }
  workgroupBarrier();
  if (!store) {
    for (var i = lid; i < dh; i += WG) {
      x[xo + i] = outv[i];
    }
    return;
  }
  let cw = kvo + (pos * params.k_heads + h) * dh / 2u;
  let vo = params.x_offset + params.v_offset + xrow * params.x_stride_t + h * params.k_stride_h;
  for (var i = lid; i < dh / 2u; i += WG) {
    kc[cw + i] = pack2x16float(vec2<f32>(outv[2u * i], outv[2u * i + 1u]));
    vc[cw + i] = pack2x16float(vec2<f32>(x[vo + 2u * i], x[vo + 2u * i + 1u]));
  }
}
