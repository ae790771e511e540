// gated_delta_net: the DeltaNet recurrence of a run of tokens for one value head per workgroup,
// then the gated output norm: per token, L2-normalise q and k of the paired key head, decay the
// state by exp(g), delta-rule update with beta, read out with q/√dk, y = RMSNorm(o)·w·silu(z).
// Matches engine/reference/norms.ts l2NormHeads, engine/reference/deltanet.ts deltaNetGates and
// deltaNetStep, engine/reference/norms.ts gatedRmsNorm, token by token (f32).
// Bindings: 0 u: conv output of token t at u_offset + t·u_stride_t: [q (nk·dk) | k (nk·dk)
//   | v (nv·dv)] | 1 ba: [b (nv) | a (nv)] at ba_offset + t·ba_stride_t | 2 z: gate of head h at
//   z_offset + t·z_stride_t + h·dv | 3 p: [dt_bias (nv) | ssm_a (nv) | norm weight (dv)] f32
//   | 4 state (nv, dk, dv) f32, S_h[i][j] at state_offset + (h·dk + i)·dv + j | 5 y (y_offset +
//   t·y_stride_t + h·dv + j) | under MULTI 6 seqs: the step's sequence table, 4 u32 an entry
//   (state index, row, tokens, position) | under TRAIL (not with MULTI) 6 trail: the state after
//   each token t, (tokens, nv, dk, dv) f32 from trail_offset, which a rewind copies back | params.
// Dispatch: (nv·DV/COLS); WG = COLS·R threads, thread (c, r) = (col0 + lid mod COLS, lid / COLS)
//   owns rows r·RPT … r·RPT + RPT − 1 of column c of head h, the workgroup's columns col0 …
//   col0 + COLS − 1. NORM_FUSED (COLS = DV: one workgroup a head, a decode step): the same
//   workgroup then normalises. Otherwise a NORM_PASS dispatch follows: (nv, 1, ⌈T/NP⌉), WG = 256.
// Variants: DK, DV (head dims), R (row slices; 4·R divides DK), GS, COLS, NORM_FUSED, NORM_PASS,
//   TRAIL, MULTI (with NORM_FUSED: dispatch (nv, 1, sequences), workgroup z runs table entry seq0 + z:
//   its tokens from its row of u, ba, z and y, its state at index·state_stride; the same bits as
//   that sequence's run alone).
//
// Why split rows: one thread per column walked all DK rows per token from a DK-long register
// array (indexed by a loop variable, so likely in local memory) on only nv workgroups. Here each
// warp loads whole state rows and a thread's serial chain is RPT rows. Columns are independent
// but for the output norm, so a prefill run splits each head's columns over DV/COLS workgroups
// (SMs): a head's every thread issues every token's work, and one SM per head was bound by that
// issue. The token loop is kept lean: per row and token four f32 operations (k·S from the old
// state, decay applied to the sum; the update as one fma; q·S), q and k read as vec4s (every
// lane of a warp the same address), |q|² and |k|² only by the first column's threads. The row
// partials of k·S, |q|² and |k|², then of q·S, are summed over the R slices through workgroup
// memory in slice order: two barriers a token. The token loop leaves each token's o in y; the
// gated norm RMSNorm(o)·w·silu(z) then takes NP tokens a round (|o|² over the columns in groups
// of GS), in the same workgroup or in the NORM_PASS dispatch, with the same code. The next
// token's inputs are fetched while this one computes and its q and k staged in the other half of
// qs/ks. Every token runs the same arithmetic in the same order whatever the run length or the
// column split (explicit fma where a compiler could contract differently), so outputs and state
// are bit-identical however tokens are split into calls.

struct Params {
  nk: u32,
  nv: u32,
  tokens: u32,
  interleave: u32,
  u_offset: u32,
  u_stride_t: u32,
  ba_offset: u32,
  ba_stride_t: u32,
  z_offset: u32,
  z_stride_t: u32,
  y_offset: u32,
  y_stride_t: u32,
  eps: f32,
  state_offset: u32,
  state_stride: u32,
  seq0: u32,
  trail_offset: u32,
}

@group(0) @binding(0) var<storage, read> u: array<f32>;
@group(0) @binding(1) var<storage, read> ba: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
@group(0) @binding(3) var<storage, read> p: array<f32>;
@group(0) @binding(4) var<storage, read_write> state: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
#ifdef MULTI
@group(0) @binding(6) var<storage, read> seqs: array<u32>;
@group(0) @binding(7) var<uniform> params: Params;
#else
#ifdef TRAIL
@group(0) @binding(6) var<storage, read_write> trail: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;
#else
@group(0) @binding(6) var<uniform> params: Params;
#endif
#endif

#ifdef NORM_PASS
const WG = 256u;
#else
const WG = COLS * R;
#endif
const RPT = DK / R;
// vec4s of a thread's rows.
const RQ = RPT / 4u;
const NG = DV / GS;
const QK_PER = (2u * DK + WG - 1u) / WG;
// Tokens a round of the output norm takes: NG threads each.
const NP = WG / NG;

// q and k of token t in half t % 2 (DK/4 vec4s each), as vec4s of 4 consecutive rows.
var<workgroup> qs: array<vec4<f32>, DK / 2u>;
var<workgroup> ks: array<vec4<f32>, DK / 2u>;
// Per-slice partials, [r][c]; the norm partials (|q|², |k|²) are the same for every column.
// After the token loop they hold the |o|² group sums [token][group] of the output norm's rounds.
var<workgroup> part_kv: array<f32, WG>;
var<workgroup> part_o: array<f32, WG>;
var<workgroup> part_qk: array<vec2<f32>, R>;

// The workgroup's run: where its token 0 sits in u, ba, z and y, its state, its tokens.
var<private> uo: u32;
var<private> bao: u32;
var<private> zo: u32;
var<private> yo: u32;
var<private> so: u32;
var<private> ntok: u32;
#ifdef MULTI
var<workgroup> wg_tokens: u32;
#endif

// Sets the run: the params' one sequence, or under MULTI table entry seq0 + z.
fn begin_run(z: u32) {
#ifdef MULTI
  let e = 4u * (params.seq0 + z);
  let row = seqs[e + 1u];
  uo = params.u_offset + row * params.u_stride_t;
  bao = params.ba_offset + row * params.ba_stride_t;
  zo = params.z_offset + row * params.z_stride_t;
  yo = params.y_offset + row * params.y_stride_t;
  so = params.state_offset + seqs[e] * params.state_stride;
  ntok = seqs[e + 2u];
#else
  uo = params.u_offset;
  bao = params.ba_offset;
  zo = params.z_offset;
  yo = params.y_offset;
  so = params.state_offset;
  ntok = params.tokens;
#endif
}

// What one thread reads of token t; loaded a token ahead so the global-memory latency overlaps
// the previous token's arithmetic. qk[n] is element lid + n·WG of [q | k] of the key head.
struct TokenIn {
  qk: array<f32, QK_PER>,
  b: f32,
  a: f32,
  v: f32,
}

fn load_token(t: u32, h: u32, kh: u32, c: u32, lid: u32) -> TokenIn {
  let at = uo + t * params.u_stride_t;
  var x: TokenIn;
  for (var n = 0u; n < QK_PER; n++) {
    let e = lid + n * WG;
    if (e < DK) {
      x.qk[n] = u[at + kh * DK + e];
    } else if (e < 2u * DK) {
      x.qk[n] = u[at + (params.nk + kh) * DK + e - DK];
    }
  }
  x.b = ba[bao + t * params.ba_stride_t + h];
  x.a = ba[bao + t * params.ba_stride_t + params.nv + h];
  x.v = u[at + 2u * params.nk * DK + h * DV + c];
  return x;
}

// Into half `half` (0 or DK values in).
fn store_qk(x: array<f32, QK_PER>, half: u32, lid: u32) {
  for (var n = 0u; n < QK_PER; n++) {
    let e = lid + n * WG;
    if (e < DK) {
      qs[(half + e) / 4u][e % 4u] = x[n];
    } else if (e < 2u * DK) {
      ks[(half + e - DK) / 4u][e % 4u] = x[n];
    }
  }
}

// One round of the gated output norm: y = o · (1/√(mean o² + eps)) · w · silu(z) for tokens tb …
// tb + NP − 1 of head h, o being what the token loop left in y. The group sums go to part_kv, or
// to part_o for odd rounds, so consecutive rounds need one barrier. Called by every invocation.
fn norm_round(h: u32, tb: u32, lid: u32, odd: bool) {
  let tokens = ntok;
  let tl = lid / NG;
  let g = lid % NG;
  var sq = 0.0;
  if (tb + tl < tokens) {
    let ya = yo + (tb + tl) * params.y_stride_t + h * DV + g * GS;
    for (var i = 0u; i < GS; i++) {
      let o = y[ya + i];
      sq = fma(o, o, sq);
    }
  }
  if (odd) {
    part_o[lid] = sq;
  } else {
    part_kv[lid] = sq;
  }
  workgroupBarrier();
  // NP tokens × DV columns: GS values a thread, each summing its token's NG groups in order.
  for (var i = 0u; i < GS; i++) {
    let e = lid + i * WG;
    let t = tb + e / DV;
    let col = e % DV;
    if (t < tokens) {
      var ss = 0.0;
      for (var j = 0u; j < NG; j++) {
        let at = (e / DV) * NG + j;
        ss += select(part_kv[at], part_o[at], odd);
      }
      let yi = yo + t * params.y_stride_t + h * DV + col;
      let zv = z[zo + t * params.z_stride_t + h * DV + col];
      let inv_rms = 1.0 / sqrt(ss / f32(DV) + params.eps);
      y[yi] = y[yi] * inv_rms * p[2u * params.nv + col] * (zv / (1.0 + exp(-zv)));
    }
  }
}

#ifdef NORM_PASS
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  begin_run(0u);
  norm_round(wid.x, wid.z * NP, lid, false);
}
#else
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  begin_run(wid.z);
  let h = wid.x / (DV / COLS);
  let cl = lid % COLS;
  let c = (wid.x % (DV / COLS)) * COLS + cl;
  let r = lid / COLS;
  let nk = params.nk;
  let nv = params.nv;
#ifdef MULTI
  // The loops below hold barriers: their bound must be uniform, which a private variable is not.
  if (lid == 0u) {
    wg_tokens = ntok;
  }
  let tokens = workgroupUniformLoad(&wg_tokens);
#else
  let tokens = params.tokens;
#endif
  // Key head of value head h: repeat-interleave (qwen3next) or tiling (qwen35*) (docs/model_arch.md
  // §4.6.5).
  let kh = select(h % nk, h / (nv / nk), params.interleave == 1u);
  var s: array<f32, RPT>;
  for (var m = 0u; m < RPT; m++) {
    s[m] = state[so + (h * DK + r * RPT + m) * DV + c];
  }
  let dt = p[h];
  let a_log = p[nv + h];
  let out_scale = 1.0 / sqrt(f32(DK));
  var cur: TokenIn;
  if (tokens > 0u) {
    cur = load_token(0u, h, kh, c, lid);
    store_qk(cur.qk, 0u, lid);
  }
  workgroupBarrier();
  for (var t = 0u; t < tokens; t++) {
    // This token's rows of q and k: vec4 `at + j`.
    let at = (t % 2u) * (DK / 4u) + r * RQ;
    var ahead = cur;
    if (t + 1u < tokens) {
      ahead = load_token(t + 1u, h, kh, c, lid);
    }
    let ga = cur.a + dt;
    let beta = 1.0 / (1.0 + exp(-cur.b));
    let decay = exp(select(log(1.0 + exp(ga)), ga, ga > 20.0) * a_log);
    var pkv = 0.0;
    for (var j = 0u; j < RQ; j++) {
      let k4 = ks[at + j];
      pkv = fma(s[4u * j], k4.x, pkv);
      pkv = fma(s[4u * j + 1u], k4.y, pkv);
      pkv = fma(s[4u * j + 2u], k4.z, pkv);
      pkv = fma(s[4u * j + 3u], k4.w, pkv);
    }
    part_kv[lid] = pkv;
    if (cl == 0u) {
      var pqq = 0.0;
      var pkk = 0.0;
      for (var j = 0u; j < RQ; j++) {
        let k4 = ks[at + j];
        let q4 = qs[at + j];
        pkk = fma(k4.x, k4.x, pkk);
        pkk = fma(k4.y, k4.y, pkk);
        pkk = fma(k4.z, k4.z, pkk);
        pkk = fma(k4.w, k4.w, pkk);
        pqq = fma(q4.x, q4.x, pqq);
        pqq = fma(q4.y, q4.y, pqq);
        pqq = fma(q4.z, q4.z, pqq);
        pqq = fma(q4.w, q4.w, pqq);
      }
      part_qk[r] = vec2(pqq, pkk);
    }
    workgroupBarrier();
    var kv = 0.0;
    var qk = vec2(0.0);
    for (var i = 0u; i < R; i++) {
      kv += part_kv[i * COLS + cl];
      qk += part_qk[i];
    }
    // The other half was last read before the barrier above; the next token reads it after the
    // one below.
    if (t + 1u < tokens) {
      store_qk(ahead.qk, DK - (t % 2u) * DK, lid);
    }
    let rq = 1.0 / max(sqrt(qk.x), params.eps);
    let rk = 1.0 / max(sqrt(qk.y), params.eps);
    // (decay·S)·(rk·k) = decay·rk·(S·k); S ← decay·S + (rk·k)·delta.
    let delta = fma(-(decay * kv), rk, cur.v) * beta;
    let d = rk * delta;
    var po = 0.0;
    for (var j = 0u; j < RQ; j++) {
      let k4 = ks[at + j];
      let q4 = qs[at + j];
      s[4u * j] = fma(s[4u * j], decay, k4.x * d);
      s[4u * j + 1u] = fma(s[4u * j + 1u], decay, k4.y * d);
      s[4u * j + 2u] = fma(s[4u * j + 2u], decay, k4.z * d);
      s[4u * j + 3u] = fma(s[4u * j + 3u], decay, k4.w * d);
      po = fma(s[4u * j], q4.x, po);
      po = fma(s[4u * j + 1u], q4.y, po);
      po = fma(s[4u * j + 2u], q4.z, po);
      po = fma(s[4u * j + 3u], q4.w, po);
    }
    part_o[lid] = po;
    workgroupBarrier();
    if (r == 0u) {
      var o = 0.0;
      for (var i = 0u; i < R; i++) {
        o += part_o[i * COLS + cl];
      }
      y[yo + t * params.y_stride_t + h * DV + c] = o * rq * out_scale;
    }
#ifdef TRAIL
    let trail_t = params.trail_offset + t * nv * DK * DV;
    for (var m = 0u; m < RPT; m++) {
      trail[trail_t + (h * DK + r * RPT + m) * DV + c] = s[m];
    }
#endif
    cur = ahead;
  }
  for (var m = 0u; m < RPT; m++) {
    state[so + (h * DK + r * RPT + m) * DV + c] = s[m];
  }
#ifdef NORM_FUSED
  // The o that the loop left in y is read back by other invocations.
  storageBarrier();
  for (var tb = 0u; tb < tokens; tb += NP) {
    norm_round(h, tb, lid, (tb / NP) % 2u == 1u);
  }
#endif
}
#endif
