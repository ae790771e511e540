// mul_mat: y[t,i][row] (= or +=) W_e[row] · x[t,i] for every weight type; decode (one token slot
// per workgroup) and prefill (TILED: a tile of BM rows × TT token slots); with ID, e = ids[t, i]
// picks an expert of a stacked tensor, and with GATHERED a tile takes up to TT slots routed to one
// expert (prefill MoE). Matches engine/reference/math.ts matVec over engine/quant/dequant.ts rows.
// Bindings: 0 w: weight bytes of one part (rows of `k` values, quantized) | 1 x (f32)
//   | 2 ids (u32: expert ids (T, ids_stride) under ID, the gather table under GATHERED, a dummy
//   otherwise) | 3 nw (k) f32 RMSNorm weight under NORM | 4 rw routing weights (t·(n_used+1) + i;
//   index n_used = the shared expert's gate) f32 and 5 sh (t·rows + row) the shared expert's
//   output f32 under SUM | 6 y (f32) | 7 params. Bindings a variant does not use get dummies.
// Dispatch: (row_tiles folded to 2-D, z). Decode: WG = 128 threads = 8 rows of LANES threads,
//   z = T·n_used slots under ID, else T tokens. TILED: WG = 2·TT threads, BM = 64 rows a tile,
//   z = token tiles, or the gather table's most tiles under GATHERED (workgroups past its tile
//   count exit).
// Variants: TYPE_<type> (one), TILED with TT (slots a tile), ID, GATHERED (with TILED and ID),
//   X_SWIGLU (x = silu(g)·u with u at g + up_offset), ADD (y += result), SUBGROUPS (decode row sums
//   by subgroup shuffles), IQ4_TABLE_WORKGROUP (dequant.wgsl; not with the 16 KB dense TILED),
//   NORM (decode only: x is the raw residual row and the product uses RMSNorm(x)·nw, the norm
//   computed per workgroup by _include/rms.wgsl exactly as wgsl/rms_norm.wgsl computes it),
//   SUM (decode with ID, one part holding every expert: a workgroup per row of one token sums
//   all its ranks' products as wgsl/moe_sum.wgsl does and adds them into y; grid (rows, 1, T)).
//
// Batch invariance: every variant sums an output in one order, so a token's result does not
// depend on how tokens are grouped into calls. Chunk c (values 32c..32c+31) contributes
// s_c = one fma chain over its 32 products in element order, from 0. Class l < LANES sums its
// chunks c ≡ l (mod LANES) in increasing c, from 0: p_l = ((0 + s_l) + s_{l+16}) + ...; the output
// is ((0 + p_0) + p_1) + ... over the classes that have chunks. Decode gives class l to lane l;
// TILED walks the classes one after another, each thread holding whole outputs. Explicit fma
// leaves the compiler no multiply-add to contract differently in the two shapes.

#ifdef SUBGROUPS
enable subgroups;
#endif

#include "_include/dequant.wgsl"
#ifdef NORM
#include "_include/rms.wgsl"
#endif

struct Params {
  k: u32,
  rows: u32,
  tokens: u32,
  n_used: u32,
  row_base: u32,
  expert_first: u32,
  expert_count: u32,
  x_offset: u32,
  x_stride_t: u32,
  x_stride_i: u32,
  up_offset: u32,
  y_offset: u32,
  y_stride_t: u32,
  y_stride_i: u32,
  ids_stride: u32,
  row_tiles: u32,
  sum_shared: u32,
  eps: f32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read> rw: array<f32>;
@group(0) @binding(5) var<storage, read> sh: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;

// Partial sums (chunk classes) per output.
const LANES = 16u;

#ifdef ID
var<workgroup> chosen: u32;
#endif

fn xval(i: u32) -> f32 {
#ifdef X_SWIGLU
  let g = x[i];
  return g / (1.0 + exp(-g)) * x[i + params.up_offset];
#else
  return x[i];
#endif
}

fn x4(i: u32) -> vec4<f32> {
  return vec4<f32>(xval(i), xval(i + 1u), xval(i + 2u), xval(i + 3u));
}

// Fills the workgroup's IQ4 table (dequant.wgsl) before any dequant32; uniform control flow only.
fn fill_tables(lid: u32) {
#ifdef IQ4_TABLE_WORKGROUP
  if (lid < 16u) {
    iq4_table[lid] = KV_IQ4[lid];
  }
  workgroupBarrier();
#endif
}

fn put(i: u32, v: f32) {
#ifdef ADD
  y[i] += v;
#else
  y[i] = v;
#endif
}

fn row_bytes() -> u32 {
  return (params.k / BLOCK_ELEMS) * BLOCK_BYTES;
}

// The workgroup's row tile: the grid folds tiles over x and y, so indices past params.row_tiles
// exist and their workgroups exit.
fn row_tile(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.x + wid.y * nwg.x;
}

#ifdef TILED
// A tile: BM rows × TT slots, WG = 2·TT threads. One chunk (32 values of k) at a time is staged
// in workgroup memory k-major, as vec4s of 4 consecutive rows or slots: ws[k][row] (each weight
// dequantized once per tile, 8 KB) and xs[k][slot] (128·TT bytes). Thread (rg, tg) = (lid % 8,
// lid / 8) owns rows 4rg..4rg+3 and 32+4rg..32+4rg+3 × slots 4tg..4tg+3: per value of k, three
// 16-byte reads (a warp's rows: 128 contiguous bytes; its 4 slot groups: broadcasts) feed 32 FMAs.
// Threads below BM dequantize a row each; every thread stages 16 values of x, lanes reading 4
// consecutive values of 8 slots. No registers hold the next chunk: several tiles share an SM and
// hide each other's loads. Groups of slots past the tile's count skip the math.
const BM = 64u;
const WG = 2u * TT;
// vec4s of rows, and of slots, per value of k.
const RQ = BM / 4u;
const TQ = TT / 4u;

// [k][vec4 of rows or slots]: indexed by k (a constant in the unrolled loop) and by the thread's
// group (the same at every k), the bounds checks a compiler adds to each read fold or hoist.
var<workgroup> ws: array<array<vec4<f32>, RQ>, 32>;
var<workgroup> xs: array<array<vec4<f32>, TQ>, 32>;

// x and y offsets of the tile's slot `nn`: token base + nn, or gather table entry base + nn.
fn slot_xy(base: u32, nn: u32) -> vec2<u32> {
#ifdef GATHERED
  let slot = ids[1u + params.ids_stride + base + nn];
  let t = slot / params.n_used;
  let i = slot % params.n_used;
#else
  let t = base + nn;
  let i = 0u;
#endif
  return vec2<u32>(
    params.x_offset + t * params.x_stride_t + i * params.x_stride_i,
    params.y_offset + t * params.y_stride_t + i * params.y_stride_i,
  );
}

// Values kl, kl + 4, …, kl + 28 of chunk c of the slot whose x starts at xo, into its xs column.
fn stage_slot(xo: u32, c: u32, kl: u32, slot: u32) {
  for (var kh = 0u; kh < 8u; kh++) {
    let k = 4u * kh + kl;
    xs[k][slot / 4u][slot % 4u] = xval(xo + 32u * c + k);
  }
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let tile = row_tile(wid, nwg);
  if (tile >= params.row_tiles) {
    return;
  }
#ifdef GATHERED
  // wid.z is a tile of the gather table (wgsl/moe_gather.wgsl): expert | count << 10 | first << 16.
  if (lid == 0u) {
    chosen = select(0xffffffffu, ids[1u + wid.z], wid.z < ids[0]);
  }
  let packed = workgroupUniformLoad(&chosen);
  if (packed == 0xffffffffu) {
    return;
  }
  let e = packed & 0x3ffu;
  let n = (packed >> 10u) & 0x3fu;
  let base = packed >> 16u;
  // Only the part holding expert e computes it.
  if (e < params.expert_first || e >= params.expert_first + params.expert_count) {
    return;
  }
  let part_row0 = (e - params.expert_first) * params.rows;
  let y_row0 = 0u;
#else
  let base = wid.z * TT;
  let n = min(TT, params.tokens - base);
  let part_row0 = 0u;
  let y_row0 = params.row_base;
#endif
  fill_tables(lid);
  let row0 = tile * BM;
  let w_live = lid < BM && row0 + lid < params.rows;
  let w_byte = (part_row0 + row0 + lid) * row_bytes();
  // This thread stages values ≡ kl (mod 4) of slots sa and sa + 8.
  let kl = lid % 4u;
  let sa = 16u * (lid / 32u) + (lid % 32u) / 4u;
  let sb = sa + 8u;
  var xa = 0u;
  var xb = 0u;
  if (sa < n) {
    xa = slot_xy(base, sa).x;
  }
  if (sb < n) {
    xb = slot_xy(base, sb).x;
  }
  let rg = lid % 8u;
  let tg = lid / 8u;
  let busy = 4u * tg < n;

  let chunks = params.k / 32u;
  let classes = min(chunks, LANES);
  // total[i], acc[i]: row i (4rg + i, then 32 + 4rg + i − 4) × the thread's 4 slots.
  var total: array<vec4<f32>, 8>;
  var acc: array<vec4<f32>, 8>;
  for (var l = 0u; l < classes; l++) {
    for (var c = l; c < chunks; c += LANES) {
      workgroupBarrier();
      if (w_live) {
        let wv = dequant32(w_byte, c);
        for (var v = 0u; v < 8u; v++) {
          for (var j = 0u; j < 4u; j++) {
            ws[4u * v + j][lid / 4u][lid % 4u] = wv[v][j];
          }
        }
      }
      if (sa < n) {
        stage_slot(xa, c, kl, sa);
      }
      if (sb < n) {
        stage_slot(xb, c, kl, sb);
      }
      workgroupBarrier();
      if (busy) {
        // Set explicitly: a `var` in a loop body has been seen keeping its last value (naga).
        var s: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
          s[i] = vec4<f32>(0.0);
        }
        for (var k = 0u; k < 32u; k++) {
          let a0 = ws[k][rg];
          let a1 = ws[k][8u + rg];
          let b = xs[k][tg];
          s[0] = fma(vec4<f32>(a0.x), b, s[0]);
          s[1] = fma(vec4<f32>(a0.y), b, s[1]);
          s[2] = fma(vec4<f32>(a0.z), b, s[2]);
          s[3] = fma(vec4<f32>(a0.w), b, s[3]);
          s[4] = fma(vec4<f32>(a1.x), b, s[4]);
          s[5] = fma(vec4<f32>(a1.y), b, s[5]);
          s[6] = fma(vec4<f32>(a1.z), b, s[6]);
          s[7] = fma(vec4<f32>(a1.w), b, s[7]);
        }
        for (var i = 0u; i < 8u; i++) {
          acc[i] = acc[i] + s[i];
        }
      }
    }
    for (var i = 0u; i < 8u; i++) {
      total[i] = total[i] + acc[i];
      acc[i] = vec4<f32>(0.0);
    }
  }
  for (var j = 0u; j < 4u; j++) {
    let nn = 4u * tg + j;
    if (nn < n) {
      let yo = slot_xy(base, nn).y + y_row0;
      for (var i = 0u; i < 8u; i++) {
        let r = row0 + 4u * rg + 32u * (i / 4u) + i % 4u;
        if (r < params.rows) {
          put(yo + r, total[i][j]);
        }
      }
    }
  }
}
#else
// Decode: ROWS rows of LANES lanes; lane l takes class l, two of its chunks a round of ROUND
// chunks. Each round stages the x of its chunks in workgroup memory once for all rows (each
// chunk padded to 9 vec4 so the lanes' reads fall in distinct banks); a round's weights and x
// are fetched before its barriers. SUM loops this over the ranks of one token's experts for the
// same rows.
const WG = 128u;
const ROWS = WG / LANES;
const ROUND = 2u * LANES;

var<workgroup> xr: array<vec4<f32>, ROUND * 9u>;
#ifndef SUBGROUPS
var<workgroup> partial: array<f32, WG>;
#endif

// s_c of weights wv against the staged x of round chunk `rc`.
fn chunk_sum(wv: array<vec4<f32>, 8>, rc: u32) -> f32 {
  var s: f32;
  s = 0.0;
  for (var v = 0u; v < 8u; v++) {
    let xa = xr[9u * rc + v];
    s = fma(wv[v].x, xa.x, s);
    s = fma(wv[v].y, xa.y, s);
    s = fma(wv[v].z, xa.z, s);
    s = fma(wv[v].w, xa.w, s);
  }
  return s;
}

// A row's output from its lanes' class partials: ((0 + p_0) + p_1) + ... in class order. Called
// by every invocation (the tree without subgroups needs a barrier).
fn class_total(p: f32, lid: u32, sid: u32, classes: u32) -> f32 {
  let lane = lid % LANES;
  var total = 0.0;
#ifdef SUBGROUPS
  // The row's lanes sit in one subgroup (the device checked that lanes follow
  // local_invocation_index and subgroups have ≥ LANES lanes).
  let first = sid - lane;
  for (var l = 0u; l < classes; l++) {
    total = total + subgroupShuffle(p, first + l);
  }
#else
  workgroupBarrier();
  partial[lid] = p;
  workgroupBarrier();
  // A fixed trip count: Mesa's lavapipe (CI's adapter) leaks ~0.6 MB a dispatch when a loop of
  // data-dependent length follows the last barrier. Same sum, same order.
  for (var l = 0u; l < LANES; l++) {
    if (l < classes) {
      total = total + partial[lid - lane + l];
    }
  }
#endif
  return total;
}

// The staged vec4 v of chunk c, zero past the row; under NORM, (x·scale)·nw as rms_norm writes it.
fn stage_x(xo: u32, chunks: u32, c: u32, v: u32, scale: f32) -> vec4<f32> {
  if (c < chunks) {
    let col = 32u * c + 4u * v;
#ifdef NORM
    let g = vec4<f32>(nw[col], nw[col + 1u], nw[col + 2u], nw[col + 3u]);
    return (x4(xo + col) * scale) * g;
#else
    return x4(xo + col);
#endif
  }
  return vec4<f32>(0.0);
}

// The product of this thread's row (row_byte; `live` if it exists) with x from xo, returned to
// every lane of the row. Called by every invocation: its rounds have barriers.
fn row_product(row_byte: u32, live: bool, xo: u32, lid: u32, sid: u32) -> f32 {
  let lane = lid % LANES;
  let chunks = params.k / 32u;
  let classes = min(chunks, LANES);
  // This thread stages vec4 lid % 8 of round chunks lid / 8 and lid / 8 + LANES.
  let xc = lid / 8u;
  let xv = lid % 8u;
#ifdef NORM
  let scale = rms_scale(xo, params.k, params.eps, lid);
#else
  let scale = 1.0;
#endif
  var p = 0.0;
  for (var c0 = 0u; c0 < chunks; c0 += ROUND) {
    let ca = c0 + lane;
    let cb = ca + LANES;
    var wa: array<vec4<f32>, 8>;
    var wb: array<vec4<f32>, 8>;
    if (live && ca < chunks) {
      wa = dequant32(row_byte, ca);
    }
    if (live && cb < chunks) {
      wb = dequant32(row_byte, cb);
    }
    let xa = stage_x(xo, chunks, c0 + xc, xv, scale);
    let xb = stage_x(xo, chunks, c0 + xc + LANES, xv, scale);
    workgroupBarrier();
    xr[9u * xc + xv] = xa;
    xr[9u * (xc + LANES) + xv] = xb;
    workgroupBarrier();
    if (live && ca < chunks) {
      p = p + chunk_sum(wa, lane);
    }
    if (live && cb < chunks) {
      p = p + chunk_sum(wb, lane + LANES);
    }
  }
  return class_total(p, lid, sid, classes);
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
#ifdef SUBGROUPS
  @builtin(subgroup_invocation_id) sid: u32,
#endif
) {
#ifndef SUBGROUPS
  let sid = 0u;
#endif
  let tile = row_tile(wid, nwg);
  if (tile >= params.row_tiles) {
    return;
  }
  let lane = lid % LANES;
  let r = tile * ROWS + lid / LANES;
  let live = r < params.rows;
  fill_tables(lid);
#ifdef SUM
  // One token (wid.z), every rank i: y += fma chain of w_i·(W_{e_i}·x_i) in rank order, from
  // r_0·w_0, then the shared expert, as wgsl/moe_sum.wgsl adds them.
  let t = wid.z;
  let wo = t * (params.n_used + 1u);
  var acc = 0.0;
  for (var i = 0u; i < params.n_used; i++) {
    if (lid == 0u) {
      chosen = ids[t * params.ids_stride + i];
    }
    let e = workgroupUniformLoad(&chosen);
    let xo = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
    let row_byte = ((e - params.expert_first) * params.rows + r) * row_bytes();
    let total = row_product(row_byte, live, xo, lid, sid);
    if (i == 0u) {
      acc = total * rw[wo];
    } else {
      acc = fma(total, rw[wo + i], acc);
    }
  }
  if (params.sum_shared == 1u) {
    acc = fma(sh[t * params.rows + r], rw[wo + params.n_used], acc);
  }
  if (lane == 0u && live) {
    let yo = params.y_offset + t * params.y_stride_t + r;
    y[yo] = y[yo] + acc;
  }
#else
#ifdef ID
  // Slot wid.z = (token t, expert rank i).
  let t = wid.z / params.n_used;
  let i = wid.z % params.n_used;
  if (lid == 0u) {
    chosen = ids[t * params.ids_stride + i];
  }
  let e = workgroupUniformLoad(&chosen);
  // Only the part holding expert e computes it.
  if (e < params.expert_first || e >= params.expert_first + params.expert_count) {
    return;
  }
  let xo = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
  let yo = params.y_offset + t * params.y_stride_t + i * params.y_stride_i + r;
  let row_in_part = (e - params.expert_first) * params.rows + r;
#else
  let xo = params.x_offset + wid.z * params.x_stride_t;
  let yo = params.y_offset + wid.z * params.y_stride_t + params.row_base + r;
  let row_in_part = r;
#endif
  let total = row_product(row_in_part * row_bytes(), live, xo, lid, sid);
  if (lane == 0u && live) {
    put(yo, total);
  }
#endif
}
#endif
