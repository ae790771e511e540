// argmax: the greedy id of each row of logits, ties to the lower id (so split and unsplit runs
// agree byte for byte). Matches engine/reference/logits.ts argmaxTopK's `argmax`.
// Bindings: 0 src: row r at offset + r·stride, n values f32 | 1 out (out_offset + r) u32
//   | 2 params.
// Dispatch: (rows); one workgroup per row. WG = 256. Variants: none.

struct Params {
  n: u32,
  rows: u32,
  stride: u32,
  offset: u32,
  out_offset: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG = 256u;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let r = wid.x;
  let base = params.offset + r * params.stride;
  var bv = -0x1.fffffep+127f;
  var bi = 0xffffffffu;
  for (var i = lid; i < params.n; i += WG) {
    let v = src[base + i];
    if (v > bv || bi == 0xffffffffu) {
      bv = v;
      bi = i;
    }
  }
  best_v[lid] = bv;
  best_i[lid] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      let ov = best_v[lid + s];
      let oi = best_i[lid + s];
      if (oi != 0xffffffffu && (best_i[lid] == 0xffffffffu || ov > best_v[lid] ||
          (ov == best_v[lid] && oi < best_i[lid]))) {
        best_v[lid] = ov;
        best_i[lid] = oi;
      }
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    out[params.out_offset + r] = best_i[0];
  }
}
