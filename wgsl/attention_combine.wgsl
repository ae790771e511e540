// attention_combine: pass 2 of causal GQA attention: folds the block partials of
// wgsl/attention.wgsl for one (token, query head), o = Σ_b acc_b·e^(m_b − M) / Σ_b l_b·e^(m_b − M)
// with M = max_b m_b, then the sigmoid output gate o ⊙ sigmoid(gate). Matches
// engine/reference/attention.ts. The token's block count ⌈npos/B⌉ and every summation order
// depend only on its position, so results do not depend on how tokens are grouped into calls.
// Bindings: 0 part: ((tl·hq + h)·nbs + b)·(DH + 2): m, l, acc[DH] | 1 q: gate of head h of token t
//   at t·q_stride_t + h·q_stride_h + gate_offset, f32 | 2 o (t·o_stride_t + h·DH) f32 | 3 params.
// Dispatch: tiles = tokens·hq·⌈DH/DC⌉: one workgroup per (token, head, DC dims). Thread (bl, dl)
//   sums blocks bl, bl + BL, ... of dim dl; the BL lane sums then add in lane order.
// WG = 256, DC = 32 (a warp reads one 128-byte run of a partial), BL = 8.
// Variants: DH (even, ≤ 512), B (positions per block, as in attention.wgsl).

#include "_include/reduce.wgsl"

struct Params {
  hq: u32,
  tokens: u32,
  t0: u32,
  pos0: u32,
  nbs: u32,
  q_stride_t: u32,
  q_stride_h: u32,
  gate_offset: u32,
  o_stride_t: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> o: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;
const DC = 32u;
const BL = WG / DC;
const NEG = -3.0e38;

var<workgroup> lanes: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let chunks = (DH + DC - 1u) / DC;
  let i = wid.x + wid.y * nwg.x;
  if (i >= params.tokens * params.hq * chunks) {
    return;
  }
  let th = i / chunks;
  let tl = th / params.hq;
  let h = th % params.hq;
  let t = params.t0 + tl;
  let nb = (params.pos0 + t + B) / B;
  let at = th * params.nbs * (DH + 2u);

  var mx = NEG;
  for (var b = lid; b < nb; b += WG) {
    mx = max(mx, part[at + b * (DH + 2u)]);
  }
  let m = wg_max(mx, lid);
  var ls = 0.0;
  for (var b = lid; b < nb; b += WG) {
    let pb = at + b * (DH + 2u);
    ls += part[pb + 1u] * exp(part[pb] - m);
  }
  let l = wg_sum(ls, lid);

  let dl = lid % DC;
  let bl = lid / DC;
  let d = (i % chunks) * DC + dl;
  var a = 0.0;
  if (d < DH) {
    for (var b = bl; b < nb; b += BL) {
      let pb = at + b * (DH + 2u);
      a += part[pb + 2u + d] * exp(part[pb] - m);
    }
  }
  lanes[lid] = a;
  workgroupBarrier();
  if (bl == 0u && d < DH) {
    var sum = 0.0;
    for (var k = 0u; k < BL; k++) {
      sum += lanes[k * DC + dl];
    }
    let g = q[t * params.q_stride_t + h * params.q_stride_h + params.gate_offset + d];
    o[t * params.o_stride_t + h * DH + d] = sum / l / (1.0 + exp(-g));
  }
}
