// sample: a sampled id from one row's top-k candidates in integer arithmetic, written where the
// next step embeds it (Stage.decodeFused), over the argmax's greedy id. Matches engine/sampler.ts,
// so it is the id lib/sampling/sample.ts draws from the same candidates and draw, bit for bit.
// Bindings: 0 top: the row's (f32 bits, id) pairs from top_offset, descending (topk.wgsl), the
//   candidates first and missing entries (id NONE) after them | 1 draws: samplerWords's
//   SAMPLER_WORDS words from draws_offset (pairs asked, top-k, scale, cap, top_p, min_p,
//   min_keep), then a u32 draw a step | 2 out: the id at out_offset | 3 params.
// Dispatch: 1 workgroup. WG = 256: its threads weigh the candidates, thread 0 cuts and draws.
// Variants: none.

struct Params {
  top_offset: u32,
  draws_offset: u32,
  draw: u32,
  out_offset: u32,
}

@group(0) @binding(0) var<storage, read> top: array<u32>;
@group(0) @binding(1) var<storage, read> draws: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;
const MAXK = 1024u;
const SAMPLER_WORDS = 7u;
const LOGIT_LIMIT = 1073741824.0;
// 31 · 4096: an exponent from here on weighs 0.
const EXPONENT_LIMIT = 126976u;
const NO_CUT = 0xffffffffu;
const NONE = 0xffffffffu;

// round(2^15 · 2^(−j/64)) and round(2^16 · 2^(−j/4096)): engine/sampler.ts EXP2_HI, EXP2_LO.
const EXP2_HI = array<u32, 64>(
  32768u, 32415u, 32066u, 31720u, 31379u, 31041u, 30706u, 30376u,
  30048u, 29725u, 29405u, 29088u, 28774u, 28464u, 28158u, 27855u,
  27554u, 27258u, 26964u, 26674u, 26386u, 26102u, 25821u, 25543u,
  25268u, 24995u, 24726u, 24460u, 24196u, 23936u, 23678u, 23423u,
  23170u, 22921u, 22674u, 22430u, 22188u, 21949u, 21713u, 21479u,
  21247u, 21019u, 20792u, 20568u, 20347u, 20127u, 19911u, 19696u,
  19484u, 19274u, 19066u, 18861u, 18658u, 18457u, 18258u, 18061u,
  17867u, 17674u, 17484u, 17296u, 17109u, 16925u, 16743u, 16562u,
);
const EXP2_LO = array<u32, 64>(
  65536u, 65525u, 65514u, 65503u, 65492u, 65481u, 65469u, 65458u,
  65447u, 65436u, 65425u, 65414u, 65403u, 65392u, 65381u, 65370u,
  65359u, 65348u, 65337u, 65326u, 65315u, 65304u, 65292u, 65281u,
  65270u, 65259u, 65248u, 65237u, 65226u, 65215u, 65204u, 65193u,
  65182u, 65171u, 65160u, 65149u, 65138u, 65127u, 65116u, 65105u,
  65094u, 65083u, 65072u, 65061u, 65050u, 65039u, 65028u, 65017u,
  65006u, 64995u, 64984u, 64973u, 64962u, 64951u, 64940u, 64929u,
  64918u, 64907u, 64896u, 64885u, 64874u, 64863u, 64852u, 64841u,
);

var<workgroup> weights: array<u32, MAXK>;

// floor(a · b / 2^32) from 16-bit pieces (engine/sampler.ts mulHi).
fn mul_hi(a: u32, b: u32) -> u32 {
  let a0 = a & 0xffffu;
  let a1 = a >> 16u;
  let b0 = b & 0xffffu;
  let b1 = b >> 16u;
  let p01 = a0 * b1;
  let p10 = a1 * b0;
  let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
}

// A logit in steps of 2^−16, clamped to ±2^30 of them; NaN at the bottom (engine/sampler.ts
// logitSteps). NaN is told by its bits: a float test could be compiled away.
fn logit_steps(bits: u32) -> i32 {
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return -1073741824;
  }
  return i32(clamp(floor(bitcast<f32>(bits) * 65536.0), -LOGIT_LIMIT, LOGIT_LIMIT));
}

// A candidate's weight at logit gap d (engine/sampler.ts candidateWeights).
fn weight(d: u32, scale: u32, cap: u32, shift: u32) -> u32 {
  if (d >= cap) {
    return 0u;
  }
  // t = floor(d · scale / 2^24), from the product's halves (below the cap it is < 2^42).
  let lo = d * scale;
  let t = (mul_hi(d, scale) << 8u) | (lo >> 24u);
  if (t >= EXPONENT_LIMIT) {
    return 0u;
  }
  let n = (t >> 12u) + shift;
  if (n >= 32u) {
    return 0u;
  }
  let f = t & 4095u;
  return (EXP2_HI[f >> 6u] * EXP2_LO[f & 63u]) >> n;
}

var<workgroup> valid: atomic<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
  let asked = min(draws[params.draws_offset], MAXK);
  // The candidates: the pairs before the first missing one (the cut of top-k applied to them).
  if (lid == 0u) {
    atomicStore(&valid, asked);
  }
  workgroupBarrier();
  for (var i = lid; i < asked; i += WG) {
    if (top[params.top_offset + 2u * i + 1u] == NONE) {
      atomicMin(&valid, i);
    }
  }
  workgroupBarrier();
  let found = atomicLoad(&valid);
  let top_k = draws[params.draws_offset + 1u];
  let k = select(found, min(top_k, found), top_k > 0u);
  let scale = draws[params.draws_offset + 2u];
  let cap = draws[params.draws_offset + 3u];
  // 1 + ceil(log2 k): the best weighs 2^(31 − shift), k weights stay below 2^30.
  let shift = 1u + select(32u - countLeadingZeros(k - 1u), 0u, k <= 1u);
  let best = logit_steps(top[params.top_offset]);
  for (var i = lid; i < k; i += WG) {
    let d = u32(best - logit_steps(top[params.top_offset + 2u * i]));
    weights[i] = weight(d, scale, cap, shift);
  }
  workgroupBarrier();
  // No candidate, or every one at the bottom of the range: the argmax's id stays.
  if (lid != 0u || k == 0u || best == -1073741824) {
    return;
  }
  let top_p = draws[params.draws_offset + 4u];
  let min_p = draws[params.draws_offset + 5u];
  let keep = min(draws[params.draws_offset + 6u], k);
  var total = 0u;
  for (var i = 0u; i < k; i++) {
    total += weights[i];
  }
  // Top-p: the shortest prefix whose mass reaches floor(top_p · total / 2^32), at least keep.
  let threshold = mul_hi(top_p, total);
  var n = 0u;
  var mass = 0u;
  loop {
    if (n >= k) {
      break;
    }
    mass += weights[n];
    n++;
    if (top_p != NO_CUT && mass >= threshold && n >= keep) {
      break;
    }
  }
  // Min-p: the tail below min_p · best, at least keep (the best weighs a multiple of 2^16).
  let floor_w = (weights[0] >> 16u) * min_p;
  while (n > keep && weights[n - 1u] < floor_w) {
    n--;
  }
  var kept = 0u;
  for (var i = 0u; i < n; i++) {
    kept += weights[i];
  }
  // The first candidate whose running sum passes floor(u · kept / 2^32).
  let r = mul_hi(draws[params.draws_offset + SAMPLER_WORDS + params.draw], kept);
  var pick = n - 1u;
  mass = 0u;
  for (var i = 0u; i < n; i++) {
    mass += weights[i];
    if (mass > r) {
      pick = i;
      break;
    }
  }
  out[params.out_offset] = top[params.top_offset + 2u * pick + 1u];
}
