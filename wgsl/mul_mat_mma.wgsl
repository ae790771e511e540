// mul_mat_mma: y[t,i][row] (= or +=) s_r · Σ_k W_e[row][k] · v_r[k] on tensor cores (subgroup
// matrices, f16 × f16 → f32) for every weight type but F32 and BF16, over a tile of BM rows × BN
// token slots (prefill); with GATHERED, e picks an expert of a stacked tensor and a tile takes up
// to BN = 32 slots routed to one expert (wgsl/moe_gather.wgsl's table). v_r and s_r are slot r's
// input row as wgsl/mma_input.wgsl wrote it (x / s_r, s_r a power of two, as f16 hi + lo pairs).
// SPLIT (the engine's products): each dequantized weight w is staged as two f16, a = f16(w) and
// b = f16((w − a)·2^11), and each input value as hi + lo; the result takes, per 16 values of k,
// a·hi, a·lo and b·(2^−11·hi) (b·lo, below 2^−22 of the term, is left out). Every weight the
// dequantizer gives lies on a grid of 2^−24 (an f16 scale's ulp, or finer), so w − a is a multiple
// of 2^−24 below ulp(a): b, 2^−13 or more where not 0, is a normal f16, exact where w needs at
// most 22 bits, which every |w| < 2^−3 does (below 2^−14, a is w as an f16 subnormal and b is 0).
// So a + 2^−11·b is w exactly, or within 2^−22 of it above 2^−3, up to f16's largest (65504).
// Matches engine/reference/math.ts matVec over engine/quant/dequant.ts rows to f32's rounding
// (docs/PERFORMANCE.md "Tensor cores"). Without SPLIT: a and hi alone, one matrix multiply a step
// (the kernel bench's "f16" precision: weights and inputs rounded to f16, as llama.cpp's Vulkan
// coopmat path rounds its weights).
// Bindings: 0 w: weight bytes of one part (rows of `k` values, quantized) | 1 xh (input rows as
//   mma_input writes them: f16 pairs two a word) | 2 xscale (s_r) | 3 ids (u32: the gather table
//   under GATHERED, a dummy otherwise) | 4 y (f32) | 5 params.
// Dispatch: (row_tiles folded to 2-D, z): z = token tiles, or the gather table's most tiles under
//   GATHERED (workgroups past its tile count exit). WG = 128: four subgroups of 32 lanes (the
//   device check of engine/gpu/device.ts), SGR × SGC over the tile, each FM × FN results of 16×16.
// Variants: TYPE_<type> (one), BM (64, 128), BN (32, 64, 128), SGR, SGC, FM, FN (set from BM and
//   BN by the binder), STAGES (1: one staging buffer, two barriers a chunk; 2: the next chunk is
//   staged into a second buffer beside this chunk's products, one barrier), SPLIT, GATHERED, ADD
//   (y += result), PREFETCH (types with dequant.wgsl's load32: the chunk after the staged one
//   loads into registers during the products), IQ4_TABLE_WORKGROUP (dequant.wgsl), EMULATE (the
//   matrix operations as f32 code over the same staged tiles: any device, so the tests check the
//   staging, splitting, tiles, slots and epilogue where there are no tensor cores), STAGE_F32
//   (with EMULATE: staged values kept as f32 rounded to f16, where the device has no shader-f16).
//
// Batch invariance: an output's sum starts at 0 and takes k's 16-value blocks in increasing order,
// its matrix multiplies in one order each, then y = sum·s_r. Which tile, slot, subgroup or run
// length a token gets changes none of that, so its bits depend on its weight row and input row
// alone (tests/gpu_mma_test.ts checks it, emulated on any device and on the tensor cores).

#include "_include/dequant.wgsl"

struct Params {
  k: u32,
  rows: u32,
  tokens: u32,
  n_used: u32,
  row_base: u32,
  expert_first: u32,
  expert_count: u32,
  xh_stride_t: u32,
  xh_stride_i: u32,
  y_offset: u32,
  y_stride_t: u32,
  y_stride_i: u32,
  ids_stride: u32,
  row_tiles: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> xh: array<u32>;
@group(0) @binding(2) var<storage, read> xscale: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

const WG = 128u;
// Staged weights are k-major: a chunk's value k of tile row r at k·SW + r (a), under SPLIT with
// its b at k·SW + BM + r. A thread stages a row, so the lanes of a store write consecutive f16 (no
// bank conflicts); each k run of SW is 16-byte aligned for the matrix loads (8 of padding: the 8
// runs a load phase reads fall in distinct banks).
#ifdef SPLIT
const SW = 2u * BM + 8u;
#else
const SW = BM + 8u;
#endif
const WSZ = 32u * SW;
// Staged inputs are slot-major: a slot's chunk as 16 vec2<f16> (hi), under SPLIT 16 more (lo),
// then 4 of padding, so slots are 80 (144) bytes apart: 16-byte aligned, the 8 a load phase reads
// in distinct banks. Loads and strides of xs count its elements, vec2s.
#ifdef SPLIT
const VK = 36u;
#else
const VK = 20u;
#endif
const XSZ = BN * VK;
// Words of xh a slot's chunk takes: its 16 hi words, then (SPLIT) its 16 lo words.
const XCW = VK - 4u;
// Slots a thread stages a quarter of: one per 32 slots.
const XPT = BN / 32u;

// [stage][k][row (a), row (b)] and [stage][slot][hi, lo: k / 2].
var<workgroup> ws: array<H1, STAGES * WSZ>;
var<workgroup> xs: array<H2, STAGES * XSZ>;
// One 16 × 16 result a subgroup on its way to y, slot-major.
var<workgroup> outs: array<f32, 1024>;
// A slot's first word of xh, its y offset and s_r.
var<workgroup> slot_x: array<u32, BN>;
var<workgroup> slot_y: array<u32, BN>;
var<workgroup> slot_s: array<f32, BN>;
#ifdef GATHERED
#include "_include/gather_tile.wgsl"
#endif

// Words q, q + 4, q + 8, q + 12 of a slot's chunk of hi pairs, and under SPLIT the same of its lo.
#ifdef SPLIT
struct XWords {
  hi: vec4<u32>,
  lo: vec4<u32>,
}
#else
alias XWords = vec4<u32>;
#endif

// The chunk after the staged one, in registers: this thread's words of each of its slots (v0: s,
// v1: s + 32, ...), and under PREFETCH the weight row's raw words.
struct XRaw {
  v0: XWords,
  v1: XWords,
  v2: XWords,
  v3: XWords,
}
var<private> xraw: XRaw;
#ifdef PREFETCH
var<private> wraw: Raw;
#endif

#include "_include/f16_round.wgsl"

// One f16 value and two of a packed word, with their conversions from f32 and from the word.
#ifdef STAGE_F32
// Kept as f32 rounded to f16 (EMULATE on a device without shader-f16).
alias H1 = f32;
alias H2 = vec2<f32>;

fn h1(v: f32) -> H1 {
  return f16_round(v);
}

fn h2_bits(u: u32) -> H2 {
  return unpack2x16float(u);
}
#else
enable f16;

alias H1 = f16;
alias H2 = vec2<f16>;

fn h1(v: f32) -> H1 {
  return f16(v);
}

fn h2_bits(u: u32) -> H2 {
#ifdef EMULATE
  // The same values: naga (the builtin provider's compiler) rejects this bitcast.
  return vec2<f16>(unpack2x16float(u));
#else
  return bitcast<vec2<f16>>(u);
#endif
}
#endif

// The matrix operations: a 16 × 16 block of weights (rows × k, from ws) times one of inputs
// (k × slots, from xs) into a 16 × 16 f32 result (rows × slots), stored slot-major into outs; and
// a block of inputs times 2^−11 (exact: a power of two).
#ifdef EMULATE
// A block is where it starts in ws or xs (an input block with its factor); a result is lane l's
// elements l, l + 32, ... of the slot-major 16 × 16, the layout emit reads back.
struct MatA {
  o: u32,
}
struct MatB {
  o: u32,
  f: f32,
}
struct MatC {
  v: array<f32, 8>,
}
var<private> lane_id: u32;

fn load_a(o: u32) -> MatA {
  return MatA(o);
}

fn load_b(o: u32) -> MatB {
  return MatB(o, 1.0);
}

fn scale_b(b: MatB) -> MatB {
  return MatB(b.o, b.f * 0.00048828125);
}

// As a tensor core takes a step: the 16 products of an element summed on their own, then added
// to the result (one rounding of the result a step, not 16).
fn mma(a: MatA, b: MatB, c: MatC) -> MatC {
  var r = c;
  for (var e = 0u; e < 8u; e++) {
    let idx = 32u * e + lane_id;
    let wo = a.o + idx % 16u;
    let xo = b.o + (idx / 16u) * VK;
    var step = 0.0;
    for (var j = 0u; j < 8u; j++) {
      let xv = vec2<f32>(xs[xo + j]) * b.f;
      step = fma(f32(ws[wo + 2u * j * SW]), xv.x, step);
      step = fma(f32(ws[wo + (2u * j + 1u) * SW]), xv.y, step);
    }
    r.v[e] += step;
  }
  return r;
}

fn store_c(m: MatC, at: u32) {
  for (var e = 0u; e < 8u; e++) {
    outs[at + 32u * e + lane_id] = m.v[e];
  }
}
#else
enable subgroups;
enable chromium_experimental_subgroup_matrix;

alias MatA = subgroup_matrix_left<f16, 16, 16>;
alias MatB = subgroup_matrix_right<f16, 16, 16>;
alias MatC = subgroup_matrix_result<f32, 16, 16>;

// Weights column-major (k-major, runs of SW f16); inputs column-major (slot-major, runs of VK
// vec2s: loads and strides count the array's elements).
fn load_a(o: u32) -> MatA {
  return subgroupMatrixLoad<MatA, col_major>(&ws, o, SW);
}

fn load_b(o: u32) -> MatB {
  return subgroupMatrixLoad<MatB, col_major>(&xs, o, VK);
}

fn scale_b(b: MatB) -> MatB {
  return subgroupMatrixScalarMultiply(b, 0.00048828125h);
}

fn mma(a: MatA, b: MatB, c: MatC) -> MatC {
  return subgroupMatrixMultiplyAccumulate(a, b, c);
}

fn store_c(m: MatC, at: u32) {
  subgroupMatrixStore<col_major>(&outs, at, m, 16u);
}
#endif

// The blocks one step of k (16 values) multiplies by beside a row block's weights a and a slot
// block's inputs hi: under SPLIT the weights' b, BM further in each k run, the inputs' lo, 16
// vec2s further in each slot, and his = 2^−11·hi; without, zero blocks that prod leaves unused.
// (Separate values, not a struct of matrices, which the SPIR-V path would have to carry.)
#ifdef SPLIT
fn load_wb(o: u32) -> MatA {
  return load_a(o + BM);
}

fn load_lo(o: u32) -> MatB {
  return load_b(o + 16u);
}

fn his(hi: MatB) -> MatB {
  return scale_b(hi);
}
#else
fn load_wb(o: u32) -> MatA {
  return MatA();
}

fn load_lo(o: u32) -> MatB {
  return MatB();
}

fn his(hi: MatB) -> MatB {
  return MatB();
}
#endif

// c + a·hi + a·lo + b·his (his = 2^−11·hi), each a matrix multiply-accumulate in that order
// (SPLIT), or c + a·hi.
fn prod(a: MatA, b: MatA, hi: MatB, lo: MatB, his: MatB, c: MatC) -> MatC {
#ifdef SPLIT
  return mma(b, his, mma(a, lo, mma(a, hi, c)));
#else
  return mma(a, hi, c);
#endif
}

fn row_bytes() -> u32 {
  return bytes_of_row(params.k);
}

fn put(i: u32, v: f32) {
#ifdef ADD
  y[i] += v;
#else
  y[i] = v;
#endif
}

// Rounded to f16, as f32, f16's subnormals kept.
fn round4(v: vec4<f32>) -> vec4<f32> {
  return vec4<f32>(f16_round(v.x), f16_round(v.y), f16_round(v.z), f16_round(v.w));
}

// Values 4v..4v+3 of a weight row's chunk, from `o` = value 4v of the row: as a (rounded to f16)
// and b (2^11 times what a leaves) under SPLIT; else rounded to f16.
fn put_w4(o: u32, q: vec4<f32>) {
#ifdef SPLIT
  let a = round4(q);
  let b = (q - a) * 2048.0;
  ws[o + BM] = h1(b.x);
  ws[o + SW + BM] = h1(b.y);
  ws[o + 2u * SW + BM] = h1(b.z);
  ws[o + 3u * SW + BM] = h1(b.w);
#else
  let a = q;
#endif
  ws[o] = h1(a.x);
  ws[o + SW] = h1(a.y);
  ws[o + 2u * SW] = h1(a.z);
  ws[o + 3u * SW] = h1(a.w);
}

fn put_w(buf: u32, r: u32, v: array<vec4<f32>, 8>) {
  let o = buf * WSZ + r;
  put_w4(o, v[0]);
  put_w4(o + 4u * SW, v[1]);
  put_w4(o + 8u * SW, v[2]);
  put_w4(o + 12u * SW, v[3]);
  put_w4(o + 16u * SW, v[4]);
  put_w4(o + 20u * SW, v[5]);
  put_w4(o + 24u * SW, v[6]);
  put_w4(o + 28u * SW, v[7]);
}

// Words q, q + 4, q + 8, q + 12 of 16 at `o` of the staged inputs.
fn put_x4(o: u32, v: vec4<u32>) {
  xs[o] = h2_bits(v.x);
  xs[o + 4u] = h2_bits(v.y);
  xs[o + 8u] = h2_bits(v.z);
  xs[o + 12u] = h2_bits(v.w);
}

// This thread's words of a slot's chunk into its staged row. The four lanes of a slot store
// consecutive words, and the eight slots of a subgroup land VK (20 or 36) words apart: every lane
// of a store in its own bank.
fn put_x(buf: u32, slot: u32, q: u32, v: XWords) {
  let o = buf * XSZ + slot * VK + q;
#ifdef SPLIT
  put_x4(o, v.hi);
  put_x4(o + 16u, v.lo);
#else
  put_x4(o, v);
#endif
}

// Words q, q + 4, q + 8, q + 12 of 16 from word i of xh.
fn xat4(i: u32) -> vec4<u32> {
  return vec4<u32>(xh[i], xh[i + 4u], xh[i + 8u], xh[i + 12u]);
}

// A slot's chunk c, this thread's words: the lanes of a slot read its 64 (128) bytes together.
fn xat(slot: u32, c: u32, q: u32) -> XWords {
  let i = slot_x[slot] + XCW * c + q;
#ifdef SPLIT
  return XWords(xat4(i), xat4(i + 16u));
#else
  return xat4(i);
#endif
}

// Loads chunk c's inputs of this thread's slots (s, s + 32, ...) and, under PREFETCH, its weight
// row's words into registers. Slots past the tile's n are not read: their columns of the staged
// inputs keep stale values, which reach only their own (unwritten) columns of the products.
fn load(c: u32, s: u32, q: u32, n: u32, live: bool, w_byte: u32) {
  if (s < n) {
    xraw.v0 = xat(s, c, q);
  }
  if (XPT > 1u && s + 32u < n) {
    xraw.v1 = xat(s + 32u, c, q);
  }
  if (XPT > 2u && s + 64u < n) {
    xraw.v2 = xat(s + 64u, c, q);
    if (s + 96u < n) {
      xraw.v3 = xat(s + 96u, c, q);
    }
  }
#ifdef PREFETCH
  if (live) {
    wraw = load32(w_byte, c);
  }
#endif
}

// Stages chunk c (loaded by `load`, or dequantized here without PREFETCH) into buffer `buf`:
// weight row r (rows past the part's stay stale, as slots do) and the slots' inputs.
fn stage(buf: u32, c: u32, r: u32, s: u32, q: u32, n: u32, live: bool, w_byte: u32) {
  if (live) {
#ifdef PREFETCH
    put_w(buf, r, decode32(wraw));
#else
    put_w(buf, r, dequant32(w_byte, c));
#endif
  }
  if (s < n) {
    put_x(buf, s, q, xraw.v0);
  }
  if (XPT > 1u && s + 32u < n) {
    put_x(buf, s + 32u, q, xraw.v1);
  }
  if (XPT > 2u && s + 64u < n) {
    put_x(buf, s + 64u, q, xraw.v2);
    if (s + 96u < n) {
      put_x(buf, s + 96u, q, xraw.v3);
    }
  }
}

// Writes one 16 × 16 result of this subgroup (rows row0.., slots col0..) to y, through `outs`:
// lane l takes elements l, l + 32, ...: half a slot's 16 rows each, so a store instruction writes
// two runs of 16 consecutive floats. The barriers keep the subgroup's loads of `outs` between its
// store and its next one; every subgroup calls this equally often.
fn emit(m: MatC, sg: u32, lane: u32, row0: u32, col0: u32, n: u32, y_row0: u32) {
  store_c(m, sg * 256u);
  workgroupBarrier();
  for (var e = 0u; e < 8u; e++) {
    let idx = 32u * e + lane;
    let slot = col0 + idx / 16u;
    let row = row0 + idx % 16u;
    if (slot < n && row < params.rows) {
      put(slot_y[slot] + y_row0 + row, outs[sg * 256u + idx] * slot_s[slot]);
    }
  }
  workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
#ifndef EMULATE
  @builtin(subgroup_id) subgroup: u32,
  @builtin(subgroup_invocation_id) subgroup_lane: u32,
#endif
) {
#ifdef EMULATE
  let sg = lid / 32u;
  let lane = lid % 32u;
  lane_id = lane;
#else
  let sg = subgroup;
  let lane = subgroup_lane;
#endif
  let tile = wid.x + wid.y * nwg.x;
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
  let base = wid.z * BN;
  let n = min(BN, params.tokens - base);
  let part_row0 = 0u;
  let y_row0 = params.row_base;
#endif
  fill_iq4_table(lid);
  if (lid < n) {
#ifdef GATHERED
    let slot = ids[1u + params.ids_stride + base + lid];
    let t = slot / params.n_used;
    let i = slot % params.n_used;
#else
    let t = base + lid;
    let i = 0u;
#endif
    let xrow = t * params.xh_stride_t + i * params.xh_stride_i;
    slot_x[lid] = xrow * (params.k / 32u) * XCW;
    slot_s[lid] = xscale[xrow];
    slot_y[lid] = params.y_offset + t * params.y_stride_t + i * params.y_stride_i;
  }
  workgroupBarrier();

  // Thread lid stages weight row lid (threads past BM none) and quarter q of slots s, s + 32, ...
  let row0 = tile * BM;
  let live = lid < BM && row0 + lid < params.rows;
  let w_byte = (part_row0 + row0 + lid) * row_bytes();
  let s = lid / 4u;
  let q = lid % 4u;
  // This subgroup's rows and slots of the tile.
  let wr0 = (sg / SGC) * (16u * FM);
  let wc0 = (sg % SGC) * (16u * FN);

  var c00: MatC;
  var c01: MatC;
  var c02: MatC;
  var c03: MatC;
  var c10: MatC;
  var c11: MatC;
  var c12: MatC;
  var c13: MatC;
  var c20: MatC;
  var c21: MatC;
  var c22: MatC;
  var c23: MatC;
  var c30: MatC;
  var c31: MatC;
  var c32: MatC;
  var c33: MatC;

  let chunks = params.k / 32u;
  load(0u, s, q, n, live, w_byte);
  stage(0u, 0u, lid, s, q, n, live, w_byte);
  if (chunks > 1u) {
    load(1u, s, q, n, live, w_byte);
  }
  workgroupBarrier();
  for (var c = 0u; c < chunks; c++) {
    let cur = c % STAGES;
    // Two stages: chunk c + 1 goes into the other buffer while this one's products run; the
    // barrier below ends both. One stage: it waits for the products (second barrier).
    if (STAGES == 2u && c + 1u < chunks) {
      stage(1u - cur, c + 1u, lid, s, q, n, live, w_byte);
      if (c + 2u < chunks) {
        load(c + 2u, s, q, n, live, w_byte);
      }
    }
    for (var kk = 0u; kk < 2u; kk++) {
      let wo = cur * WSZ + 16u * kk * SW + wr0;
      let xo = cur * XSZ + wc0 * VK + 8u * kk;
      let h0 = load_b(xo);
      let l0 = load_lo(xo);
      let s0 = his(h0);
      var h1: MatB;
      var l1: MatB;
      var s1: MatB;
      var h2: MatB;
      var l2: MatB;
      var s2: MatB;
      var h3: MatB;
      var l3: MatB;
      var s3: MatB;
      if (FN > 1u) {
        h1 = load_b(xo + 16u * VK);
        l1 = load_lo(xo + 16u * VK);
        s1 = his(h1);
      }
      if (FN > 2u) {
        h2 = load_b(xo + 32u * VK);
        l2 = load_lo(xo + 32u * VK);
        s2 = his(h2);
        h3 = load_b(xo + 48u * VK);
        l3 = load_lo(xo + 48u * VK);
        s3 = his(h3);
      }
      // A row block's weights at a time, against every slot block of the subgroup.
      let a0 = load_a(wo);
      let b0 = load_wb(wo);
      c00 = prod(a0, b0, h0, l0, s0, c00);
      if (FN > 1u) {
        c01 = prod(a0, b0, h1, l1, s1, c01);
      }
      if (FN > 2u) {
        c02 = prod(a0, b0, h2, l2, s2, c02);
        c03 = prod(a0, b0, h3, l3, s3, c03);
      }
      if (FM > 1u) {
        let a1 = load_a(wo + 16u);
        let b1 = load_wb(wo + 16u);
        c10 = prod(a1, b1, h0, l0, s0, c10);
        if (FN > 1u) {
          c11 = prod(a1, b1, h1, l1, s1, c11);
        }
        if (FN > 2u) {
          c12 = prod(a1, b1, h2, l2, s2, c12);
          c13 = prod(a1, b1, h3, l3, s3, c13);
        }
      }
      if (FM > 2u) {
        let a2 = load_a(wo + 32u);
        let b2 = load_wb(wo + 32u);
        c20 = prod(a2, b2, h0, l0, s0, c20);
        let a3 = load_a(wo + 48u);
        let b3 = load_wb(wo + 48u);
        c30 = prod(a3, b3, h0, l0, s0, c30);
        if (FN > 1u) {
          c21 = prod(a2, b2, h1, l1, s1, c21);
          c31 = prod(a3, b3, h1, l1, s1, c31);
        }
        if (FN > 2u) {
          c22 = prod(a2, b2, h2, l2, s2, c22);
          c23 = prod(a2, b2, h3, l3, s3, c23);
          c32 = prod(a3, b3, h2, l2, s2, c32);
          c33 = prod(a3, b3, h3, l3, s3, c33);
        }
      }
    }
    workgroupBarrier();
    if (STAGES == 1u && c + 1u < chunks) {
      stage(0u, c + 1u, lid, s, q, n, live, w_byte);
      if (c + 2u < chunks) {
        load(c + 2u, s, q, n, live, w_byte);
      }
      workgroupBarrier();
    }
  }

  let r0 = row0 + wr0;
  emit(c00, sg, lane, r0, wc0, n, y_row0);
  if (FN > 1u) {
    emit(c01, sg, lane, r0, wc0 + 16u, n, y_row0);
  }
  if (FN > 2u) {
    emit(c02, sg, lane, r0, wc0 + 32u, n, y_row0);
    emit(c03, sg, lane, r0, wc0 + 48u, n, y_row0);
  }
  if (FM > 1u) {
    emit(c10, sg, lane, r0 + 16u, wc0, n, y_row0);
    if (FN > 1u) {
      emit(c11, sg, lane, r0 + 16u, wc0 + 16u, n, y_row0);
    }
    if (FN > 2u) {
      emit(c12, sg, lane, r0 + 16u, wc0 + 32u, n, y_row0);
      emit(c13, sg, lane, r0 + 16u, wc0 + 48u, n, y_row0);
    }
  }
  if (FM > 2u) {
    emit(c20, sg, lane, r0 + 32u, wc0, n, y_row0);
    emit(c30, sg, lane, r0 + 48u, wc0, n, y_row0);
    if (FN > 1u) {
      emit(c21, sg, lane, r0 + 32u, wc0 + 16u, n, y_row0);
      emit(c31, sg, lane, r0 + 48u, wc0 + 16u, n, y_row0);
    }
    if (FN > 2u) {
      emit(c22, sg, lane, r0 + 32u, wc0 + 32u, n, y_row0);
      emit(c23, sg, lane, r0 + 32u, wc0 + 48u, n, y_row0);
      emit(c32, sg, lane, r0 + 48u, wc0 + 32u, n, y_row0);
      emit(c33, sg, lane, r0 + 48u, wc0 + 48u, n, y_row0);
    }
  }
}
