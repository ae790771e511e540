// moe_gather: groups the (token, rank) slots of a prefill run by the expert they were routed to,
// in tiles of at most TT slots of one expert, so expert products can share each dequantized
// weight chunk across tokens (mul_mat's GATHERED variant). A counting sort, stable in slot order.
// Matches the routing it reads: every slot s = t·k + i of ids appears in exactly one tile.
// Bindings: 0 ids (slots) u32 expert ids | 1 table (rw) u32: [tile count | tiles (max_tiles) |
//   entries (slots)], a tile = expert | count << 10 | first entry << 16 | 2 params.
// Dispatch: (1); slots ≤ 65535, experts ≤ 1024, tt ≤ 63. WG = 256. Variants: none.
//
// One workgroup, all of it busy: the counts by workgroup atomics (their sum does not depend on
// the order), the experts' first entries and first tiles by a scan over the threads, then the
// slots placed WG at a time in slot order: a slot's place is its expert's cursor plus the slots
// of the same expert before it in its block. The table is the one a serial pass over the slots
// builds. (One thread sorting took ~1.3 ms for 4096 slots on an H200, as long as a GEMM.)

struct Params {
  slots: u32,
  experts: u32,
  tt: u32,
  max_tiles: u32,
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> table: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG = 256u;
const MAX_E = 1024u;
// Consecutive experts per thread in the scan.
const PER = MAX_E / WG;

// Slots per expert; then, while placing, the current block's slots per expert.
var<workgroup> counts: array<atomic<u32>, MAX_E>;
// The next entry of each expert.
var<workgroup> cursor: array<u32, MAX_E>;
// Inclusive scan of (slots, tiles) over the threads' experts.
var<workgroup> scan: array<vec2<u32>, WG>;
// The experts of the current block of slots.
var<workgroup> block: array<u32, WG>;

fn clear_counts(lid: u32) {
  for (var e = lid; e < MAX_E; e += WG) {
    atomicStore(&counts[e], 0u);
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
  let slots = params.slots;
  let tt = params.tt;
  clear_counts(lid);
  workgroupBarrier();
  for (var s = lid; s < slots; s += WG) {
    atomicAdd(&counts[ids[s]], 1u);
  }
  workgroupBarrier();
  var mine = vec2<u32>(0u);
  for (var j = 0u; j < PER; j++) {
    let n = atomicLoad(&counts[lid * PER + j]);
    mine += vec2<u32>(n, (n + tt - 1u) / tt);
  }
  scan[lid] = mine;
  workgroupBarrier();
  for (var d = 1u; d < WG; d <<= 1u) {
    var v = scan[lid];
    if (lid >= d) {
      v += scan[lid - d];
    }
    workgroupBarrier();
    scan[lid] = v;
    workgroupBarrier();
  }
  // (first entry, first tile) of this thread's first expert.
  var at = vec2<u32>(0u);
  if (lid > 0u) {
    at = scan[lid - 1u];
  }
  for (var j = 0u; j < PER; j++) {
    let e = lid * PER + j;
    let n = atomicLoad(&counts[e]);
    cursor[e] = at.x;
    for (var f = 0u; f < n; f += tt) {
      table[1u + at.y] = e | (min(tt, n - f) << 10u) | ((at.x + f) << 16u);
      at.y += 1u;
    }
    at.x += n;
  }
  if (lid == WG - 1u) {
    table[0] = scan[WG - 1u].y;
  }
  workgroupBarrier();
  clear_counts(lid);
  workgroupBarrier();
  let entries = 1u + params.max_tiles;
  for (var b0 = 0u; b0 < slots; b0 += WG) {
    let s = b0 + lid;
    let live = s < slots;
    var e = MAX_E;
    if (live) {
      e = ids[s];
    }
    block[lid] = e;
    workgroupBarrier();
    var rank = 0u;
    for (var j = 0u; j < lid; j++) {
      rank += select(0u, 1u, block[j] == e);
    }
    if (live) {
      table[entries + cursor[e] + rank] = s;
      atomicAdd(&counts[e], 1u);
    }
    workgroupBarrier();
    // The block's first slot of each expert moves the cursor past the block's slots.
    if (live && rank == 0u) {
      cursor[e] += atomicLoad(&counts[e]);
      atomicStore(&counts[e], 0u);
    }
    workgroupBarrier();
  }
}
