// mul_mat: y[t,i][row] (= or +=) W_e[row] · x[t,i] for every weight type over a tile of BM rows ×
// TT token slots (prefill); with ID, e picks an expert of a stacked tensor, and a tile takes up to
// TT slots routed to one expert (GATHERED, prefill MoE). Decode products of a few tokens are
// wgsl/mul_mat_vec.wgsl, in the same summation order. Matches engine/reference/math.ts matVec
// over engine/quant/dequant.ts rows.
// Bindings: 0 w: weight bytes of one part (rows of `k` values, quantized) | 1 x (f32)
//   | 2 ids (u32: the gather table under GATHERED, a dummy otherwise) | 3 y (f32) | 4 params.
// Dispatch: (row_tiles folded to 2-D, z). WG = BM·TT/32 threads, z = token tiles, or the gather
//   table's most tiles under GATHERED (workgroups past its tile count exit).
// Variants: TYPE_<type> (one), BM (rows a tile: 64 or 128), TT (slots a tile: 32 or 64), ID with
//   GATHERED, X_SWIGLU (x = silu(g)·u with u at g + up_offset), ADD (y += result),
//   IQ4_TABLE_WORKGROUP (dequant.wgsl; not with the 64 × 64 dense tile: 16 KB, the WebGPU
//   default), PREFETCH (types with dequant.wgsl's load32: the next chunk loads during this one's
//   products), X_PAD (xs rows padded against bank conflicts of the x stores; 1 KB more).
//
// Batch invariance: every variant sums an output in one order, so a token's result does not
// depend on how tokens are grouped into calls. Chunk c (values 32c..32c+31) contributes
// s_c = one fma chain over its 32 products in element order, from 0. Class l < LANES sums its
// chunks c ≡ l (mod LANES) in increasing c, from 0: p_l = ((0 + s_l) + s_{l+16}) + ...; the output
// is ((0 + p_0) + p_1) + ... over the classes that have chunks. Here each thread walks the classes
// one after another holding whole outputs; wgsl/mul_mat_vec.wgsl spreads the chunks over threads
// and folds them in this order. Explicit fma leaves the compiler no multiply-add to contract
// differently in the two.

#include "_include/dequant.wgsl"

#include "_include/mat_params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

// Partial sums (chunk classes) per output.
const LANES = 16u;

#ifdef GATHERED
#include "_include/gather_tile.wgsl"
#endif

// The input value from x (g) and, under X_SWIGLU, its up value u.
fn xmix(g: f32, u: f32) -> f32 {
#ifdef X_SWIGLU
  return g / (1.0 + exp(-g)) * u;
#else
  return g;
#endif
}

fn xval(i: u32) -> f32 {
#ifdef X_SWIGLU
  return xmix(x[i], x[i + params.up_offset]);
#else
  return x[i];
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
  return bytes_of_row(params.k);
}

// The workgroup's row tile: the grid folds tiles over x and y, so indices past params.row_tiles
// exist and their workgroups exit.
fn row_tile(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.x + wid.y * nwg.x;
}

// A tile: BM rows × TT slots, WG = BM·TT/32 threads. One chunk (32 values of k) at a time is
// staged in workgroup memory k-major, as vec4s of 4 consecutive rows or slots: ws[k][row] (each
// weight dequantized once per tile, 128·BM bytes) and xs[k][slot] (128·TT bytes). Thread (rg, tg)
// = (lid % RG, lid / RG) owns rows 4rg..4rg+3 and BM/2+4rg..BM/2+4rg+3 × slots 4tg..4tg+3: per
// value of k, three 16-byte reads (a warp's rows: 128 or 256 contiguous bytes; its slot groups:
// broadcasts) feed 32 FMAs. Threads below BM dequantize a row each (TT ≥ 32 makes WG ≥ BM); every
// thread stages 8·SPT values of x, lanes reading 4 consecutive values of 8 slots. A larger BM reads
// x once for more rows (half the x traffic a weight row at BM = 128). Under PREFETCH registers hold the next chunk's raw weights and
// x values while the tile computes; otherwise only other tiles on the SM hide the loads. Groups
// of slots past the tile's count skip the math.
const WG = BM * TT / 32u;
// vec4s of rows, and of slots, per value of k.
const RQ = BM / 4u;
const TQ = TT / 4u;
// Threads along the rows (each owns 2 vec4s of them), and slots whose x a thread stages (1 or 2).
const RG = BM / 8u;
const SPT = 128u / BM;

// [k][vec4 of rows or slots]: indexed by k (a constant in the unrolled loop) and by the thread's
// group (the same at every k), the bounds checks a compiler adds to each read fold or hoist.
var<workgroup> ws: array<array<vec4<f32>, RQ>, 32>;
#ifdef X_PAD
// X_PAD: two vec4s after each k row, so the x stores of a warp (4 values of k × 8 slots, rows
// 4TQ floats apart) fall in 32 distinct banks instead of 4 to a bank.
const XQ = TQ + 2u;
#else
const XQ = TQ;
#endif
var<workgroup> xs: array<array<vec4<f32>, XQ>, 32>;

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

#ifdef PREFETCH
// PREFETCH: the next chunk's weight words (dequant.wgsl load32) and input values are loaded
// before the tile computes this one and staged after it, so their latency overlaps the
// products (on an H200 under Dawn: 8-27% off the Q8_0 and IQ4_XS tiles, docs/PERFORMANCE.md).
// Nothing here is indexed by a variable: such arrays live in local memory on some GPUs.

// Values kl, kl + 4, …, kl + 28 of a slot's chunk (g0: the first four), and under X_SWIGLU
// their up values.
struct XRaw {
  g0: vec4<f32>,
  g1: vec4<f32>,
#ifdef X_SWIGLU
  u0: vec4<f32>,
  u1: vec4<f32>,
#endif
}

fn x4at(i: u32) -> vec4<f32> {
  return vec4<f32>(x[i], x[i + 4u], x[i + 8u], x[i + 12u]);
}

fn load_x(xo: u32, c: u32, kl: u32) -> XRaw {
  let i = xo + 32u * c + kl;
#ifdef X_SWIGLU
  let u = i + params.up_offset;
  return XRaw(x4at(i), x4at(i + 16u), x4at(u), x4at(u + 16u));
#else
  return XRaw(x4at(i), x4at(i + 16u));
#endif
}

// Values kl + 4kh, …, kl + 4(kh + 3) of a slot (g, u) into its xs column.
fn stage_x4(kh: u32, kl: u32, slot: u32, g: vec4<f32>, u: vec4<f32>) {
  let k = 4u * kh + kl;
  xs[k][slot / 4u][slot % 4u] = xmix(g.x, u.x);
  xs[k + 4u][slot / 4u][slot % 4u] = xmix(g.y, u.y);
  xs[k + 8u][slot / 4u][slot % 4u] = xmix(g.z, u.z);
  xs[k + 12u][slot / 4u][slot % 4u] = xmix(g.w, u.w);
}

fn stage_xraw(p: XRaw, kl: u32, slot: u32) {
#ifdef X_SWIGLU
  stage_x4(0u, kl, slot, p.g0, p.u0);
  stage_x4(4u, kl, slot, p.g1, p.u1);
#else
  stage_x4(0u, kl, slot, p.g0, p.g0);
  stage_x4(4u, kl, slot, p.g1, p.g1);
#endif
}

// Values 4v..4v+3 of row r's chunk into ws.
fn stage_w4(v: u32, r: u32, q: vec4<f32>) {
  let k = 4u * v;
  ws[k][r / 4u][r % 4u] = q.x;
  ws[k + 1u][r / 4u][r % 4u] = q.y;
  ws[k + 2u][r / 4u][r % 4u] = q.z;
  ws[k + 3u][r / 4u][r % 4u] = q.w;
}

fn stage_row(r: u32, wv: array<vec4<f32>, 8>) {
  stage_w4(0u, r, wv[0]);
  stage_w4(1u, r, wv[1]);
  stage_w4(2u, r, wv[2]);
  stage_w4(3u, r, wv[3]);
  stage_w4(4u, r, wv[4]);
  stage_w4(5u, r, wv[5]);
  stage_w4(6u, r, wv[6]);
  stage_w4(7u, r, wv[7]);
}
#endif

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
  let gt = gather_tile(wid.z, lid);
  if (!gt.live) {
    return;
  }
  let e = gt.expert;
  let n = gt.slots;
  let base = gt.first;
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
  fill_iq4_table(lid);
  let row0 = tile * BM;
  let w_live = lid < BM && row0 + lid < params.rows;
  let w_byte = (part_row0 + row0 + lid) * row_bytes();
  // This thread stages values ≡ kl (mod 4) of slot sa and, when SPT = 2, sa + 8 (sb; past every
  // tile's count otherwise, so never staged).
  let kl = lid % 4u;
  let sa = 8u * SPT * (lid / 32u) + (lid % 32u) / 4u;
  let sb = select(TT, sa + 8u, SPT == 2u);
  var xa = 0u;
  var xb = 0u;
  if (sa < n) {
    xa = slot_xy(base, sa).x;
  }
  if (sb < n) {
    xb = slot_xy(base, sb).x;
  }
  let rg = lid % RG;
  let tg = lid / RG;
  let busy = 4u * tg < n;

  let chunks = params.k / 32u;
  let classes = min(chunks, LANES);
  // total[i], acc[i]: row i (4rg + i, then BM/2 + 4rg + i − 4) × the thread's 4 slots.
  var total: array<vec4<f32>, 8>;
  var acc: array<vec4<f32>, 8>;
#ifdef PREFETCH
  // Chunk 0 (class 0's first) before the loop; each step loads the one after its own.
  var wraw: Raw;
  var pa: XRaw;
  var pb: XRaw;
  if (w_live) {
    wraw = load32(w_byte, 0u);
  }
  if (sa < n) {
    pa = load_x(xa, 0u, kl);
  }
  if (sb < n) {
    pb = load_x(xb, 0u, kl);
  }
#endif
  for (var l = 0u; l < classes; l++) {
    for (var c = l; c < chunks; c += LANES) {
      workgroupBarrier();
#ifdef PREFETCH
      if (w_live) {
        stage_row(lid, decode32(wraw));
      }
      if (sa < n) {
        stage_xraw(pa, kl, sa);
      }
      if (sb < n) {
        stage_xraw(pb, kl, sb);
      }
      // The next chunk: this class's next, else the next class's first.
      if (c + LANES < chunks || l + 1u < classes) {
        let cn = select(l + 1u, c + LANES, c + LANES < chunks);
        if (w_live) {
          wraw = load32(w_byte, cn);
        }
        if (sa < n) {
          pa = load_x(xa, cn, kl);
        }
        if (sb < n) {
          pb = load_x(xb, cn, kl);
        }
      }
#else
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
#endif
      workgroupBarrier();
      if (busy) {
        // Set explicitly: a `var` in a loop body has been seen keeping its last value (naga).
        var s: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
          s[i] = vec4<f32>(0.0);
        }
        for (var k = 0u; k < 32u; k++) {
          let a0 = ws[k][rg];
          let a1 = ws[k][RQ / 2u + rg];
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
        let r = row0 + 4u * rg + (BM / 2u) * (i / 4u) + i % 4u;
        if (r < params.rows) {
          put(yo + r, total[i][j]);
        }
      }
    }
  }
}
