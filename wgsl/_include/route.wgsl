// route: one token's MoE routing in one workgroup: softmax over its E router logits, the k most
// probable experts (ties: lower id), their probabilities renormalised by max(Σ, 6.103515625e-5),
// for wgsl/moe_route.wgsl and the experts' gate|up that routes its own slot (wgsl/mul_mat_vec.wgsl
// ROUTE): both give every token the same bits, whatever their workgroup size.
// Layout: 256 lanes, lane v holding experts v + 256·j (j < 4) in registers; a workgroup of WG
// threads (128 or 256) plays lanes lid and lid + 128. The max and the sum fold lanes 16j..16j+15
// in order into partial j, then the 16 partials in order. Contract: the includer declares
// `var<storage, read> logits: array<f32>`, `const WG` and `const ROUTE_MAX_E` (a multiple of 16,
// ≥ E, ≤ 1024), and calls route_token from uniform control flow.

const ROUTE_LANES = 256u;
// Lanes a thread plays.
const ROUTE_PER = ROUTE_LANES / WG;
// Below every probability: what the slots past E hold, so they never outrank an expert.
const ROUTE_NONE = -1.0;

// Expert e's probability is route_probs[e / 4][e % 4].
var<workgroup> route_probs: array<vec4<f32>, ROUTE_MAX_E / 4u>;
// Rank r's expert and probability.
var<workgroup> route_ids: array<u32, 64>;
var<workgroup> route_picked: array<f32, 64>;
var<workgroup> route_red: array<f32, ROUTE_LANES>;
var<workgroup> route_red16: array<f32, 16>;

// The max (or the sum) of every lane's value (v0: lane lid's, v1: lane lid + 128's), all
// threads getting the same bits.
fn route_reduce(v0: f32, v1: f32, lid: u32, is_max: bool) -> f32 {
  route_red[lid] = v0;
  if (ROUTE_PER > 1u) {
    route_red[lid + WG] = v1;
  }
  workgroupBarrier();
  if (lid < 16u) {
    var a = route_red[16u * lid];
    for (var i = 1u; i < 16u; i++) {
      let b = route_red[16u * lid + i];
      a = select(a + b, max(a, b), is_max);
    }
    route_red16[lid] = a;
  }
  workgroupBarrier();
  var r = route_red16[0];
  for (var i = 1u; i < 16u; i++) {
    let b = route_red16[i];
    r = select(r + b, max(r, b), is_max);
  }
  return r;
}

// Lane v's experts.
fn route_experts(v: u32) -> vec4<u32> {
  return vec4<u32>(v) + vec4<u32>(0u, ROUTE_LANES, 2u * ROUTE_LANES, 3u * ROUTE_LANES);
}

fn route_logit(lo: u32, n: u32, e: u32) -> f32 {
  if (e < n) {
    return logits[lo + e];
  }
  return -3.0e38;
}

fn route_logits(lo: u32, n: u32, e: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(
    route_logit(lo, n, e.x),
    route_logit(lo, n, e.y),
    route_logit(lo, n, e.z),
    route_logit(lo, n, e.w),
  );
}

// How many experts come before probability p of expert e: higher, or equal with a lower id.
fn route_rank(p: f32, e: u32, n: u32) -> u32 {
  var c = vec4<u32>(0u);
  let pv = vec4<f32>(p);
  let ev = vec4<u32>(e);
  let quads = (n + 3u) / 4u;
  // Four quads a step: the slots past E (up to ROUTE_MAX_E, every one written) hold NONE.
  for (var q = 0u; q < quads; q += 4u) {
    c += route_beats(route_probs[q], q, pv, ev);
    c += route_beats(route_probs[q + 1u], q + 1u, pv, ev);
    c += route_beats(route_probs[q + 2u], q + 2u, pv, ev);
    c += route_beats(route_probs[q + 3u], q + 3u, pv, ev);
  }
  return c.x + c.y + c.z + c.w;
}

// Which of quad q's experts (probabilities o) come before probability pv of expert ev.
fn route_beats(o: vec4<f32>, q: u32, pv: vec4<f32>, ev: vec4<u32>) -> vec4<u32> {
  let id = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
  return select(vec4<u32>(0u), vec4<u32>(1u), (o > pv) | ((o == pv) & (id < ev)));
}

// Expert e's probability p into route_probs, where it has a slot.
fn route_store(e: u32, p: f32) {
  if (e < ROUTE_MAX_E) {
    route_probs[e / 4u][e % 4u] = p;
  }
}

fn route_store4(e: vec4<u32>, p: vec4<f32>) {
  route_store(e.x, p.x);
  route_store(e.y, p.y);
  route_store(e.z, p.z);
  route_store(e.w, p.w);
}

// Expert e (probability p) into its rank's slot if it ranks among the k.
fn route_pick(p: f32, e: u32, n: u32, k: u32) {
  if (e < n) {
    let r = route_rank(p, e, n);
    if (r < k) {
      route_ids[r] = e;
      route_picked[r] = p;
    }
  }
}

fn route_pick4(p: vec4<f32>, e: vec4<u32>, n: u32, k: u32) {
  route_pick(p.x, e.x, n, k);
  route_pick(p.y, e.y, n, k);
  route_pick(p.z, e.z, n, k);
  route_pick(p.w, e.w, n, k);
}

fn route_max4(v: vec4<f32>) -> f32 {
  return max(max(v.x, v.y), max(v.z, v.w));
}

fn route_sum4(v: vec4<f32>) -> f32 {
  return ((v.x + v.y) + v.z) + v.w;
}

// The routing of the token whose n logits start at lo: route_ids[r] and route_picked[r] for rank
// r < k, visible to every thread on return.
fn route_token(lo: u32, n: u32, k: u32, lid: u32) {
  let e0 = route_experts(lid);
  let e1 = route_experts(lid + WG);
  let l0 = route_logits(lo, n, e0);
  var l1 = vec4<f32>(-3.0e38);
  if (ROUTE_PER > 1u) {
    l1 = route_logits(lo, n, e1);
  }
  let m = route_reduce(route_max4(l0), route_max4(l1), lid, true);
  let in0 = e0 < vec4<u32>(n);
  let in1 = e1 < vec4<u32>(n);
  let x0 = select(vec4<f32>(0.0), exp(l0 - m), in0);
  let x1 = select(vec4<f32>(0.0), exp(l1 - m), in1);
  let sum = route_reduce(route_sum4(x0), route_sum4(x1), lid, false);
  let p0 = select(vec4<f32>(ROUTE_NONE), x0 / sum, in0);
  let p1 = select(vec4<f32>(ROUTE_NONE), x1 / sum, in1);
  route_store4(e0, p0);
  if (ROUTE_PER > 1u) {
    route_store4(e1, p1);
  }
  workgroupBarrier();
  route_pick4(p0, e0, n, k);
  if (ROUTE_PER > 1u) {
    route_pick4(p1, e1, n, k);
  }
  workgroupBarrier();
}

// Rank r's renormalised weight (r < k): the k probabilities summed in rank order.
fn route_weight(r: u32, k: u32) -> f32 {
  var total = 0.0;
  for (var i = 0u; i < k; i++) {
    total += route_picked[i];
  }
  return route_picked[r] / max(total, 6.103515625e-5);
}

// The shared expert's gate from its logit.
fn route_gate(logit: f32) -> f32 {
  return 1.0 / (1.0 + exp(-logit));
}
