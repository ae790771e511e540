// attention_combine: pass 2 of causal GQA attention: folds the block partials of
// wgsl/attention.wgsl for one (token, query head), o = Σ_b acc_b·e^(m_b − M) / Σ_b l_b·e^(m_b − M)
// with M = max_b m_b, then the sigmoid output gate o ⊙ sigmoid(gate). Matches
// engine/reference/gqa_attention.ts. The token's block count ⌈npos/B⌉ and every summation order
// depend only on its position, so results do not depend on how tokens are grouped into calls.
// Bindings: 0 part: slot s = (tl·hq + h)·nbs + b holds (m, l) at 2s and acc[DH] at
//   2·tokens·hq·nbs + s·DH | 1 q: gate of head h of token t at q_offset + t·q_stride_t +
//   h·q_stride_h + gate_offset, f32 | 2 o (o_offset + t·o_stride_t + h·DH) f32 | under MULTI
//   3 seqs: the step's sequence table | params. Token t = t0 + tl at position pos0 + t; under
//   MULTI token tl is the one token of table entry seq0 + tl, at its row and position.
// Dispatch: tiles = tokens·hq·⌈⌈DH/DC⌉/dcs⌉: a workgroup per (token, head, dcs runs of DC dims);
//   thread (bl, dl) sums blocks bl, bl + BL, ... of a dim, 4 loads ahead; lanes add in order.
// WG = 256, DC = 16 (64-byte runs, whole 32-byte sectors), BL = 16. Variants: DH (even, ≤ 512), B,
//   MULTI.

#include "_include/reduce.wgsl"

struct Params {
  hq: u32,
  tokens: u32,
  t0: u32,
  pos0: u32,
  nbs: u32,
  q_offset: u32,
  q_stride_t: u32,
  q_stride_h: u32,
  gate_offset: u32,
  o_offset: u32,
  o_stride_t: u32,
  dcs: u32,
  seq0: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> o: array<f32>;
#ifdef MULTI
@group(0) @binding(3) var<storage, read> seqs: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(3) var<uniform> params: Params;
#endif

const WG = 256u;
const DC = 16u;
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
  let per_th = (chunks + params.dcs - 1u) / params.dcs;
  let i = wid.x + wid.y * nwg.x;
  if (i >= params.tokens * params.hq * per_th) {
    return;
  }
  let th = i / per_th;
  let tl = th / params.hq;
  let h = th % params.hq;
#ifdef MULTI
  let e = 4u * (params.seq0 + tl);
  let t = seqs[e + 1u];
  let pos = seqs[e + 3u];
#else
  let t = params.t0 + tl;
  let pos = params.pos0 + t;
#endif
  let nb = (pos + B) / B;
  let s0 = th * params.nbs;
  let acc0 = 2u * params.tokens * params.hq * params.nbs;

  var mx = NEG;
  for (var b = lid; b < nb; b += WG) {
    mx = max(mx, part[2u * (s0 + b)]);
  }
  let m = wg_max(mx, lid);
  var ls = 0.0;
  for (var b = lid; b < nb; b += WG) {
    ls += part[2u * (s0 + b) + 1u] * exp(part[2u * (s0 + b)] - m);
  }
  let l = wg_sum(ls, lid);

  let dl = lid % DC;
  let bl = lid / DC;
  let c0 = (i % per_th) * params.dcs;
  for (var c = c0; c < min(c0 + params.dcs, chunks); c++) {
    let d = c * DC + dl;
    var a = 0.0;
    if (d < DH) {
      // Four blocks' loads in flight at once; the sum still runs block by block in order.
      var b = bl;
      for (; b + 3u * BL < nb; b += 4u * BL) {
        var x: array<f32, 4>;
        var e: array<f32, 4>;
        for (var u = 0u; u < 4u; u++) {
          x[u] = part[acc0 + (s0 + b + u * BL) * DH + d];
          e[u] = part[2u * (s0 + b + u * BL)];
        }
        for (var u = 0u; u < 4u; u++) {
          a += x[u] * exp(e[u] - m);
        }
      }
      for (; b < nb; b += BL) {
        a += part[acc0 + (s0 + b) * DH + d] * exp(part[2u * (s0 + b)] - m);
      }
    }
    lanes[lid] = a;
    workgroupBarrier();
    if (bl == 0u && d < DH) {
      var sum = 0.0;
      for (var k = 0u; k < BL; k++) {
        sum += lanes[k * DC + dl];
      }
      let gi = params.q_offset + t * params.q_stride_t + h * params.q_stride_h + params.gate_offset;
      let g = q[gi + d];
      o[params.o_offset + t * params.o_stride_t + h * DH + d] = sum / l / (1.0 + exp(-g));
    }
    workgroupBarrier();
  }
}
