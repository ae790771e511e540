// A tile of the gather table wgsl/moe_gather.wgsl writes (ids[0] tiles, then a word a tile: expert
// | count << 10 | first entry << 16, then the entries): the expert a workgroup computes and its
// slots, read by one invocation and shared uniformly. The gathered products (wgsl/mul_mat.wgsl,
// mul_mat_mma.wgsl, mul_mat_vec.wgsl) include it after declaring `ids`.

var<workgroup> chosen: u32;

struct GatherTile {
  // False past the table's tiles: the workgroup has nothing to compute.
  live: bool,
  expert: u32,
  slots: u32,
  first: u32,
}

fn gather_tile(z: u32, lid: u32) -> GatherTile {
  if (lid == 0u) {
    chosen = select(0xffffffffu, ids[1u + z], z < ids[0]);
  }
  let packed = workgroupUniformLoad(&chosen);
  return GatherTile(packed != 0xffffffffu, packed & 0x3ffu, (packed >> 10u) & 0x3fu, packed >> 16u);
}
