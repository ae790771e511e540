// attention: pass 1 of causal GQA attention (split-K): for up to TQ consecutive tokens, one KV
// head, up to GMAX of its query heads and one block b of positions [b·B, (b+1)·B) ∩ [0, npos),
// each token's block partial m = max s, l = Σ exp(s − m), acc = Σ exp(s − m)·V with
// s = q·K/√dh. Matches engine/reference/gqa_attention.ts once wgsl/attention_combine.wgsl folds
// the blocks.
// Bindings: 0 q: head h of token t at q_offset + t·q_stride_t + h·q_stride_h, f32 | 1 kc, 2 vc: caches
//   (pos, hkv, DH) f16 pairs in u32 from vec4 kv_offset, read as vec4s | 3 part: slot s =
//   (tl·hq + h)·nbs + b holds (m, l) at 2s and acc[DH] at 2·tokens·hq·nbs + s·DH | under MULTI
//   4 seqs: the step's sequence table, 4 u32 an entry (state index, row, tokens, position)
//   | params. Token t = t0 + tl sees 0 ..= pos0 + t; under MULTI token tl is the one token of
//   entry seq0 + tl: its row of q, its position, its caches from vec4 kv_offset + index·kv_stride.
// Dispatch: tiles = ⌈tokens/TQ⌉·hkv·groups·nbs, groups = ⌈(hq/hkv)/GMAX⌉; blocks past the
//   last token's position exit, tokens of a tile that do not reach the block write nothing.
// Batch invariance: blocks are fixed runs of absolute positions, and a token's partial is the
//   same arithmetic over its own q and the cache whichever tokens share its workgroup and
//   whichever TQ runs it: every sum is an explicit fma chain (or plain adds) in a fixed order
//   (dims for a score, rows for l and acc), rows of the block past a token's position are masked
//   out of its scores and add exactly 0, and the max is exact. So a decode step (TQ = 1) and any
//   grouping of tokens into prefill calls give a token the same bits.
// WG = 256. Scores: thread (p, gs) scores position p for heads gs and gs + 4 of every token of
//   the tile, from K and the queries staged KW words at a time (the next chunk fetched into
//   registers while one is scored, the first V rows with the first chunk); weights: a thread
//   per (token, head) finds the max and the sum over the block; V: thread (dp, hq4) sums dims
//   pair dp of heads 4·hq4 .. 4·hq4 + 3 over VR staged rows a round, the next round fetched
//   meanwhile. Nothing is an array indexed by a variable (such arrays live in local
//   memory on the H200's compiler, docs/PERFORMANCE.md).
// Variants: DH (a multiple of 8, ≤ 256), B (64), TQ (tokens a workgroup: 1 for single-token
//   calls, else 8 where the device gives ~42 KB of workgroup memory and the call has 8 tokens or
//   more, 4 where it gives ~25 KB), VR (V rows a round: a power of two, VR·DH/2 ≤ 2048), MULTI
//   (with TQ = 1).

struct Params {
  hq: u32,
  hkv: u32,
  tokens: u32,
  t0: u32,
  pos0: u32,
  nbs: u32,
  q_offset: u32,
  q_stride_t: u32,
  q_stride_h: u32,
  scale: f32,
  kv_offset: u32,
  kv_stride: u32,
  seq0: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
#ifdef MULTI
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;
#else
@group(0) @binding(4) var<uniform> params: Params;
#endif

const WG = 256u;
const GMAX = 8u;
// Words (f16 pairs) of a head's row, and vec4s of them.
const W = DH / 2u;
const W4 = W / 4u;
// K is staged KW words (2·KW dims) of every block row at a time; rows padded to KP words so the
// threads of a warp, one position each, read distinct banks. Queries go with it, 2·KW dims of
// each (token, head) pair as QV vec4s.
const KW = 32u;
const KW4 = KW / 4u;
const KP = KW + 1u;
const QV = KW / 2u;
const KCHUNKS = (W + KW - 1u) / KW;
// Below every finite score; exp(NEG - m) is 0.
const NEG = -3.0e38;
// (token, head) pairs of a tile.
const TG = TQ * GMAX;
// A token's weights, [row][head], padded so that the max and sum threads (one a pair) read
// distinct banks.
const PJ = (B + 1u) * GMAX;

var<workgroup> ks: array<u32, B * KP>;
var<workgroup> qs: array<vec4<f32>, TG * QV>;
var<workgroup> ps: array<vec4<f32>, TQ * PJ / 4u>;
var<workgroup> ms: array<f32, TG>;

// What a workgroup works on: the tile's first token, its live tokens, the block and its heads.
struct Tile {
  tl0: u32,
  live: u32,
  // Positions token tl0 + j sees: npos0 + j.
  npos0: u32,
  p0: u32,
  // Rows of the block the tile's last token sees.
  nr: u32,
  gq: u32,
  h0: u32,
  // Row of q of the tile's first token.
  qrow0: u32,
  // vec4 index of the block's first row of the KV head, and of a row's length.
  kv4: u32,
  row4: u32,
}

// vec4 k (of B·KW4) of K chunk c: row k / KW4; zeros past the rows seen and past DH.
fn k_fetch(t: Tile, k: u32, c: u32) -> vec4<u32> {
  let r = k / KW4;
  let w4 = c * KW4 + k % KW4;
  if (r < t.nr && w4 < W4) {
    return kc[t.kv4 + r * t.row4 + w4];
  }
  return vec4(0u);
}

// vec4 k (of TG·QV) of the queries' chunk c: pair k / QV; zeros for idle pairs and past DH.
fn q_fetch(t: Tile, k: u32, c: u32) -> vec4<f32> {
  let pair = k / QV;
  let j = pair / GMAX;
  let g = pair % GMAX;
  let d = 2u * c * KW + 4u * (k % QV);
  if (k < TG * QV && j < t.live && g < t.gq && d < DH) {
    let a = params.q_offset + (t.qrow0 + j) * params.q_stride_t +
      (t.h0 + g) * params.q_stride_h + d;
    return vec4(q[a], q[a + 1u], q[a + 2u], q[a + 3u]);
  }
  return vec4(0.0);
}

// vec4 k (of VR·W4) of the V rows r0 .. r0 + VR: zeros past the rows seen.
fn v_fetch(t: Tile, k: u32, r0: u32) -> vec4<u32> {
  let r = r0 + k / W4;
  if (k < VR * W4 && r < t.nr) {
    return vc[t.kv4 + r * t.row4 + k % W4];
  }
  return vec4(0u);
}

fn k_stage(k: u32, x: vec4<u32>) {
  let at = (k / KW4) * KP + 4u * (k % KW4);
  ks[at] = x.x;
  ks[at + 1u] = x.y;
  ks[at + 2u] = x.z;
  ks[at + 3u] = x.w;
}

fn v_stage(k: u32, x: vec4<u32>) {
  if (k < VR * W4) {
    ks[4u * k] = x.x;
    ks[4u * k + 1u] = x.y;
    ks[4u * k + 2u] = x.z;
    ks[4u * k + 3u] = x.w;
  }
}

// Scores of pair `pair` (heads gs and gs + 4 of a token) after words 2·w2 and 2·w2 + 1 of the
// chunk: each score's chain runs in word order.
fn score(s: vec2<f32>, pair: u32, w2: u32, ka: vec2<f32>, kb: vec2<f32>) -> vec2<f32> {
  let qa = qs[pair * QV + w2];
  let qb = qs[(pair + 4u) * QV + w2];
  var r = s;
  r.x = fma(qa.x, ka.x, r.x);
  r.x = fma(qa.y, ka.y, r.x);
  r.x = fma(qa.z, kb.x, r.x);
  r.x = fma(qa.w, kb.y, r.x);
  r.y = fma(qb.x, ka.x, r.y);
  r.y = fma(qb.y, ka.y, r.y);
  r.y = fma(qb.z, kb.x, r.y);
  r.y = fma(qb.w, kb.y, r.y);
  return r;
}

fn ps_set(i: u32, x: f32) {
  ps[i / 4u][i % 4u] = x;
}

fn ps_get(i: u32) -> f32 {
  return ps[i / 4u][i % 4u];
}

// Token j's scores at position p (heads gs, gs + 4) into ps: masked to NEG past its position.
fn scores_out(t: Tile, j: u32, p: u32, gs: u32, s: vec2<f32>) {
  let nj = min(B, max(t.npos0 + j, t.p0) - t.p0);
  ps_set(j * PJ + p * GMAX + gs, select(NEG, s.x * params.scale, p < nj && gs < t.gq));
  ps_set(j * PJ + p * GMAX + gs + 4u, select(NEG, s.y * params.scale, p < nj && gs + 4u < t.gq));
}

// Token j's weights exp(s − m) at position p into ps: 0 past its position.
fn weights_out(t: Tile, j: u32, p: u32, gs: u32, s: vec2<f32>) {
  let nj = min(B, max(t.npos0 + j, t.p0) - t.p0);
  let ma = ms[j * GMAX + gs];
  let mb = ms[j * GMAX + gs + 4u];
  ps_set(
    j * PJ + p * GMAX + gs,
    select(0.0, exp(fma(s.x, params.scale, -ma)), p < nj && gs < t.gq),
  );
  ps_set(
    j * PJ + p * GMAX + gs + 4u,
    select(0.0, exp(fma(s.y, params.scale, -mb)), p < nj && gs + 4u < t.gq),
  );
}

// Token j's weights of the 4 heads at vec4 `at` of its block times the dims pair's values v,
// into its sums ax (x halves) and ay (y halves).
fn acc(
  ax: ptr<function, vec4<f32>>,
  ay: ptr<function, vec4<f32>>,
  j: u32,
  at: u32,
  v: vec2<f32>,
) {
  let w = ps[j * (PJ / 4u) + at];
  *ax = fma(w, vec4(v.x), *ax);
  *ay = fma(w, vec4(v.y), *ay);
}

// Token j's partial sums of dims pair dp of heads 4·hq4 .. 4·hq4 + 3 (x and y halves) into part.
fn acc_out(t: Tile, j: u32, b: u32, dp: u32, hq4: u32, ax: vec4<f32>, ay: vec4<f32>) {
  // A token whose positions end before the block has no partial here.
  if (j >= t.live || t.p0 >= t.npos0 + j) {
    return;
  }
  let slot = ((t.tl0 + j) * params.hq + t.h0) * params.nbs + b;
  let acc0 = 2u * params.tokens * params.hq * params.nbs;
  for (var h = 0u; h < 4u; h++) {
    let g = 4u * hq4 + h;
    if (g < t.gq) {
      let o = acc0 + (slot + g * params.nbs) * DH + 2u * dp;
      part[o] = ax[h];
      part[o + 1u] = ay[h];
    }
  }
}

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
  var t: Tile;
  t.tl0 = (i / (params.nbs * groups * params.hkv)) * TQ;
  t.live = min(TQ, params.tokens - t.tl0);
#ifdef MULTI
  let e = 4u * (params.seq0 + t.tl0);
  t.qrow0 = seqs[e + 1u];
  t.npos0 = seqs[e + 3u] + 1u;
  let kv0 = params.kv_offset + seqs[e] * params.kv_stride;
#else
  t.qrow0 = params.t0 + t.tl0;
  t.npos0 = params.pos0 + params.t0 + t.tl0 + 1u;
  let kv0 = params.kv_offset;
#endif
  t.p0 = b * B;
  if (t.p0 >= t.npos0 + t.live - 1u) {
    return;
  }
  t.nr = min(B, t.npos0 + t.live - 1u - t.p0);
  t.gq = min(GMAX, G - hg * GMAX);
  t.h0 = kvh * G + hg * GMAX;
  t.row4 = params.hkv * W4;
  t.kv4 = kv0 + t.p0 * t.row4 + kvh * W4;

  // Chunk c of K and of the queries is fetched into registers while chunk c − 1 is scored, and
  // the first V rows while the scores are computed. Eight tokens' queries take four vec4s a
  // thread (qc and qd), fewer take two.
  var ka = k_fetch(t, lid, 0u);
  var kb = k_fetch(t, lid + WG, 0u);
  var qa = q_fetch(t, lid, 0u);
  var qb = q_fetch(t, lid + WG, 0u);
  var qc = vec4(0.0);
  var qd = vec4(0.0);
  if (TQ > 4u) {
    qc = q_fetch(t, lid + 2u * WG, 0u);
    qd = q_fetch(t, lid + 3u * WG, 0u);
  }
  var va = v_fetch(t, lid, 0u);
  var vb = v_fetch(t, lid + WG, 0u);

  let p = lid % B;
  let gs = lid / B;
  // Scores of tokens 0..7 of the tile, heads gs and gs + 4.
  var s0 = vec2(0.0);
  var s1 = vec2(0.0);
  var s2 = vec2(0.0);
  var s3 = vec2(0.0);
  var s4 = vec2(0.0);
  var s5 = vec2(0.0);
  var s6 = vec2(0.0);
  var s7 = vec2(0.0);
  for (var c = 0u; c < KCHUNKS; c++) {
    k_stage(lid, ka);
    k_stage(lid + WG, kb);
    if (lid < TG * QV) {
      qs[lid] = qa;
    }
    if (lid + WG < TG * QV) {
      qs[lid + WG] = qb;
    }
    if (TQ > 4u) {
      qs[lid + 2u * WG] = qc;
      qs[lid + 3u * WG] = qd;
    }
    workgroupBarrier();
    ka = k_fetch(t, lid, c + 1u);
    kb = k_fetch(t, lid + WG, c + 1u);
    qa = q_fetch(t, lid, c + 1u);
    qb = q_fetch(t, lid + WG, c + 1u);
    if (TQ > 4u) {
      qc = q_fetch(t, lid + 2u * WG, c + 1u);
      qd = q_fetch(t, lid + 3u * WG, c + 1u);
    }
    // Each K word read once for the tile's tokens and heads (words past DH are zeros on both
    // sides and add exactly 0). Every token of the tile is scored, live or not (an idle one's
    // queries are zeros and its results are never written): a test of the live count inside
    // this loop and V's kept the H100's compiler from interleaving the tokens' chains, and cost
    // the kernel 1.41x its time deep in a long prompt (docs/PERFORMANCE-NOTES.md).
    for (var w2 = 0u; w2 < KW / 2u; w2++) {
      let k0 = unpack2x16float(ks[p * KP + 2u * w2]);
      let k1 = unpack2x16float(ks[p * KP + 2u * w2 + 1u]);
      s0 = score(s0, gs, w2, k0, k1);
      if (TQ > 1u) {
        s1 = score(s1, GMAX + gs, w2, k0, k1);
      }
      if (TQ > 2u) {
        s2 = score(s2, 2u * GMAX + gs, w2, k0, k1);
      }
      if (TQ > 3u) {
        s3 = score(s3, 3u * GMAX + gs, w2, k0, k1);
      }
      if (TQ > 4u) {
        s4 = score(s4, 4u * GMAX + gs, w2, k0, k1);
      }
      if (TQ > 5u) {
        s5 = score(s5, 5u * GMAX + gs, w2, k0, k1);
      }
      if (TQ > 6u) {
        s6 = score(s6, 6u * GMAX + gs, w2, k0, k1);
      }
      if (TQ > 7u) {
        s7 = score(s7, 7u * GMAX + gs, w2, k0, k1);
      }
    }
    workgroupBarrier();
  }

  scores_out(t, 0u, p, gs, s0);
  if (TQ > 1u) {
    scores_out(t, 1u, p, gs, s1);
    scores_out(t, 2u, p, gs, s2);
    scores_out(t, 3u, p, gs, s3);
  }
  if (TQ > 4u) {
    scores_out(t, 4u, p, gs, s4);
    scores_out(t, 5u, p, gs, s5);
    scores_out(t, 6u, p, gs, s6);
    scores_out(t, 7u, p, gs, s7);
  }
  workgroupBarrier();
  if (lid < TG) {
    var m = NEG;
    for (var r = 0u; r < B; r++) {
      m = max(m, ps_get((lid / GMAX) * PJ + r * GMAX + lid % GMAX));
    }
    ms[lid] = m;
  }
  workgroupBarrier();
  weights_out(t, 0u, p, gs, s0);
  if (TQ > 1u) {
    weights_out(t, 1u, p, gs, s1);
    weights_out(t, 2u, p, gs, s2);
    weights_out(t, 3u, p, gs, s3);
  }
  if (TQ > 4u) {
    weights_out(t, 4u, p, gs, s4);
    weights_out(t, 5u, p, gs, s5);
    weights_out(t, 6u, p, gs, s6);
    weights_out(t, 7u, p, gs, s7);
  }
  workgroupBarrier();
  // l of pair lid: its weights summed in row order.
  var l = 0.0;
  if (lid < TG) {
    for (var r = 0u; r < B; r++) {
      l += ps_get((lid / GMAX) * PJ + r * GMAX + lid % GMAX);
    }
  }

  // Thread (dp, hq4) sums dims pair dp of heads 4·hq4 .. 4·hq4 + 3 over the rows, in row order,
  // for every token: a{j}x/y hold the pair's x and y halves of the 4 heads. Rows a token does not
  // see have weight 0 (rows past the last seen one are zeros) and add exactly 0.
  let dp = lid % W;
  let hq4 = lid / W;
  let vact = hq4 < 2u;
  var a0x = vec4(0.0);
  var a0y = vec4(0.0);
  var a1x = vec4(0.0);
  var a1y = vec4(0.0);
  var a2x = vec4(0.0);
  var a2y = vec4(0.0);
  var a3x = vec4(0.0);
  var a3y = vec4(0.0);
  var a4x = vec4(0.0);
  var a4y = vec4(0.0);
  var a5x = vec4(0.0);
  var a5y = vec4(0.0);
  var a6x = vec4(0.0);
  var a6y = vec4(0.0);
  var a7x = vec4(0.0);
  var a7y = vec4(0.0);
  for (var r0 = 0u; r0 < t.nr; r0 += VR) {
    v_stage(lid, va);
    v_stage(lid + WG, vb);
    workgroupBarrier();
    va = v_fetch(t, lid, r0 + VR);
    vb = v_fetch(t, lid + WG, r0 + VR);
    if (vact) {
      for (var r = 0u; r < VR; r++) {
        let v = unpack2x16float(ks[r * W + dp]);
        // Weights of the 4 heads at row r0 + r: vec4 (row·GMAX + 4·hq4) / 4 of a token's.
        let at = 2u * (r0 + r) + hq4;
        acc(&a0x, &a0y, 0u, at, v);
        if (TQ > 1u) {
          acc(&a1x, &a1y, 1u, at, v);
        }
        if (TQ > 2u) {
          acc(&a2x, &a2y, 2u, at, v);
        }
        if (TQ > 3u) {
          acc(&a3x, &a3y, 3u, at, v);
        }
        if (TQ > 4u) {
          acc(&a4x, &a4y, 4u, at, v);
        }
        if (TQ > 5u) {
          acc(&a5x, &a5y, 5u, at, v);
        }
        if (TQ > 6u) {
          acc(&a6x, &a6y, 6u, at, v);
        }
        if (TQ > 7u) {
          acc(&a7x, &a7y, 7u, at, v);
        }
      }
    }
    workgroupBarrier();
  }
  if (vact) {
    acc_out(t, 0u, b, dp, hq4, a0x, a0y);
    if (TQ > 1u) {
      acc_out(t, 1u, b, dp, hq4, a1x, a1y);
      acc_out(t, 2u, b, dp, hq4, a2x, a2y);
      acc_out(t, 3u, b, dp, hq4, a3x, a3y);
    }
    if (TQ > 4u) {
      acc_out(t, 4u, b, dp, hq4, a4x, a4y);
      acc_out(t, 5u, b, dp, hq4, a5x, a5y);
      acc_out(t, 6u, b, dp, hq4, a6x, a6y);
      acc_out(t, 7u, b, dp, hq4, a7x, a7y);
    }
  }
  let j = lid / GMAX;
  let g = lid % GMAX;
  if (lid < TG && j < t.live && t.p0 < t.npos0 + j && g < t.gq) {
    let at = 2u * (((t.tl0 + j) * params.hq + t.h0 + g) * params.nbs + b);
    part[at] = ms[lid];
    part[at + 1u] = l;
  }
}
