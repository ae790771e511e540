// moe_gather: groups the (token, rank) slots of a prefill run by the expert they were routed to,
// in tiles of at most TT slots of one expert, so expert products can share each dequantized
// weight chunk across tokens (mul_mat's GATHERED variant). A counting sort in slot order.
// Matches the routing it reads: every slot s = t·k + i of ids appears in exactly one tile.
// Bindings: 0 ids (slots) u32 expert ids | 1 table (rw) u32: [tile count | tiles (max_tiles) |
//   entries (slots)], a tile = expert | count << 10 | first entry << 16 | 2 params.
// Dispatch: (1); thread 0 sorts (slots ≤ 65535, experts ≤ 1024, tt ≤ 63). WG = 64.
// Variants: none.

struct Params {
  slots: u32,
  experts: u32,
  tt: u32,
  max_tiles: u32,
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> table: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG = 64u;
const MAX_E = 1024u;

var<workgroup> counts: array<u32, MAX_E>;
var<workgroup> cursor: array<u32, MAX_E>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
  for (var e = lid; e < params.experts; e += WG) {
    counts[e] = 0u;
  }
  workgroupBarrier();
  if (lid != 0u) {
    return;
  }
  for (var s = 0u; s < params.slots; s++) {
    counts[ids[s]] += 1u;
  }
  var first = 0u;
  var tiles = 0u;
  for (var e = 0u; e < params.experts; e++) {
    cursor[e] = first;
    for (var f = 0u; f < counts[e]; f += params.tt) {
      table[1u + tiles] = e | (min(params.tt, counts[e] - f) << 10u) | ((first + f) << 16u);
      tiles += 1u;
    }
    first += counts[e];
  }
  table[0] = tiles;
  for (var s = 0u; s < params.slots; s++) {
    let e = ids[s];
    table[1u + params.max_tiles + cursor[e]] = s;
    cursor[e] += 1u;
  }
}
