// mul_mat_vec: the decode product y[t,i][row] (= or +=) W_e[row] · x[t,i] for up to a few dozen
// tokens, every weight type; with ID, e = ids[t, i] picks an expert of a stacked tensor. The
// prefill tiles are wgsl/mul_mat.wgsl; both sum each output in the one order written there, so a
// token gets the same bits alone (here) as inside a batch (there). Matches engine/reference/math.ts
// matVec over engine/quant/dequant.ts rows.
// Bindings: 0 w: weight bytes of one part | 1 x (f32) | 2 ids (u32 expert ids (T, ids_stride)
//   under ID, the gather table under GATHERED, a dummy otherwise) | 3 nw (k) f32 RMSNorm weight
//   under NORM, a dummy otherwise | 4 y (f32) | under PAIR_F32: 5 w2 (an F32 matrix of rows2
//   rows) | 6 y2 (f32) | under CONV: 5 cw (channels, kc) f32 | 6 cstate (kc − 1, channels) f32
//   from conv_state_offset | 7 u (channels) f32 | under MOE_SUM: 5 eo (T, sum_k, sum_d) f32
//   expert outputs | 6 ew (T, sum_k + 1) f32 | then params.
// Dispatch: a workgroup takes ROWS = (WG / CU)·RPT rows of TN tokens. Plain: row_tiles ×
//   ⌈T / TN⌉ workgroups folded to 2-D, a row tile's token groups next to each other (so they run
//   together and the later ones read its weights from L2), z = 1; ID: row_tiles folded to 2-D,
//   z = T·n_used (token, rank) slots; GATHERED: z = the gather table's most tiles.
// Work: the products s_c of one chunk (32 values of k) are independent of one another, so the
//   (row, chunk) pairs of a window of WIN chunks are spread freely: thread (cu = lid % CU,
//   g = lid / CU) takes chunks cu, cu + CU, ... of the window for rows g, g + WG/CU, ... (RPT of
//   them), reusing each chunk of x for its RPT rows. The window's s_c land in workgroup memory
//   and are then folded into the class partials in order. With CU = 16 (REG_CLASSES) a thread's
//   chunks are exactly one class, so its partials stay in registers and nothing is folded.
//   Nothing in the loop is an array indexed by a variable (docs/PERFORMANCE.md: such arrays cost
//   the H200 several times the products' time).
// Variants: TYPE_<type>; WG (128 | 256), CU (16 | 32 | 64; 16 requires REG_CLASSES), RPT
//   (1 | 2 | 4); XSTAGE (a window's x, normed, staged once in workgroup memory instead of each
//   thread reading its chunks from x); BURST (2 | 4; REG_CLASSES, TN ≤ 2, no PAIR_F32, types with
//   dequant.wgsl's load32: a thread loads that many of its chunks of every row before multiplying
//   any, the same sums in the same order with that many times the bytes in flight); ID, X_SWIGLU
//   (x = silu(g)·u with u at g + up_offset), ADD (y += result), NORM (x is the raw residual row and the product uses RMSNorm(x)·nw, the scale
//   from _include/rms.wgsl as wgsl/rms_norm.wgsl computes it), IQ4_TABLE_WORKGROUP
//   (dequant.wgsl), SUBGROUPS (with REG_CLASSES: a row's class partials combined by subgroup
//   shuffles in class order), W_VEC4 (F32, Q8_0, Q6_K: w bound as vec4s), PAIR_F32 (a second
//   product y2 = W2·x on the same input in the same dispatch, W2 F32: tiles past row_tiles take
//   its rows, with the same layout and order, so each output has the bits it has alone; the MoE
//   router beside the shared expert's gate|up; not with ID, X_SWIGLU or ADD), CONV (one token:
//   outputs below conv_channels are also the DeltaNet's raw conv inputs; each goes through the
//   causal conv + SiLU into u and shifts its channel's state, as wgsl/ssm_conv.wgsl computes one
//   token), MOE_SUM (y += Σ_i ew_i·eo_i + ew_k·(this product), wgsl/moe_sum.wgsl's sum in its
//   order: the shared expert's down closing a MoE layer; not with ID or ADD). Both epilogues use
//   the same explicit fmas as the kernels they replace, so an output has the same bits either way
//   and a decode step matches a prefill run. TN (1, 2, 4 or 8; above 1 only with REG_CLASSES, not
//   with CONV): a workgroup takes TN tokens, multiplying each weight chunk it loads
//   with every one of them, so a step of several sequences reads the weights ⌈T / TN⌉ times, and
//   each token's sums are the ones it gets alone. Tokens past the step's last repeat its input
//   and write nothing. With TN ≤ 2 a chunk's inputs are held in registers across the thread's
//   rows; X_STREAM (TN ≥ 4, no NORM) holds the thread's rows' chunks instead and reads each
//   token's chunk once for all of them, skipping the blocks of tokens (2 + 2 + 4) none live. WIN (chunks a window covers)
//   shrinks as TN grows, so the staged inputs stay within ~18 KB. GATHERED (with ID): ids is a
//   gather table (wgsl/moe_gather.wgsl) and a workgroup takes the slots of one of its tiles (one
//   expert), TN at a time, as wgsl/mul_mat.wgsl's GATHERED tiles do: each expert's weights are
//   read once for its slots.
// NORM with XSTAGE and k ≤ 32·WIN reads x once: staged raw, its squares summed from workgroup
//   memory (rms_finish: the same order, the same scale), then normed in place.
//
// Summation order (wgsl/mul_mat.wgsl): s_c = one fma chain over chunk c's 32 products in element
// order, from 0; class l < 16 sums its chunks c ≡ l (mod 16) in increasing c, from 0; the output
// is ((0 + p_0) + p_1) + ... over the classes that have chunks.

#ifdef SUBGROUPS
enable subgroups;
#endif

#include "_include/dequant.wgsl"
#ifdef NORM
#include "_include/rms.wgsl"
#endif

#include "_include/mat_params.wgsl"

#ifdef W_VEC4
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(0) var<storage, read> w: array<u32>;
#endif
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#ifdef PAIR_F32
@group(0) @binding(5) var<storage, read> w2: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;
#else
#ifdef CONV
@group(0) @binding(5) var<storage, read> cw: array<f32>;
@group(0) @binding(6) var<storage, read_write> cstate: array<f32>;
@group(0) @binding(7) var<storage, read_write> u: array<f32>;
@group(0) @binding(8) var<uniform> params: Params;
#else
#ifdef MOE_SUM
@group(0) @binding(5) var<storage, read> eo: array<f32>;
@group(0) @binding(6) var<storage, read> ew: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;
#else
@group(0) @binding(5) var<uniform> params: Params;
#endif
#endif
#endif

// Chunk classes (the order's partial sums per output).
const CLASSES = 16u;
// Chunks of each row a thread loads before it multiplies any of them.
#ifdef BURST
const BURST_CHUNKS = BURST;
#else
const BURST_CHUNKS = 1u;
#endif
const GROUPS = WG / CU;
const ROWS = GROUPS * RPT;
// WIN, chunks a window covers, is a define: a multiple of CLASSES and of CU.

// Class partials of the workgroup's rows: pbuf[16·row + l].
var<workgroup> pbuf: array<f32, ROWS * CLASSES>;
#ifndef REG_CLASSES
// A window's chunk products: sbuf[(WIN + 1)·row + chunk] (padded so a row's classes fall in
// distinct banks when folded).
var<workgroup> sbuf: array<f32, ROWS * (WIN + 1u)>;
#endif
// Where token j of the workgroup's inputs starts in xs.
const XB = WIN * 9u;
#ifdef XSTAGE
// A window's x per token, 9 vec4 a chunk (padded so neighbouring chunks fall in distinct banks).
var<workgroup> xs: array<vec4<f32>, XB * TN>;
#endif
#ifdef GATHERED
#include "_include/gather_tile.wgsl"
#else
#ifdef ID
var<workgroup> chosen: u32;
#endif
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

// vec4 v of chunk c's input; under NORM, (x·scale)·nw as rms_norm writes it.
fn input4(xo: u32, c: u32, v: u32, scale: f32) -> vec4<f32> {
  let col = 32u * c + 4u * v;
#ifdef NORM
  let g = vec4<f32>(nw[col], nw[col + 1u], nw[col + 2u], nw[col + 3u]);
  return (x4(xo + col) * scale) * g;
#else
  return x4(xo + col);
#endif
}

#ifdef CONV
// Channel c's conv output from its state (the kc − 1 inputs before, oldest first) and this token's
// input `raw`, then the state shifted by one: wgsl/ssm_conv.wgsl's taps, fmas and SiLU.
fn conv_token(c: u32, raw: f32) {
  let C = params.conv_channels;
  let kc = params.conv_kc;
  let so = params.conv_state_offset;
  var s = 0.0;
  for (var j = 0u; j + 1u < kc; j++) {
    s = fma(cw[c * kc + j], cstate[so + j * C + c], s);
  }
  s = fma(cw[c * kc + kc - 1u], raw, s);
  u[c] = s / (1.0 + exp(-s));
  for (var j = 0u; j + 2u < kc; j++) {
    cstate[so + j * C + c] = cstate[so + (j + 1u) * C + c];
  }
  cstate[so + (kc - 2u) * C + c] = raw;
}
#endif

#ifdef MOE_SUM
// Token t's MoE output at `row`, `own` the shared expert's: wgsl/moe_sum.wgsl's sum.
fn moe_mix(t: u32, row: u32, own: f32) -> f32 {
  let k = params.sum_k;
  let d = params.sum_d;
  let wo = t * (k + 1u);
  var acc = eo[(t * k) * d + row] * ew[wo];
  for (var i = 1u; i < k; i++) {
    acc = fma(eo[(t * k + i) * d + row], ew[wo + i], acc);
  }
  return fma(own, ew[wo + k], acc);
}
#endif

fn put(i: u32, v: f32) {
#ifdef ADD
  y[i] += v;
#else
  y[i] = v;
#endif
}

// The rows and row bytes of the product a workgroup computes (`second`: PAIR_F32's W2).
fn matrix_rows(second: bool) -> u32 {
#ifdef PAIR_F32
  if (second) {
    return params.rows2;
  }
#endif
  return params.rows;
}

fn row_bytes(second: bool) -> u32 {
  if (second) {
    return 4u * params.k;
  }
  return bytes_of_row(params.k);
}

// Chunk c of the row at byte row_byte of W (or of W2).
fn weights32(second: bool, row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
#ifdef PAIR_F32
  if (second) {
    let i = (row_byte >> 4u) + c * 8u;
    return array<vec4<f32>, 8>(
      bitcast<vec4<f32>>(w2[i]), bitcast<vec4<f32>>(w2[i + 1u]),
      bitcast<vec4<f32>>(w2[i + 2u]), bitcast<vec4<f32>>(w2[i + 3u]),
      bitcast<vec4<f32>>(w2[i + 4u]), bitcast<vec4<f32>>(w2[i + 5u]),
      bitcast<vec4<f32>>(w2[i + 6u]), bitcast<vec4<f32>>(w2[i + 7u]),
    );
  }
#endif
  return dequant32(row_byte, c);
}

// The 32 input values of a chunk, as named vec4s: no array indexed by a variable anywhere in
// the loop (some SPIR-V compilers keep such arrays in local memory).
struct Chunk {
  v0: vec4<f32>,
  v1: vec4<f32>,
  v2: vec4<f32>,
  v3: vec4<f32>,
  v4: vec4<f32>,
  v5: vec4<f32>,
  v6: vec4<f32>,
  v7: vec4<f32>,
}

// s = fma chain over the four products of a vec4, in component order.
fn fma4(a: vec4<f32>, b: vec4<f32>, s: f32) -> f32 {
  return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, s))));
}

// s_c: the fma chain of one chunk's weights against its input, from 0.
fn chunk_sum(wv: array<vec4<f32>, 8>, x: Chunk) -> f32 {
  var s = fma4(wv[0], x.v0, 0.0);
  s = fma4(wv[1], x.v1, s);
  s = fma4(wv[2], x.v2, s);
  s = fma4(wv[3], x.v3, s);
  s = fma4(wv[4], x.v4, s);
  s = fma4(wv[5], x.v5, s);
  s = fma4(wv[6], x.v6, s);
  return fma4(wv[7], x.v7, s);
}

#ifdef X_STREAM
// The class partials p of the thread's rows plus one token's chunk products with their weights
// w0..w3 (the first RPT of them).
fn add_chunk(
  p: vec4<f32>,
  w0: array<vec4<f32>, 8>,
  w1: array<vec4<f32>, 8>,
  w2: array<vec4<f32>, 8>,
  w3: array<vec4<f32>, 8>,
  x: Chunk,
) -> vec4<f32> {
  var q = p;
  q.x = p.x + chunk_sum(w0, x);
  if (RPT > 1u) {
    q.y = p.y + chunk_sum(w1, x);
  }
  if (RPT > 2u) {
    q.z = p.z + chunk_sum(w2, x);
    q.w = p.w + chunk_sum(w3, x);
  }
  return q;
}
#endif

#ifdef BURST
// The raw words of one chunk of each of the thread's rows (the first RPT of them).
struct RowsRaw {
  r0: Raw,
  r1: Raw,
  r2: Raw,
  r3: Raw,
}

fn load_rows(at: vec4<u32>, c: u32) -> RowsRaw {
  var o: RowsRaw;
  o.r0 = load32(at.x, c);
  if (RPT > 1u) {
    o.r1 = load32(at.y, c);
  }
  if (RPT > 2u) {
    o.r2 = load32(at.z, c);
    o.r3 = load32(at.w, c);
  }
  return o;
}

// The class partials p of the thread's rows plus their chunk products with input x: the same
// sums, in the same order, as weights32 and chunk_sum row by row.
fn add_rows(p: vec4<f32>, rows: RowsRaw, x: Chunk) -> vec4<f32> {
  var q = p;
  q.x = p.x + chunk_sum(decode32(rows.r0), x);
  if (RPT > 1u) {
    q.y = p.y + chunk_sum(decode32(rows.r1), x);
  }
  if (RPT > 2u) {
    q.z = p.z + chunk_sum(decode32(rows.r2), x);
    q.w = p.w + chunk_sum(decode32(rows.r3), x);
  }
  return q;
}

// Window chunk cc's products with its loaded words into each token's class partials (p1: the
// second token's, TN = 2), where `used` (the chunk lies in the window).
fn burst_chunk(
  p0: ptr<function, vec4<f32>>,
  p1: ptr<function, vec4<f32>>,
  rows: RowsRaw,
  tk: Tokens,
  c0: u32,
  cc: u32,
  scale: f32,
  scale2: f32,
  used: bool,
) {
  if (used) {
    *p0 = add_rows(*p0, rows, chunk_input(tk.x_lo.x, c0, cc, scale, 0u));
    if (TN > 1u) {
      *p1 = add_rows(*p1, rows, chunk_input(tk.x_lo.y, c0, cc, scale2, XB));
    }
  }
}
#endif

// vec4 v of chunk c0 + cc's input (cc within the window), staged (from xs at xb) or from x.
fn in4(xo: u32, c0: u32, cc: u32, v: u32, scale: f32, xb: u32) -> vec4<f32> {
#ifdef XSTAGE
  return xs[xb + 9u * cc + v];
#else
  return input4(xo, c0 + cc, v, scale);
#endif
}

fn chunk_input(xo: u32, c0: u32, cc: u32, scale: f32, xb: u32) -> Chunk {
  return Chunk(
    in4(xo, c0, cc, 0u, scale, xb),
    in4(xo, c0, cc, 1u, scale, xb),
    in4(xo, c0, cc, 2u, scale, xb),
    in4(xo, c0, cc, 3u, scale, xb),
    in4(xo, c0, cc, 4u, scale, xb),
    in4(xo, c0, cc, 5u, scale, xb),
    in4(xo, c0, cc, 6u, scale, xb),
    in4(xo, c0, cc, 7u, scale, xb),
  );
}

#ifdef NORM
#ifdef XSTAGE
// Slot q (chunk q / 8, vec4 q % 8) of a single window's xs: the raw x written, nw returned.
fn stage_raw(xo: u32, q: u32, wn: u32, xb: u32) -> vec4<f32> {
  if (q >= wn * 8u) {
    return vec4<f32>(0.0);
  }
  let col = 32u * (q / 8u) + 4u * (q % 8u);
  xs[xb + 9u * (q / 8u) + q % 8u] = x4(xo + col);
  return vec4<f32>(nw[col], nw[col + 1u], nw[col + 2u], nw[col + 3u]);
}

// Slot q normed in place, as input4 computes it: (x·scale)·nw.
fn normalize_slot(q: u32, wn: u32, scale: f32, g: vec4<f32>, xb: u32) {
  if (q < wn * 8u) {
    let i = xb + 9u * (q / 8u) + q % 8u;
    xs[i] = (xs[i] * scale) * g;
  }
}

// rms_scale's partial for invocation lid, from the raw x staged in xs (element i is component
// i % 4 of xs[9·(i / 32) + (i % 32) / 4]).
fn staged_part(n: u32, lid: u32, xb: u32) -> f32 {
  var lo = 0.0;
  var hi = 0.0;
  if (lid < 128u) {
    for (var i = lid; i < n; i += 256u) {
      let v = xs[xb + 9u * (i / 32u) + (i % 32u) / 4u][i % 4u];
      lo = fma(v, v, lo);
    }
    for (var i = lid + 128u; i < n; i += 256u) {
      let v = xs[xb + 9u * (i / 32u) + (i % 32u) / 4u][i % 4u];
      hi = fma(v, v, hi);
    }
  }
  return lo + hi;
}
#endif
#endif

// The workgroup's TN tokens (`live` of them real; the others repeat a live one's input and write
// nothing): where token j's input starts in x and its outputs start in y (component j % 4 of the
// low or high vector), and the step's index of token 0 (plain products: token j is t0 + j).
struct Tokens {
  x_lo: vec4<u32>,
  x_hi: vec4<u32>,
  y_lo: vec4<u32>,
  y_hi: vec4<u32>,
  t0: u32,
  live: u32,
}

// The tokens a workgroup computes: TN ≤ 2 all of them; under X_STREAM its live tokens rounded up
// to 2, 4 or 8 (each block's extra tokens repeat a live one's input; their outputs are dropped).
fn busy_tokens(tk: Tokens) -> u32 {
  if (TN <= 2u || tk.live <= 2u) {
    return min(TN, 2u);
  }
  return select(8u, 4u, tk.live <= 4u);
}

// Token j's input offset in x.
fn x_of(tk: Tokens, j: u32) -> u32 {
  if (j < 4u) {
    return tk.x_lo[j];
  }
  return tk.x_hi[j - 4u];
}

// Token j's input and output offsets into tk (j < TN).
fn set_token(tk: ptr<function, Tokens>, j: u32, xo: u32, yo: u32) {
  if (j < 4u) {
    (*tk).x_lo[j] = xo;
    (*tk).y_lo[j] = yo;
  } else {
    (*tk).x_hi[j - 4u] = xo;
    (*tk).y_hi[j - 4u] = yo;
  }
}

// Each token's outputs of the workgroup's rows r (RPT ≤ 4 of them: a vector's components), for
// lane 0 of each row group.
struct Totals {
  o0: vec4<f32>,
  o1: vec4<f32>,
  o2: vec4<f32>,
  o3: vec4<f32>,
  o4: vec4<f32>,
  o5: vec4<f32>,
  o6: vec4<f32>,
  o7: vec4<f32>,
}

// The RMSNorm scale of the input at xo, its raw x staged at xb when `held` (nw of this
// invocation's slots into g, which every token shares).
fn norm_scale(xo: u32, xb: u32, held: bool, lid: u32) -> f32 {
#ifdef NORM
#ifdef XSTAGE
  if (held) {
    return rms_finish(staged_part(params.k, lid, xb), params.k, params.eps, lid);
  }
#endif
  return rms_scale(xo, params.k, params.eps, lid);
#else
  return 1.0;
#endif
}

// The outputs of row group g's rows from their class partials in pbuf, in class order (for its
// lane 0). A fixed trip count: Mesa's lavapipe (CI's adapter) leaks per dispatch when a loop of
// data-dependent length follows the last barrier. Same sum, same order.
fn sum_classes(g: u32, classes: u32) -> vec4<f32> {
  var total = vec4<f32>(0.0);
  for (var r = 0u; r < RPT; r++) {
    var t = 0.0;
    for (var l = 0u; l < CLASSES; l++) {
      if (l < classes) {
        t = t + pbuf[CLASSES * (g + GROUPS * r) + l];
      }
    }
    total[r] = t;
  }
  return total;
}

// A row's output from the class partials p of each lane of its row group, in class order;
// lane 0 of the group gets it. Called by every invocation (barriers).
fn fold_classes(p: vec4<f32>, cu: u32, g: u32, sid: u32, classes: u32) -> vec4<f32> {
  var total = vec4<f32>(0.0);
#ifdef SUBGROUPS
  // The 16 lanes of a row group sit in one subgroup, lane cu holding class cu (the device
  // checked that lanes follow local_invocation_index in subgroups of ≥ 16).
  let first = sid - cu;
  for (var l = 0u; l < CLASSES; l++) {
    let pl = subgroupShuffle(p, first + l);
    if (l < classes) {
      total = total + pl;
    }
  }
#else
  workgroupBarrier();
  for (var r = 0u; r < RPT; r++) {
    pbuf[CLASSES * (g + GROUPS * r) + cu] = p[r];
  }
  workgroupBarrier();
  if (cu == 0u) {
    total = sum_classes(g, classes);
  }
#endif
  return total;
}

#ifdef XSTAGE
// vec4 slot q (chunk q / 8, vec4 q % 8) of the window from chunk c0 of every token of tk into xs,
// normed by token 0's and 1's scales under NORM (the only tokens NORM takes).
fn stage_window(tk: Tokens, c0: u32, q: u32, scale: f32, scale2: f32) {
  let at = 9u * (q / 8u) + q % 8u;
  let c = c0 + q / 8u;
  xs[at] = input4(tk.x_lo.x, c, q % 8u, scale);
  if (TN > 1u) {
    xs[XB + at] = input4(tk.x_lo.y, c, q % 8u, scale2);
  }
  for (var j = 2u; j < busy_tokens(tk); j++) {
    xs[j * XB + at] = input4(x_of(tk, j), c, q % 8u, 1.0);
  }
}
#endif

// The products of the workgroup's rows (part rows part_row0 + row0 + ...) with the inputs of
// tk's tokens: rows row0 + g + GROUPS·r (r < RPT ≤ 4, a vector's components) to lane 0 of row
// group g. Called by every invocation (barriers).
fn rows_product(
  part_row0: u32,
  row0: u32,
  tk: Tokens,
  lid: u32,
  sid: u32,
  second: bool,
) -> Totals {
  let cu = lid % CU;
  let g = lid / CU;
  let chunks = params.k / 32u;
  let classes = min(chunks, CLASSES);
  let rb = row_bytes(second);
  let last_row = matrix_rows(second) - 1u;
  let xo = tk.x_lo.x;
  let xo2 = tk.x_lo.y;
  let busy = busy_tokens(tk);
  // With NORM and XSTAGE, a row of x that fits one window is read from memory once: staged raw,
  // summed from workgroup memory, then normed in place (g0..g3: nw of this invocation's slots).
  var held = false;
  var g0 = vec4<f32>(0.0);
  var g1 = vec4<f32>(0.0);
  var g2 = vec4<f32>(0.0);
  var g3 = vec4<f32>(0.0);
#ifdef NORM
#ifdef XSTAGE
  held = chunks <= WIN;
  if (held) {
    g0 = stage_raw(xo, lid, chunks, 0u);
    g1 = stage_raw(xo, lid + WG, chunks, 0u);
    g2 = stage_raw(xo, lid + 2u * WG, chunks, 0u);
    g3 = stage_raw(xo, lid + 3u * WG, chunks, 0u);
    if (TN > 1u) {
      stage_raw(xo2, lid, chunks, XB);
      stage_raw(xo2, lid + WG, chunks, XB);
      stage_raw(xo2, lid + 2u * WG, chunks, XB);
      stage_raw(xo2, lid + 3u * WG, chunks, XB);
    }
    workgroupBarrier();
  }
#endif
#endif
  let scale = norm_scale(xo, 0u, held, lid);
  var scale2 = 1.0;
  if (TN > 1u) {
    scale2 = norm_scale(xo2, XB, held, lid);
  }
  // The byte offset of each of this thread's rows; a row past the part reads the last row
  // instead (its output is dropped), so the loads need no branch.
  var at: vec4<u32>;
  for (var r = 0u; r < RPT; r++) {
    at[r] = (part_row0 + min(row0 + g + GROUPS * r, last_row)) * rb;
  }
#ifdef REG_CLASSES
  // Each token's class partials of the thread's rows.
  var p0 = vec4<f32>(0.0);
  var p1 = vec4<f32>(0.0);
  var p2 = vec4<f32>(0.0);
  var p3 = vec4<f32>(0.0);
  var p4 = vec4<f32>(0.0);
  var p5 = vec4<f32>(0.0);
  var p6 = vec4<f32>(0.0);
  var p7 = vec4<f32>(0.0);
#else
  for (var q = lid; q < ROWS * CLASSES; q += WG) {
    pbuf[q] = 0.0;
  }
#endif
  for (var c0 = 0u; c0 < chunks; c0 += WIN) {
    let wn = min(WIN, chunks - c0);
#ifdef XSTAGE
    workgroupBarrier();
    if (held) {
#ifdef NORM
      normalize_slot(lid, wn, scale, g0, 0u);
      normalize_slot(lid + WG, wn, scale, g1, 0u);
      normalize_slot(lid + 2u * WG, wn, scale, g2, 0u);
      normalize_slot(lid + 3u * WG, wn, scale, g3, 0u);
      if (TN > 1u) {
        normalize_slot(lid, wn, scale2, g0, XB);
        normalize_slot(lid + WG, wn, scale2, g1, XB);
        normalize_slot(lid + 2u * WG, wn, scale2, g2, XB);
        normalize_slot(lid + 3u * WG, wn, scale2, g3, XB);
      }
#endif
    } else {
      for (var q = lid; q < wn * 8u; q += WG) {
        stage_window(tk, c0, q, scale, scale2);
      }
    }
    workgroupBarrier();
#endif
    for (var cc = cu; cc < wn; cc += CU * BURST_CHUNKS) {
#ifdef X_STREAM
      // The chunk of each of the thread's rows, then each token's input read once for all of
      // them, in whole blocks of tokens so their fma chains interleave (rows past RPT unused).
      let c = c0 + cc;
      let w0 = weights32(second, at.x, c);
      let w1 = weights32(second, at.y, c);
      let w2 = weights32(second, at.z, c);
      let w3 = weights32(second, at.w, c);
      p0 = add_chunk(p0, w0, w1, w2, w3, chunk_input(xo, c0, cc, 1.0, 0u));
      p1 = add_chunk(p1, w0, w1, w2, w3, chunk_input(xo2, c0, cc, 1.0, XB));
      if (busy > 2u) {
        p2 = add_chunk(p2, w0, w1, w2, w3, chunk_input(tk.x_lo.z, c0, cc, 1.0, 2u * XB));
        p3 = add_chunk(p3, w0, w1, w2, w3, chunk_input(tk.x_lo.w, c0, cc, 1.0, 3u * XB));
      }
      if (TN > 4u && busy > 4u) {
        p4 = add_chunk(p4, w0, w1, w2, w3, chunk_input(tk.x_hi.x, c0, cc, 1.0, 4u * XB));
        p5 = add_chunk(p5, w0, w1, w2, w3, chunk_input(tk.x_hi.y, c0, cc, 1.0, 5u * XB));
        p6 = add_chunk(p6, w0, w1, w2, w3, chunk_input(tk.x_hi.z, c0, cc, 1.0, 6u * XB));
        p7 = add_chunk(p7, w0, w1, w2, w3, chunk_input(tk.x_hi.w, c0, cc, 1.0, 7u * XB));
      }
#else
#ifdef BURST
      // The burst's chunks' words are all loaded before any is used, so a thread has that many
      // times the bytes in flight; a chunk past the window reloads the first and is not used.
      let c = c0 + cc;
      let ra = load_rows(at, c);
      let rb = load_rows(at, select(c, c + CU, cc + CU < wn));
      var rc = ra;
      var rd = ra;
      if (BURST > 2u) {
        rc = load_rows(at, select(c, c + 2u * CU, cc + 2u * CU < wn));
        rd = load_rows(at, select(c, c + 3u * CU, cc + 3u * CU < wn));
      }
      burst_chunk(&p0, &p1, ra, tk, c0, cc, scale, scale2, true);
      burst_chunk(&p0, &p1, rb, tk, c0, cc + CU, scale, scale2, cc + CU < wn);
      if (BURST > 2u) {
        burst_chunk(&p0, &p1, rc, tk, c0, cc + 2u * CU, scale, scale2, cc + 2u * CU < wn);
        burst_chunk(&p0, &p1, rd, tk, c0, cc + 3u * CU, scale, scale2, cc + 3u * CU < wn);
      }
#else
      let xv = chunk_input(xo, c0, cc, scale, 0u);
      var xv2 = xv;
      if (TN > 1u) {
        xv2 = chunk_input(xo2, c0, cc, scale2, XB);
      }
      for (var r = 0u; r < RPT; r++) {
        let wv = weights32(second, at[r], c0 + cc);
#ifdef REG_CLASSES
        p0[r] = p0[r] + chunk_sum(wv, xv);
        if (TN > 1u) {
          p1[r] = p1[r] + chunk_sum(wv, xv2);
        }
#else
        sbuf[(WIN + 1u) * (g + GROUPS * r) + cc] = chunk_sum(wv, xv);
#endif
      }
#endif
#endif
    }
#ifndef REG_CLASSES
    workgroupBarrier();
    // Fold the window into the class partials: class l takes its chunks in increasing order.
    for (var q = lid; q < ROWS * CLASSES; q += WG) {
      let row = q / CLASSES;
      var pl = pbuf[q];
      for (var cc = q % CLASSES; cc < wn; cc += CLASSES) {
        pl = pl + sbuf[(WIN + 1u) * row + cc];
      }
      pbuf[q] = pl;
    }
    workgroupBarrier();
#endif
  }
  // Each row's output, in order over its classes; lane 0 of the row group gets it.
  var out: Totals;
#ifdef REG_CLASSES
  out.o0 = fold_classes(p0, cu, g, sid, classes);
  if (TN > 1u) {
    out.o1 = fold_classes(p1, cu, g, sid, classes);
  }
  if (TN > 2u) {
    out.o2 = fold_classes(p2, cu, g, sid, classes);
    out.o3 = fold_classes(p3, cu, g, sid, classes);
  }
  if (TN > 4u) {
    out.o4 = fold_classes(p4, cu, g, sid, classes);
    out.o5 = fold_classes(p5, cu, g, sid, classes);
    out.o6 = fold_classes(p6, cu, g, sid, classes);
    out.o7 = fold_classes(p7, cu, g, sid, classes);
  }
#else
  if (cu == 0u) {
    out.o0 = sum_classes(g, classes);
  }
#endif
  return out;
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
  let flat = wid.x + wid.y * nwg.x;
  // Lane 0 of row group g writes rows row0 + g + GROUPS·r.
  let g = lid / CU;
  let writer = lid % CU == 0u;
#ifdef ID
  let tile = flat;
  if (tile >= params.row_tiles) {
    return;
  }
  fill_iq4_table(lid);
  let row0 = tile * ROWS;
#ifdef GATHERED
  let gt = gather_tile(wid.z, lid);
  if (!gt.live) {
    return;
  }
  let e = gt.expert;
  let n = gt.slots;
  let base = gt.first;
#else
  // Slot wid.z = (token t, expert rank i).
  if (lid == 0u) {
    chosen = ids[(wid.z / params.n_used) * params.ids_stride + wid.z % params.n_used];
  }
  let e = workgroupUniformLoad(&chosen);
  let n = 1u;
#endif
  // Only the part holding expert e computes it.
  if (e < params.expert_first || e >= params.expert_first + params.expert_count) {
    return;
  }
  let part_row0 = (e - params.expert_first) * params.rows;
  // The slots, TN at a time: each slot (t, i) reads x[t][i] and writes y[t][i].
  for (var s0 = 0u; s0 < n; s0 += TN) {
    var tk: Tokens;
    tk.live = min(TN, n - s0);
    for (var j = 0u; j < TN; j++) {
#ifdef GATHERED
      let slot = ids[1u + params.ids_stride + base + s0 + min(j, tk.live - 1u)];
#else
      let slot = wid.z;
#endif
      let t = slot / params.n_used;
      let i = slot % params.n_used;
      let xo = params.x_offset + t * params.x_stride_t + i * params.x_stride_i;
      set_token(&tk, j, xo, params.y_offset + t * params.y_stride_t + i * params.y_stride_i);
    }
    write_tokens(row0, g, writer, false, tk, rows_product(part_row0, row0, tk, lid, sid, false));
  }
#else
  // A row tile's token groups sit next to each other in the grid.
  let groups = (params.tokens + TN - 1u) / TN;
  var tile = flat / groups;
  var tk: Tokens;
  tk.t0 = (flat % groups) * TN;
  tk.live = min(TN, params.tokens - tk.t0);
  var second = false;
#ifdef PAIR_F32
  if (tile >= params.row_tiles) {
    second = true;
    tile -= params.row_tiles;
  }
  if (tile >= select(params.row_tiles, params.row_tiles2, second)) {
    return;
  }
#else
  if (tile >= params.row_tiles) {
    return;
  }
#endif
  fill_iq4_table(lid);
  let row0 = tile * ROWS;
  for (var j = 0u; j < TN; j++) {
    let t = min(tk.t0 + j, params.tokens - 1u);
    let yo = params.y_offset + (tk.t0 + j) * params.y_stride_t + params.row_base;
    set_token(&tk, j, params.x_offset + t * params.x_stride_t, yo);
  }
  write_tokens(row0, g, writer, second, tk, rows_product(0u, row0, tk, lid, sid, second));
#endif
}

// Every live token's outputs of the workgroup's rows.
fn write_tokens(row0: u32, g: u32, writer: bool, second: bool, tk: Tokens, out: Totals) {
  write_rows(row0, g, writer, second, tk.t0, tk.y_lo.x, out.o0);
  if (TN > 1u && tk.live > 1u) {
    write_rows(row0, g, writer, second, tk.t0 + 1u, tk.y_lo.y, out.o1);
  }
  if (TN > 2u) {
    if (tk.live > 2u) {
      write_rows(row0, g, writer, second, tk.t0 + 2u, tk.y_lo.z, out.o2);
    }
    if (tk.live > 3u) {
      write_rows(row0, g, writer, second, tk.t0 + 3u, tk.y_lo.w, out.o3);
    }
  }
  if (TN > 4u) {
    if (tk.live > 4u) {
      write_rows(row0, g, writer, second, tk.t0 + 4u, tk.y_hi.x, out.o4);
    }
    if (tk.live > 5u) {
      write_rows(row0, g, writer, second, tk.t0 + 5u, tk.y_hi.y, out.o5);
    }
    if (tk.live > 6u) {
      write_rows(row0, g, writer, second, tk.t0 + 6u, tk.y_hi.z, out.o6);
    }
    if (tk.live > 7u) {
      write_rows(row0, g, writer, second, tk.t0 + 7u, tk.y_hi.w, out.o7);
    }
  }
}

// Token t's outputs of the workgroup's rows (yo: where row 0 of its part goes in y).
fn write_rows(row0: u32, g: u32, writer: bool, second: bool, t: u32, yo: u32, total: vec4<f32>) {
  for (var r = 0u; r < RPT; r++) {
    let row = row0 + g + GROUPS * r;
    if (writer && row < matrix_rows(second)) {
#ifdef PAIR_F32
      if (second) {
        y2[params.y2_offset + t * params.y2_stride_t + row] = total[r];
        continue;
      }
#endif
#ifdef MOE_SUM
      y[yo + row] = y[yo + row] + moe_mix(t, params.row_base + row, total[r]);
#else
      put(yo + row, total[r]);
#endif
#ifdef CONV
      // One token (t = 0): the output's column in y is its channel.
      if (yo + row < params.conv_channels) {
        conv_token(yo + row, total[r]);
      }
#endif
    }
  }
}
