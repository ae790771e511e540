// attention: pass 1 of causal GQA attention (split-K): for up to TQ consecutive tokens, one KV
// head, up to GMAX of its query heads and one block b of positions [b·B, (b+1)·B) ∩ [0, npos),
// each token's block partial m = max s, l = Σ exp(s − m), acc = Σ exp(s − m)·V with
// s = q·K/√dh. Matches engine/reference/gqa_attention.ts once wgsl/attention_combine.wgsl folds
// the blocks.
// Bindings: 0 q: head h of token t at t·q_stride_t + h·q_stride_h, f32 | 1 kc, 2 vc: caches
//   (pos, hkv, DH) f16 pairs in u32 | 3 part: slot s = (tl·hq + h)·nbs + b holds (m, l) at 2s
//   and acc[DH] at 2·tokens·hq·nbs + s·DH | 4 params. Token t = t0 + tl sees 0 ..= pos0 + t.
// Dispatch: tiles = ⌈tokens/TQ⌉·hkv·groups·nbs, groups = ⌈(hq/hkv)/GMAX⌉; blocks past the last
//   token's position exit, tokens of a tile that do not reach the block write nothing. Blocks
//   are fixed runs of absolute positions and a token's partial is the same arithmetic over its
//   own q and the cache whichever tokens share its workgroup (rows of the block past a token's
//   position are masked out of its scores, then add exactly 0 to its sums), and a decode step
//   runs the same code with one token, so results do not depend on how tokens are grouped.
// WG = 256: thread (p, gs) scores position p for heads gs, gs + WG/B, ... of every token of the
//   tile; K and V are staged once, coalesced, for all TQ tokens (prefill reads each block once
//   per TQ tokens instead of per token).
// Variants: DH (even, ≤ 512), B (positions per block: 32 or 64), TQ (tokens a workgroup: 4
//   where the device gives ~25 KB of workgroup memory, else 1).

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
// (token, head) pairs of a tile.
const TG = TQ * GMAX;

var<workgroup> ks: array<u32, B * KP>;
var<workgroup> qs: array<f32, TG * QC>;
var<workgroup> ps: array<f32, TG * B>;
var<workgroup> ms: array<f32, TG>;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let G = params.hq / params.hkv;
  let groups = (G + GMAX - 1u) / GMAX;
  let tiles = (params.tokens + TQ - 1u) / TQ;
  let i = wid.x + wid.y * nwg.x;
  if (i >= tiles * params.hkv * groups * params.nbs) {
    return;
  }
  let b = i % params.nbs;
  let hg = (i / params.nbs) % groups;
  let kvh = (i / (params.nbs * groups)) % params.hkv;
  let tl0 = (i / (params.nbs * groups * params.hkv)) * TQ;
  let live = min(TQ, params.tokens - tl0);
  // Positions token tl0 + j sees: npos0 + j.
  let npos0 = params.pos0 + params.t0 + tl0 + 1u;
  let p0 = b * B;
  if (p0 >= npos0 + live - 1u) {
    return;
  }
  // Rows of the block the tile's last token sees.
  let nr = min(B, npos0 + live - 1u - p0);
  let gq = min(GMAX, G - hg * GMAX);
  let h0 = kvh * G + hg * GMAX;
  let row = params.hkv * W;
  let kv0 = p0 * row + kvh * W;

  let p = lid % B;
  let gs = lid / B;
  // s[j][hh]: token j, head gs + hh·(WG/B).
  var s: array<array<f32, HPT>, TQ>;
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
    for (var k = lid; k < TG * QC; k += WG) {
      let j = k / (GMAX * QC);
      let g = (k / QC) % GMAX;
      let d = 2u * c + k % QC;
      var x = 0.0;
      if (j < live && g < gq && d < DH) {
        x = q[(params.t0 + tl0 + j) * params.q_stride_t + (h0 + g) * params.q_stride_h + d];
      }
      qs[k] = x;
    }
    workgroupBarrier();
    // Each K word read once for the tile's tokens and heads; every score's chain runs in w order.
    let nw = min(KW, W - c);
    for (var w = 0u; w < nw; w++) {
      let k2 = unpack2x16float(ks[p * KP + w]);
      for (var j = 0u; j < TQ; j++) {
        if (j < live) {
          for (var hh = 0u; hh < HPT; hh++) {
            let qg = (j * GMAX + gs + hh * (WG / B)) * QC + 2u * w;
            s[j][hh] += qs[qg] * k2.x + qs[qg + 1u] * k2.y;
          }
        }
      }
    }
    workgroupBarrier();
  }
  for (var j = 0u; j < TQ; j++) {
    // Rows of the block token j sees (0: none, past its position).
    let nj = min(B, max(npos0 + j, p0) - p0);
    for (var hh = 0u; hh < HPT; hh++) {
      let g = gs + hh * (WG / B);
      ps[(j * GMAX + g) * B + p] = select(NEG, s[j][hh] * params.scale, p < nj && g < gq);
    }
  }
  workgroupBarrier();
  if (lid < TG) {
    var m = NEG;
    for (var r = 0u; r < B; r++) {
      m = max(m, ps[lid * B + r]);
    }
    ms[lid] = m;
  }
  workgroupBarrier();
  for (var j = 0u; j < TQ; j++) {
    let nj = min(B, max(npos0 + j, p0) - p0);
    for (var hh = 0u; hh < HPT; hh++) {
      let g = gs + hh * (WG / B);
      let pair = j * GMAX + g;
      ps[pair * B + p] = select(0.0, exp(s[j][hh] * params.scale - ms[pair]), p < nj && g < gq);
    }
  }
  workgroupBarrier();

  // acc[j][jj]: token j, dims pair lid + jj·WG of the tile's heads. Rows a token does not see
  // have weight 0 and add exactly 0.
  var acc: array<array<vec2<f32>, JPT>, TQ>;
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
    // Each V word read once for the tile's tokens; every sum runs in row order.
    for (var jj = 0u; jj < JPT; jj++) {
      let e = lid + jj * WG;
      let g = e / W;
      if (g < gq) {
        for (var r = 0u; r < n; r++) {
          let v = unpack2x16float(ks[r * W + e % W]);
          for (var j = 0u; j < TQ; j++) {
            if (j < live) {
              acc[j][jj] += ps[(j * GMAX + g) * B + r0 + r] * v;
            }
          }
        }
      }
    }
    workgroupBarrier();
  }
  let acc0 = 2u * params.tokens * params.hq * params.nbs;
  for (var j = 0u; j < TQ; j++) {
    // A token whose positions end before the block has no partial here.
    if (j < live && p0 < npos0 + j) {
      let slot = ((tl0 + j) * params.hq + h0) * params.nbs + b;
      for (var jj = 0u; jj < JPT; jj++) {
        let e = lid + jj * WG;
        let g = e / W;
        if (g < gq) {
          let o = acc0 + (slot + g * params.nbs) * DH + 2u * (e % W);
          part[o] = acc[j][jj].x;
          part[o + 1u] = acc[j][jj].y;
        }
      }
      if (lid < gq) {
        var l = 0.0;
        for (var r = 0u; r < B; r++) {
          l += ps[(j * GMAX + lid) * B + r];
        }
        part[2u * (slot + lid * params.nbs)] = ms[j * GMAX + lid];
        part[2u * (slot + lid * params.nbs) + 1u] = l;
      }
    }
  }
}
