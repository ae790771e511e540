// get_rows: y[t] = dequantized row ids[t] of a (quantized) table: the token embedding lookup.
// Matches engine/quant/dequant.ts on the selected row (exact: no arithmetic beyond dequant).
// Bindings: 0 w: table bytes of one part | 1 ids (u32, ids[ids_offset + t]) | 2 y (t·cols) f32
//   | 3 params.
// Dispatch: (chunk tiles folded, tokens); each thread writes one 32-value chunk. Only rows of
//   this part (row_first .. row_first + row_count) are written; other parts write the rest.
// WG = 64. Variants: TYPE_<type>.

#include "_include/dequant.wgsl"

struct Params {
  cols: u32,
  tokens: u32,
  row_first: u32,
  row_count: u32,
  ids_offset: u32,
  chunk_tiles: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 64u;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let tile = wid.x + wid.y * nwg.x;
  let c = tile * WG + lid;
  let t = wid.z;
  let id = ids[params.ids_offset + t];
  if (tile >= params.chunk_tiles || c >= params.cols / 32u || id < params.row_first ||
      id >= params.row_first + params.row_count) {
    return;
  }
  let row_byte = (id - params.row_first) * bytes_of_row(params.cols);
  let v = dequant32(row_byte, c);
  let o = t * params.cols + 32u * c;
  for (var i = 0u; i < 8u; i++) {
    y[o + 4u * i] = v[i].x;
    y[o + 4u * i + 1u] = v[i].y;
    y[o + 4u * i + 2u] = v[i].z;
    y[o + 4u * i + 3u] = v[i].w;
  }
}
