// reduce: whole-workgroup sum and max of one f32 per invocation, as a tree in workgroup memory.
// Contract: the including shader defines `const WG` (a power of two, the workgroup size) and
// calls these from uniform control flow with its local_invocation_index. Every invocation gets
// the result; the summation order is fixed, so results are deterministic.

var<workgroup> red: array<f32, WG>;

fn wg_sum(v: f32, lid: u32) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red[lid] += red[lid + s];
    }
    workgroupBarrier();
  }
  let total = red[0];
  workgroupBarrier();
  return total;
}

fn wg_max(v: f32, lid: u32) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red[lid] = max(red[lid], red[lid + s]);
    }
    workgroupBarrier();
  }
  let m = red[0];
  workgroupBarrier();
  return m;
}
