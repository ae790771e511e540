// argmax: the greedy id of each row of logits, ties to the lower id (so split and unsplit runs
// agree byte for byte), in two passes: mode 0, a workgroup per (row, group) takes the best of its
// `chunk` values into cand; mode 1, a workgroup per row takes the best of the row's groups.
// Comparisons only, so any grouping gives the same id. Matches engine/reference/logits.ts
// argmaxTopK's `argmax`.
// Bindings: 0 src: row r at offset + r·stride, n values f32 (mode 0) | 1 cand: (value bits, id)
//   pairs at 2·(r·groups + g) (written by mode 0, read by mode 1) | 2 out (out_offset + r) u32
//   (mode 1) | 3 params. Bindings a mode does not use get dummies.
// Dispatch: mode 0 (rows·groups), mode 1 (rows). WG = 256. Variants: none.

struct Params {
  n: u32,
  rows: u32,
  stride: u32,
  offset: u32,
  out_offset: u32,
  groups: u32,
  chunk: u32,
  mode: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cand: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;
const NONE = 0xffffffffu;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// Whether (v, i) beats (bv, bi): larger, or equal with a lower id; NONE loses to anything.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

// The workgroup's best of each thread's (bv, bi), in lane 0's slot.
fn reduce(bv: f32, bi: u32, lid: u32) {
  best_v[lid] = bv;
  best_i[lid] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s && beats(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
      best_v[lid] = best_v[lid + s];
      best_i[lid] = best_i[lid + s];
    }
    workgroupBarrier();
  }
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let wg = wid.x + wid.y * nwg.x;
  var bv = -0x1.fffffep+127f;
  var bi = NONE;
  if (params.mode == 0u) {
    if (wg >= params.rows * params.groups) {
      return;
    }
    let r = wg / params.groups;
    let g = wg % params.groups;
    let base = params.offset + r * params.stride;
    let end = min(params.n, (g + 1u) * params.chunk);
    for (var i = g * params.chunk + lid; i < end; i += WG) {
      let v = src[base + i];
      if (beats(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    reduce(bv, bi, lid);
    if (lid == 0u) {
      cand[2u * wg] = bitcast<u32>(best_v[0]);
      cand[2u * wg + 1u] = best_i[0];
    }
    return;
  }
  if (wg >= params.rows) {
    return;
  }
  for (var g = lid; g < params.groups; g += WG) {
    let at = 2u * (wg * params.groups + g);
    let v = bitcast<f32>(cand[at]);
    if (beats(v, cand[at + 1u], bv, bi)) {
      bv = v;
      bi = cand[at + 1u];
    }
  }
  reduce(bv, bi, lid);
  if (lid == 0u) {
    out[params.out_offset + wg] = best_i[0];
  }
}
