// attention: causal GQA softmax attention of each query head over the f16 KV cache, then the
// sigmoid output gate: o = softmax(q·K/√dh)·V ⊙ sigmoid(gate). Online softmax over tiles of WG
// positions, so any context length fits. Matches engine/reference/attention.ts.
// Bindings: 0 q: query head h of token t at t·q_stride_t + h·q_stride_h (after norm and RoPE),
//   its gate at + gate_offset, f32 | 1 kc, 2 vc: caches (pos, hkv, dh) f16 pairs in u32
//   | 3 o (t·o_stride_t + h·dh) f32 | 4 params.
// Dispatch: (tokens·hq folded); one workgroup per (token, query head). Token t sees positions
//   0 ..= pos0 + t. Each thread scores one position of a tile and owns dims lid + j·WG of o.
// WG = 64; dh ≤ 512 and even. Variants: none.

#include "_include/reduce.wgsl"

struct Params {
  dh: u32,
  hq: u32,
  hkv: u32,
  tokens: u32,
  pos0: u32,
  q_stride_t: u32,
  q_stride_h: u32,
  gate_offset: u32,
  o_stride_t: u32,
  scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG = 64u;
const MAX_DH = 512u;
const DPT = MAX_DH / WG;
// Below every finite score; exp(NEG - m) is 0.
const NEG = -3.0e38;

var<workgroup> qs: array<f32, MAX_DH>;
var<workgroup> pw: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let rowi = wid.x + wid.y * nwg.x;
  if (rowi >= params.tokens * params.hq) {
    return;
  }
  let t = rowi / params.hq;
  let h = rowi % params.hq;
  let dh = params.dh;
  let kvh = h / (params.hq / params.hkv);
  let qo = t * params.q_stride_t + h * params.q_stride_h;
  for (var i = lid; i < dh; i += WG) {
    qs[i] = q[qo + i];
  }
  workgroupBarrier();
  let npos = params.pos0 + t + 1u;
  let row_words = params.hkv * dh / 2u;
  var acc: array<f32, DPT>;
  var m = NEG;
  var l = 0.0;
  for (var tile = 0u; tile < npos; tile += WG) {
    let p = tile + lid;
    var s = NEG;
    if (p < npos) {
      let kw = p * row_words + kvh * dh / 2u;
      var d = 0.0;
      for (var i = 0u; i < dh / 2u; i++) {
        let k2 = unpack2x16float(kc[kw + i]);
        d += qs[2u * i] * k2.x + qs[2u * i + 1u] * k2.y;
      }
      s = d * params.scale;
    }
    let m_new = max(m, wg_max(s, lid));
    var e = 0.0;
    if (p < npos) {
      e = exp(s - m_new);
    }
    pw[lid] = e;
    let corr = exp(m - m_new);
    l = l * corr + wg_sum(e, lid);
    let n = min(WG, npos - tile);
    for (var j = 0u; j < DPT; j++) {
      let d = lid + j * WG;
      if (d < dh) {
        var a = acc[j] * corr;
        for (var r = 0u; r < n; r++) {
          let vw = (tile + r) * row_words + kvh * dh / 2u + d / 2u;
          let v2 = unpack2x16float(vc[vw]);
          a += pw[r] * select(v2.x, v2.y, (d & 1u) == 1u);
        }
        acc[j] = a;
      }
    }
    m = m_new;
    workgroupBarrier();
  }
  for (var j = 0u; j < DPT; j++) {
    let d = lid + j * WG;
    if (d < dh) {
      let g = q[qo + params.gate_offset + d];
      o[t * params.o_stride_t + h * dh + d] = acc[j] / l / (1.0 + exp(-g));
    }
  }
}
