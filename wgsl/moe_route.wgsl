// moe_route: the MoE router of each token (_include/route.wgsl: softmax over the E router logits,
// the k most probable experts, their renormalised probabilities); and, when the model has a shared
// expert, sigmoid of its gate logit (stored after the E).
// Matches engine/reference/ffn.ts moeRoute and docs/model_arch.md §4.7 step 7's gate.
// Bindings: 0 logits: token t's E (+1) logits at t·logits_stride, f32 | 1 ids (t·k + i) u32
//   | 2 weights (t·(k+1) + i; index k = shared gate) f32 | 3 params.
// Dispatch: (tokens); one workgroup per token.
// WG = 256; E ≤ 1024, k ≤ 64. Variants: none.

struct Params {
  e: u32,
  k: u32,
  tokens: u32,
  logits_stride: u32,
  shared_gate: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;
const ROUTE_MAX_E = 1024u;

#include "_include/route.wgsl"

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let k = params.k;
  let lo = t * params.logits_stride;
  route_token(lo, params.e, k, lid);
  // Thread r < k writes rank r's expert and weight, thread k the shared gate.
  if (lid < k) {
    ids[t * k + lid] = route_ids[lid];
    weights[t * (k + 1u) + lid] = route_weight(lid, k);
  } else if (lid == k) {
    var gate = 0.0;
    if (params.shared_gate == 1u) {
      gate = route_gate(logits[lo + params.e]);
    }
    weights[t * (k + 1u) + k] = gate;
  }
}
