// moe_route: the MoE router of each token: softmax over the E router logits, the k most
// probable experts (ties: lower id), their probabilities renormalised by max(Σ, 6.103515625e-5);
// and, when the model has a shared expert, sigmoid of its gate logit (stored after the E).
// Matches engine/reference/ffn.ts moeRoute and docs/model_arch.md §4.7 step 7's gate.
// Bindings: 0 logits: token t's E (+1) logits at t·logits_stride, f32 | 1 ids (t·k + i) u32
//   | 2 weights (t·(k+1) + i; index k = shared gate) f32 | 3 params.
// Dispatch: (tokens); one workgroup per token, thread lid holding experts lid + WG·j (j < 4) in
//   registers: one read of the logits, then every expert ranked at once against the
//   probabilities in workgroup memory, four a read; max and sum in two-level reductions.
// WG = 256; E ≤ 1024. Variants: none.

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
// Below every probability: what the slots past E hold, so they never outrank an expert.
const NONE = -1.0;

// Expert e's probability is probs[e / 4][e % 4].
var<workgroup> probs: array<vec4<f32>, MAX_E / 4u>;
var<workgroup> picked: array<f32, 64>;
// The two levels of a reduction: a value per invocation, then a partial per 16.
var<workgroup> red: array<f32, WG>;
var<workgroup> red16: array<f32, 16>;

// The max (or the sum) of every invocation's v, in two levels with two barriers: partial j
// folds v of invocations 16j..16j+15 in order, then each invocation folds the 16 partials in
// order (all get the same bits). Uniform control flow only.
fn reduce(v: f32, lid: u32, is_max: bool) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  if (lid < 16u) {
    var a = red[16u * lid];
    for (var i = 1u; i < 16u; i++) {
      let b = red[16u * lid + i];
      a = select(a + b, max(a, b), is_max);
    }
    red16[lid] = a;
  }
  workgroupBarrier();
  var r = red16[0];
  for (var i = 1u; i < 16u; i++) {
    let b = red16[i];
    r = select(r + b, max(r, b), is_max);
  }
  return r;
}

fn logit(lo: u32, e: u32) -> f32 {
  if (e < params.e) {
    return logits[lo + e];
  }
  return -3.0e38;
}

// How many experts come before probability p of expert e: higher, or equal with a lower id.
fn rank(p: f32, e: u32) -> u32 {
  var n = vec4<u32>(0u);
  let pv = vec4<f32>(p);
  let ev = vec4<u32>(e);
  let quads = (params.e + 3u) / 4u;
  // Four quads a step: the slots past E (up to MAX_E, every one written) hold NONE.
  for (var q = 0u; q < quads; q += 4u) {
    n += beats(probs[q], q, pv, ev);
    n += beats(probs[q + 1u], q + 1u, pv, ev);
    n += beats(probs[q + 2u], q + 2u, pv, ev);
    n += beats(probs[q + 3u], q + 3u, pv, ev);
  }
  return n.x + n.y + n.z + n.w;
}

// Which of quad q's experts (probabilities o) come before probability pv of expert ev.
fn beats(o: vec4<f32>, q: u32, pv: vec4<f32>, ev: vec4<u32>) -> vec4<u32> {
  let id = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
  return select(vec4<u32>(0u), vec4<u32>(1u), (o > pv) | ((o == pv) & (id < ev)));
}

// Expert e (probability p) into its slot if it ranks among the k.
fn pick(t: u32, p: f32, e: u32) {
  if (e < params.e) {
    let r = rank(p, e);
    if (r < params.k) {
      ids[t * params.k + r] = e;
      picked[r] = p;
    }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let E = params.e;
  let lo = t * params.logits_stride;
  let e = vec4<u32>(lid) + vec4<u32>(0u, WG, 2u * WG, 3u * WG);
  let l = vec4<f32>(logit(lo, e.x), logit(lo, e.y), logit(lo, e.z), logit(lo, e.w));
  let m = reduce(max(max(l.x, l.y), max(l.z, l.w)), lid, true);
  let inside = e < vec4<u32>(E);
  let x = select(vec4<f32>(0.0), exp(l - m), inside);
  let sum = reduce(((x.x + x.y) + x.z) + x.w, lid, false);
  let p = select(vec4<f32>(NONE), x / sum, inside);
  // Slot lid + WG·j of probs is vec4 (lid + WG·j) / 4, component lid % 4.
  let c = lid % 4u;
  probs[e.x / 4u][c] = p.x;
  probs[e.y / 4u][c] = p.y;
  probs[e.z / 4u][c] = p.z;
  probs[e.w / 4u][c] = p.w;
  workgroupBarrier();
  pick(t, p.x, e.x);
  pick(t, p.y, e.y);
  pick(t, p.z, e.z);
  pick(t, p.w, e.w);
  workgroupBarrier();
  // Thread r < k writes rank r's weight, thread k the shared gate; each sums the k in rank order.
  if (lid <= params.k) {
    var total = 0.0;
    for (var r = 0u; r < params.k; r++) {
      total += picked[r];
    }
    let wo = t * (params.k + 1u);
    if (lid < params.k) {
      weights[wo + lid] = picked[lid] / max(total, 6.103515625e-5);
    } else {
      var gate = 0.0;
      if (params.shared_gate == 1u) {
        gate = 1.0 / (1.0 + exp(-logits[lo + E]));
      }
      weights[wo + lid] = gate;
    }
  }
}
