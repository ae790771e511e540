// moe_sum: the MoE output added to the residual: x += Σ_i w_i·o_i (in rank order) + g·s, where
// o_i is expert rank i's down projection, w its routing weight, s the shared expert's output and
// g its sigmoid gate. Matches docs/model_arch.md §4.7 steps 5–7 (llama.cpp's summation order).
// Bindings: 0 o (t, k, d) f32 | 1 s (t·d) f32 (a dummy without a shared expert)
//   | 2 weights (t·(k+1) + i; k = shared gate) f32 | 3 x (t·d) f32 | 4 params.
// Dispatch: (tokens·d / WG folded); one thread per value. WG = 64. Variants: none.

struct Params {
  d: u32,
  k: u32,
  tokens: u32,
  shared_expert: u32,
}

@group(0) @binding(0) var<storage, read> o: array<f32>;
@group(0) @binding(1) var<storage, read> s: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG = 64u;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let idx = (wid.x + wid.y * nwg.x) * WG + lid;
  if (idx >= params.tokens * params.d) {
    return;
  }
  let t = idx / params.d;
  let c = idx % params.d;
  let k = params.k;
  let wo = t * (k + 1u);
  // Explicit fma, as mul_mat's SUM variant folds a decode step's experts: the same bits.
  var acc = o[(t * k) * params.d + c] * weights[wo];
  for (var i = 1u; i < k; i++) {
    acc = fma(o[(t * k + i) * params.d + c], weights[wo + i], acc);
  }
  if (params.shared_expert == 1u) {
    acc = fma(s[idx], weights[wo + k], acc);
  }
  x[idx] = x[idx] + acc;
}
