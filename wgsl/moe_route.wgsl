// moe_route: the MoE router of each token: softmax over the E router logits, the k most
// probable experts (ties: lower id), their probabilities renormalised by max(Σ, 6.103515625e-5);
// and, when the model has a shared expert, sigmoid of its gate logit (stored after the E).
// Matches engine/reference/ffn.ts moeRoute and docs/model_arch.md §4.7 step 7's gate.
// Bindings: 0 logits: token t's E (+1) logits at t·logits_stride, f32 | 1 ids (t·k + i) u32
//   | 2 weights (t·(k+1) + i; index k = shared gate) f32 | 3 params.
// Dispatch: (tokens); one workgroup per token, a thread ranking experts lid, lid + WG, ...
// WG = 256; E ≤ 1024. Variants: none.

#include "_include/reduce.wgsl"

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
const MAX_E = 1024u;

var<workgroup> probs: array<f32, MAX_E>;
var<workgroup> picked: array<f32, 64>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let E = params.e;
  let lo = t * params.logits_stride;
  var m = -3.0e38;
  for (var e = lid; e < E; e += WG) {
    m = max(m, logits[lo + e]);
  }
  m = wg_max(m, lid);
  var sum = 0.0;
  for (var e = lid; e < E; e += WG) {
    let x = exp(logits[lo + e] - m);
    probs[e] = x;
    sum += x;
  }
  sum = wg_sum(sum, lid);
  for (var e = lid; e < E; e += WG) {
    probs[e] = probs[e] / sum;
  }
  workgroupBarrier();
  // Expert e's rank: how many come before it (higher probability, or equal and a lower id). The
  // k of rank < k are the experts a serial pick of the largest (lower id on ties) would take,
  // in that order; every thread ranks its experts at once.
  for (var e = lid; e < E; e += WG) {
    let pe = probs[e];
    var rank = 0u;
    for (var j = 0u; j < E; j++) {
      let pj = probs[j];
      if (pj > pe || (pj == pe && j < e)) {
        rank++;
      }
    }
    if (rank < params.k) {
      ids[t * params.k + rank] = e;
      picked[rank] = pe;
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    var total = 0.0;
    for (var r = 0u; r < params.k; r++) {
      total += picked[r];
    }
    let norm = max(total, 6.103515625e-5);
    let wo = t * (params.k + 1u);
    for (var r = 0u; r < params.k; r++) {
      weights[wo + r] = picked[r] / norm;
    }
    var gate = 0.0;
    if (params.shared_gate == 1u) {
      gate = 1.0 / (1.0 + exp(-logits[lo + E]));
    }
    weights[wo + params.k] = gate;
  }
}
