// topk: the k largest values of a row with their indices, descending (ties: lower index first),
// in two passes: mode 0 takes each group's top k of `chunk` logits, mode 1 merges the groups'
// candidates. Matches engine/reference/logits.ts argmaxTopK's `top`.
// Bindings: 0 src: mode 0 logits at src_offset + i, f32 | 1 cand: mode 1 candidates as
//   (f32 bits, index) u32 pairs | 2 dst: group g's k pairs at 2·(g·k + r) | 3 params.
// Dispatch: (groups); group g covers elements [g·chunk, (g+1)·chunk) of n. Missing entries are
//   (-3.4e38, 0xffffffff). WG = 64; each of the k rounds picks the best element ordered after
//   the previous pick. Variants: none.

struct Params {
  n: u32,
  k: u32,
  chunk: u32,
  src_offset: u32,
  mode: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> cand: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 64u;
const NONE = 0xffffffffu;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// (v, i) comes before (bv, bi) in the order: larger value first, then lower index.
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return bi == NONE || (i != NONE && (v > bv || (v == bv && i < bi)));
}

fn element(e: u32) -> vec2<u32> {
  if (params.mode == 0u) {
    return vec2<u32>(bitcast<u32>(src[params.src_offset + e]), e);
  }
  return vec2<u32>(cand[2u * e], cand[2u * e + 1u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let g = wid.x;
  let start = g * params.chunk;
  let end = min(params.n, start + params.chunk);
  var prev_v = 0x1.fffffep+127f;
  var prev_i = NONE;
  for (var r = 0u; r < params.k; r++) {
    var bv = -0x1.fffffep+127f;
    var bi = NONE;
    for (var e = start + lid; e < end; e += WG) {
      let el = element(e);
      let v = bitcast<f32>(el.x);
      // Only elements strictly after the previous pick are still free.
      let free = r == 0u || (el.y != NONE && before(prev_v, prev_i, v, el.y));
      if (free && before(v, el.y, bv, bi)) {
        bv = v;
        bi = el.y;
      }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
      if (lid < s && before(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
        best_v[lid] = best_v[lid + s];
        best_i[lid] = best_i[lid + s];
      }
      workgroupBarrier();
    }
    prev_v = best_v[0];
    prev_i = best_i[0];
    if (lid == 0u) {
      dst[2u * (g * params.k + r)] = bitcast<u32>(prev_v);
      dst[2u * (g * params.k + r) + 1u] = prev_i;
    }
    workgroupBarrier();
  }
}
