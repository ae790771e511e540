// attention: pass 1 of causal GQA attention (split-K): for one token, one KV head, up to GMAX of
// its query heads and one block b of positions [b·B, (b+1)·B) ∩ [0, npos), the block partial
// m = max s, l = Σ exp(s − m), acc = Σ exp(s − m)·V with s = q·K/√dh. Matches
// engine/reference/gqa_attention.ts once wgsl/attention_combine.wgsl folds the blocks.
// Bindings: 0 q: head h of token t at t·q_stride_t + h·q_stride_h, f32 | 1 kc, 2 vc: caches
//   (pos, hkv, DH) f16 pairs in u32 | 3 part: slot s = (tl·hq + h)·nbs + b holds (m, l) at 2s
//   and acc[DH] at 2·tokens·hq·nbs + s·DH | 4 params. Token t = t0 + tl sees 0 ..= pos0 + t.
// Dispatch: tiles = tokens·hkv·groups·nbs, groups = ⌈(hq/hkv)/GMAX⌉; blocks past a token's
//   position exit. Blocks are fixed runs of absolute positions and a partial reads only its
//   token's q and the cache, so results do not depend on how tokens are grouped into calls.
// WG = 256: thread (p, gs) scores position p for heads gs, gs + WG/B, ...; K/V staged coalesced.
// Variants: DH (even, ≤ 512), B (positions per block: 32 or 64, fitting 16 KB of workgroup memory).

struct Params {
  hq: u32,
  hkv: u32,
  tokens: u32,
  t0: u32,
  pos0: u32,
  nbs: u32,
  q_stride_t: u32,
  q_stride_h: u32,
  scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG = 256u;
const GMAX = 8u;
// Heads each scoring thread serves.
const HPT = GMAX * B / WG;
const W = DH / 2u;
// K is staged KW words (2·KW dims) of every block row at a time; rows padded to KP words so the
// threads of a warp, one position each, read distinct banks.
const KW = 32u;
const KP = KW + 1u;
const QC = 2u * KW;
// V rows staged at once in the same workgroup array.
const VR = min(B, B * KP / W);
const JPT = (GMAX * W + WG - 1u) / WG;
// Below every finite score; exp(NEG - m) is 0.
const NEG = -3.0e38;

var<workgroup> ks: array<u32, B * KP>;
var<workgroup> qs: array<f32, GMAX * QC>;
var<workgroup> ps: array<f32, GMAX * B>;
var<workgroup> ms: array<f32, GMAX>;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let G = params.hq / params.hkv;
  let groups = (G + GMAX - 1u) / GMAX;
  let i = wid.x + wid.y * nwg.x;
  if (i >= params.tokens * params.hkv * groups * params.nbs) {
    return;
  }
  let b = i % params.nbs;
  let hg = (i / params.nbs) % groups;
  let kvh = (i / (params.nbs * groups)) % params.hkv;
  let tl = i / (params.nbs * groups * params.hkv);
  let t = params.t0 + tl;
  let npos = params.pos0 + t + 1u;
  let p0 = b * B;
  if (p0 >= npos) {
    return;
  }
  let nr = min(B, npos - p0);
  let gq = min(GMAX, G - hg * GMAX);
  let h0 = kvh * G + hg * GMAX;
  let row = params.hkv * W;
  let kv0 = p0 * row + kvh * W;
  let qt = t * params.q_stride_t;

  let p = lid % B;
  let gs = lid / B;
  var s: array<f32, HPT>;
  for (var c = 0u; c < W; c += KW) {
    for (var k = lid; k < B * KW; k += WG) {
      let r = k / KW;
      let w = k % KW;
      var x = 0u;
      if (r < nr && c + w < W) {
        x = kc[kv0 + r * row + c + w];
      }
      ks[r * KP + w] = x;
    }
    for (var k = lid; k < GMAX * QC; k += WG) {
      let g = k / QC;
      let d = 2u * c + k % QC;
      var x = 0.0;
      if (g < gq && d < DH) {
        x = q[qt + (h0 + g) * params.q_stride_h + d];
      }
      qs[k] = x;
    }
    workgroupBarrier();
    let nw = min(KW, W - c);
    for (var j = 0u; j < HPT; j++) {
      let qg = (gs + j * (WG / B)) * QC;
      var d = s[j];
      for (var w = 0u; w < nw; w++) {
        let k2 = unpack2x16float(ks[p * KP + w]);
        d += qs[qg + 2u * w] * k2.x + qs[qg + 2u * w + 1u] * k2.y;
      }
      s[j] = d;
    }
    workgroupBarrier();
  }
  for (var j = 0u; j < HPT; j++) {
    let g = gs + j * (WG / B);
    ps[g * B + p] = select(NEG, s[j] * params.scale, p < nr && g < gq);
  }
  workgroupBarrier();
  if (lid < GMAX) {
    var m = NEG;
    for (var r = 0u; r < B; r++) {
      m = max(m, ps[lid * B + r]);
    }
    ms[lid] = m;
  }
  workgroupBarrier();
  for (var j = 0u; j < HPT; j++) {
    let g = gs + j * (WG / B);
    ps[g * B + p] = select(0.0, exp(s[j] * params.scale - ms[g]), p < nr && g < gq);
  }
  workgroupBarrier();

  var acc: array<vec2<f32>, JPT>;
  for (var r0 = 0u; r0 < nr; r0 += VR) {
    let n = min(VR, nr - r0);
    for (var k = lid; k < VR * W; k += WG) {
      let r = k / W;
      var x = 0u;
      if (r < n) {
        x = vc[kv0 + (r0 + r) * row + k % W];
      }
      ks[k] = x;
    }
    workgroupBarrier();
    for (var jj = 0u; jj < JPT; jj++) {
      let j = lid + jj * WG;
      let g = j / W;
      if (g < gq) {
        let w = j % W;
        var a = acc[jj];
        for (var r = 0u; r < n; r++) {
          a += ps[g * B + r0 + r] * unpack2x16float(ks[r * W + w]);
        }
        acc[jj] = a;
      }
    }
    workgroupBarrier();
  }
  let slot = (tl * params.hq + h0) * params.nbs + b;
  let acc0 = 2u * params.tokens * params.hq * params.nbs;
  for (var jj = 0u; jj < JPT; jj++) {
    let j = lid + jj * WG;
    let g = j / W;
    if (g < gq) {
      let o = acc0 + (slot + g * params.nbs) * DH + 2u * (j % W);
      part[o] = acc[jj].x;
      part[o + 1u] = acc[jj].y;
    }
  }
  if (lid < gq) {
    var l = 0.0;
    for (var r = 0u; r < B; r++) {
      l += ps[lid * B + r];
    }
    part[2u * (slot + lid * params.nbs)] = ms[lid];
    part[2u * (slot + lid * params.nbs) + 1u] = l;
  }
}
