// moe_gather: groups the (token, rank) slots of a prefill run by the expert they were routed to,
// in tiles of at most TT slots of one expert, so expert products can share each dequantized
// weight chunk across tokens (mul_mat's GATHERED variant). A counting sort, stable in slot order.
// Matches the routing it reads: every slot s = t·k + i of ids appears in exactly one tile.
// Bindings: 0 ids (slots) u32 expert ids | 1 table (rw) u32: [tile count | tiles (max_tiles) |
//   entries (slots) | scratch: rank (slots) | per block of WG slots, per expert: count, then
//   first entry], a tile = expert | count << 10 | first entry << 16 | 2 params.
// Dispatch: three passes in order: COUNT (blocks), SCAN (1), PLACE (blocks), blocks = ⌈slots / WG⌉;
//   slots ≤ 65535, experts ≤ 1024, tt ≤ 63. WG = 256. Variants: COUNT, SCAN or PLACE.
//
// COUNT: a workgroup a block counts its slots per expert (workgroup atomics: the sum does not
// depend on their order) and gives each slot its rank among the block's earlier slots of the same
// expert. SCAN: one workgroup sums each expert's counts over the blocks, scans them over the
// experts for each expert's first entry and first tile, writes the tiles, and turns each block's
// count into the block's first entry for that expert. PLACE: a slot's entry is its block's first
// entry for its expert plus its rank. The table is the one a serial pass over the slots builds.
// (One workgroup doing all of it block after block took ~420 µs a call for 4096 slots in the
// profile of a 512-token prefill on an H200 under Dawn, 4.3% of its GPU time, more than the router
// product; the blocks now run on as many SMs.)

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

fn entries() -> u32 {
  return 1u + params.max_tiles;
}

fn ranks() -> u32 {
  return entries() + params.slots;
}

// Block b's word for expert e: its count after COUNT, its first entry after SCAN.
fn block_word(b: u32, e: u32) -> u32 {
  return ranks() + params.slots + b * params.experts + e;
}

#ifdef COUNT
var<workgroup> counts: array<atomic<u32>, MAX_E>;
// The experts of the block's slots.
var<workgroup> block: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let b = wid.x;
  for (var e = lid; e < params.experts; e += WG) {
    atomicStore(&counts[e], 0u);
  }
  let s = b * WG + lid;
  let live = s < params.slots;
  var e = MAX_E;
  if (live) {
    e = ids[s];
  }
  block[lid] = e;
  workgroupBarrier();
  if (live) {
    var rank = 0u;
    for (var j = 0u; j < lid; j++) {
      rank += select(0u, 1u, block[j] == e);
    }
    table[ranks() + s] = rank;
    atomicAdd(&counts[e], 1u);
  }
  workgroupBarrier();
  for (var x = lid; x < params.experts; x += WG) {
    table[block_word(b, x)] = atomicLoad(&counts[x]);
  }
}
#endif

#ifdef SCAN
// Consecutive experts per thread.
const PER = MAX_E / WG;
// Inclusive scan of (slots, tiles) over the threads' experts.
var<workgroup> scan: array<vec2<u32>, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
  let tt = params.tt;
  let experts = params.experts;
  let blocks = (params.slots + WG - 1u) / WG;
  var n: array<u32, PER>;
  var mine = vec2<u32>(0u);
  for (var j = 0u; j < PER; j++) {
    let e = lid * PER + j;
    n[j] = 0u;
    if (e < experts) {
      for (var b = 0u; b < blocks; b++) {
        n[j] += table[block_word(b, e)];
      }
    }
    mine += vec2<u32>(n[j], (n[j] + tt - 1u) / tt);
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
    if (e >= experts) {
      break;
    }
    for (var f = 0u; f < n[j]; f += tt) {
      table[1u + at.y] = e | (min(tt, n[j] - f) << 10u) | ((at.x + f) << 16u);
      at.y += 1u;
    }
    // Each block's first entry for e: e's first entry plus the slots of e in earlier blocks.
    var first = at.x;
    for (var b = 0u; b < blocks; b++) {
      let count = table[block_word(b, e)];
      table[block_word(b, e)] = first;
      first += count;
    }
    at.x += n[j];
  }
  if (lid == WG - 1u) {
    table[0] = scan[WG - 1u].y;
  }
}
#endif

#ifdef PLACE
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let s = wid.x * WG + lid;
  if (s < params.slots) {
    table[entries() + table[block_word(wid.x, ids[s])] + table[ranks() + s]] = s;
  }
}
#endif
