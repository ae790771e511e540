// dequant: 32 consecutive weights of one row, as f32, for every GGUF weight type the engine runs.
// Matches engine/quant/dequant.ts (llama.cpp dequantize_row_*) exactly; docs/model_arch.md §6.
// Contract: the including shader declares `var<storage, read> w: array<u32>` (the weight bytes;
// rows start at any even byte offset, IQ4_XS rows at a multiple of 4: whole 136-byte blocks from
// the start of w; Q8_0 and Q6_K in their GPU layouts, engine/gpu/weight_layout.ts, rows at a
// multiple of 16) and defines exactly one TYPE_<name> flag; or, with TYPE_F32, TYPE_Q8_0 or
// TYPE_Q6_K and W_VEC4, `w: array<vec4<u32>>` (rows at 16-byte offsets: one load a vec4).
// Provides BLOCK_ELEMS, BLOCK_BYTES, bytes_of_row(k) and dequant32(row_byte, c): elements
// 32c..32c+31 of the row starting at byte `row_byte`, as 8 vec4 (element 32c+4v+j is component j
// of vec4 v). F32, Q8_0
// and IQ4_XS also split it as decode32(load32(row_byte, c)): load32 only loads (a Raw of words
// and shifts), so a tile can hold the next chunk's words while it computes (wgsl/mul_mat.wgsl).
// Optional IQ4_TABLE_WORKGROUP (IQ4_NL, IQ4_XS): the lookups read the workgroup copy iq4_table,
// which the includer fills with fill_iq4_table before the first dequant32; a per-thread private
// table indexed by data is slow on some GPUs.
// F32, Q8_0, Q6_K and IQ4_XS (the bench model's types) build their result with no array indexed
// by a variable: the SPIR-V compilers behind both providers kept such arrays in local memory on
// an H200, which cost the decode products several times their time (docs/PERFORMANCE.md).

#ifndef W_VEC4
// Byte `b` of the weight buffer.
fn wbyte(b: u32) -> u32 {
  return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The 4 bytes at any byte offset, little-endian. Part buffers carry 4 bytes of tail padding.
fn wword(b: u32) -> u32 {
  let i = b >> 2u;
  let s = (b & 3u) * 8u;
  if (s == 0u) {
    return w[i];
  }
  return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

// The f16 at an even byte offset, as f32.
fn whalf(b: u32) -> f32 {
  return unpack2x16float(w[b >> 2u] >> ((b & 2u) * 8u)).x;
}
#endif

// The four bytes of a word as a vec4.
fn bytes4(q: u32) -> vec4<u32> {
  return (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// Integers below 2^23 as exact f32 without a conversion instruction: the integer in the mantissa
// of 2^23, minus 2^23 (the same values as vec4<f32>(n)). Conversions run at a quarter of the f32
// rate on NVIDIA GPUs, an OR and a subtraction at the full rate; the prefill GEMMs convert every
// weight once per tile.
fn exact_f32(n: vec4<u32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(n | vec4<u32>(0x4b000000u)) - 8388608.0;
}

// Low and high nibbles of a word's four bytes, as integers and as f32.
fn lo4u(q: u32) -> vec4<u32> {
  return (vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
}
fn hi4u(q: u32) -> vec4<u32> {
  return (vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u);
}
fn lo4(q: u32) -> vec4<f32> {
  return exact_f32(lo4u(q));
}
fn hi4(q: u32) -> vec4<f32> {
  return exact_f32(hi4u(q));
}

// The four signed bytes of a word: each byte offset by 128 into 0..255, then 2^23 + 128 taken
// off (exact: both sides lie within 256 of 2^23).
fn i8x4(q: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>((bytes4(q) ^ vec4<u32>(0x80u)) | vec4<u32>(0x4b000000u)) - 8388736.0;
}

// kvalues_iq4nl (ggml-common.h), shared by IQ4_NL and IQ4_XS.
var<private> KV_IQ4: array<f32, 16> = array<f32, 16>(
  -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// The table values of four nibbles, indexed by the integers (no round trip through f32).
#ifdef IQ4_TABLE_WORKGROUP
var<workgroup> iq4_table: array<f32, 16>;

fn iq4(nib: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(iq4_table[nib.x], iq4_table[nib.y], iq4_table[nib.z], iq4_table[nib.w]);
}
#else
fn iq4(nib: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(KV_IQ4[nib.x], KV_IQ4[nib.y], KV_IQ4[nib.z], KV_IQ4[nib.w]);
}
#endif

// Fills iq4_table under IQ4_TABLE_WORKGROUP (nothing otherwise): the includer calls it from
// uniform control flow with its local_invocation_index before the first dequant32.
fn fill_iq4_table(lid: u32) {
#ifdef IQ4_TABLE_WORKGROUP
  if (lid < 16u) {
    iq4_table[lid] = KV_IQ4[lid];
  }
  workgroupBarrier();
#endif
}

#ifndef W_VEC4
// Q4_K/Q5_K 6-bit scale and min of sub-block j from the 12 scale bytes at `s` (get_scale_min_k4).
fn scale_min_k4(s: u32, j: u32) -> vec2<f32> {
  if (j < 4u) {
    return vec2<f32>(f32(wbyte(s + j) & 63u), f32(wbyte(s + j + 4u) & 63u));
  }
  let sc = (wbyte(s + j + 4u) & 15u) | ((wbyte(s + j - 4u) >> 6u) << 4u);
  let m = (wbyte(s + j + 4u) >> 4u) | ((wbyte(s + j) >> 6u) << 4u);
  return vec2<f32>(f32(sc), f32(m));
}
#endif

#ifdef TYPE_F32
const BLOCK_ELEMS = 1u;
const BLOCK_BYTES = 4u;
// Words i..i+3 of the row (i a multiple of 4 under W_VEC4).
fn f32x4(i: u32) -> vec4<f32> {
#ifdef W_VEC4
  return bitcast<vec4<f32>>(w[i >> 2u]);
#else
  return bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
#endif
}

// The chunk's values as they load: decoding is only regrouping them.
struct Raw {
  v0: vec4<f32>,
  v1: vec4<f32>,
  v2: vec4<f32>,
  v3: vec4<f32>,
  v4: vec4<f32>,
  v5: vec4<f32>,
  v6: vec4<f32>,
  v7: vec4<f32>,
}

fn load32(row_byte: u32, c: u32) -> Raw {
  let i = (row_byte >> 2u) + c * 32u;
  return Raw(
    f32x4(i), f32x4(i + 4u), f32x4(i + 8u), f32x4(i + 12u),
    f32x4(i + 16u), f32x4(i + 20u), f32x4(i + 24u), f32x4(i + 28u),
  );
}

fn decode32(r: Raw) -> array<vec4<f32>, 8> {
  return array<vec4<f32>, 8>(r.v0, r.v1, r.v2, r.v3, r.v4, r.v5, r.v6, r.v7);
}

fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  return decode32(load32(row_byte, c));
}
#endif

#ifdef TYPE_F16
const BLOCK_ELEMS = 1u;
const BLOCK_BYTES = 2u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let base = (row_byte >> 2u) + c * 16u;
  for (var v = 0u; v < 8u; v++) {
    r[v] = vec4<f32>(unpack2x16float(w[base + 2u * v]), unpack2x16float(w[base + 2u * v + 1u]));
  }
  return r;
}
#endif

#ifdef TYPE_BF16
const BLOCK_ELEMS = 1u;
const BLOCK_BYTES = 2u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let base = (row_byte >> 2u) + c * 16u;
  for (var v = 0u; v < 8u; v++) {
    let a = w[base + 2u * v];
    let b = w[base + 2u * v + 1u];
    r[v] = bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
  }
  return r;
}
#endif

#ifdef TYPE_Q8_0
// The GPU's Q8_0 (engine/gpu/weight_layout.ts repacks the file's at upload): eight of the file's
// blocks as one of 272 bytes, their 256 quants in element order, then their eight d (f16); a row
// ends in a whole such block (zeros past its values), so rows lie at 16-byte offsets. A chunk is
// eight aligned words of quants and the word holding its d (under W_VEC4: two 16-byte loads and
// one), where the file's 34-byte blocks needed nine misaligned words shifted into place.
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 272u;
struct Raw {
  dw: u32,
  dsh: u32,
  q0: vec4<u32>,
  q1: vec4<u32>,
}

fn load32(row_byte: u32, c: u32) -> Raw {
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let j = c & 7u;
#ifdef W_VEC4
  let dv = w[(b >> 4u) + 16u];
  let dw = select(select(dv.x, dv.y, j >= 2u), select(dv.z, dv.w, j >= 6u), j >= 4u);
  return Raw(dw, (j & 1u) * 16u, w[(b >> 4u) + 2u * j], w[(b >> 4u) + 2u * j + 1u]);
#else
  let i = (b >> 2u) + 8u * j;
  return Raw(
    w[(b >> 2u) + 64u + (j >> 1u)], (j & 1u) * 16u,
    vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]),
    vec4<u32>(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]),
  );
#endif
}

fn decode32(r: Raw) -> array<vec4<f32>, 8> {
  let d = unpack2x16float(r.dw >> r.dsh).x;
  return array<vec4<f32>, 8>(
    i8x4(r.q0.x) * d, i8x4(r.q0.y) * d, i8x4(r.q0.z) * d, i8x4(r.q0.w) * d,
    i8x4(r.q1.x) * d, i8x4(r.q1.y) * d, i8x4(r.q1.z) * d, i8x4(r.q1.w) * d,
  );
}

fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  return decode32(load32(row_byte, c));
}
#endif

#ifdef TYPE_Q4_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + c * BLOCK_BYTES;
  let d = whalf(b);
  for (var v = 0u; v < 4u; v++) {
    let q = wword(b + 2u + 4u * v);
    r[v] = (lo4(q) - 8.0) * d;
    r[v + 4u] = (hi4(q) - 8.0) * d;
  }
  return r;
}
#endif

#ifdef TYPE_Q4_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 20u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + c * BLOCK_BYTES;
  let d = whalf(b);
  let m = whalf(b + 2u);
  for (var v = 0u; v < 4u; v++) {
    let q = wword(b + 4u + 4u * v);
    r[v] = lo4(q) * d + m;
    r[v + 4u] = hi4(q) * d + m;
  }
  return r;
}
#endif

#ifdef TYPE_Q5_0
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 22u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + c * BLOCK_BYTES;
  let d = whalf(b);
  let qh = wword(b + 2u);
  for (var v = 0u; v < 4u; v++) {
    let q = wword(b + 6u + 4u * v);
    let j = vec4<u32>(4u * v) + vec4<u32>(0u, 1u, 2u, 3u);
    let hl = ((vec4<u32>(qh) >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
    let hh = ((vec4<u32>(qh) >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    r[v] = (exact_f32(lo4u(q) | hl) - 16.0) * d;
    r[v + 4u] = (exact_f32(hi4u(q) | hh) - 16.0) * d;
  }
  return r;
}
#endif

#ifdef TYPE_Q5_1
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 24u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + c * BLOCK_BYTES;
  let d = whalf(b);
  let m = whalf(b + 2u);
  let qh = wword(b + 4u);
  for (var v = 0u; v < 4u; v++) {
    let q = wword(b + 8u + 4u * v);
    let j = vec4<u32>(4u * v) + vec4<u32>(0u, 1u, 2u, 3u);
    let hl = ((vec4<u32>(qh) >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
    let hh = ((vec4<u32>(qh) >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    r[v] = exact_f32(lo4u(q) | hl) * d + m;
    r[v + 4u] = exact_f32(hi4u(q) | hh) * d + m;
  }
  return r;
}
#endif

#ifdef TYPE_IQ4_NL
const BLOCK_ELEMS = 32u;
const BLOCK_BYTES = 18u;
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + c * BLOCK_BYTES;
  let d = whalf(b);
  for (var v = 0u; v < 4u; v++) {
    let q = wword(b + 2u + 4u * v);
    r[v] = iq4(lo4u(q)) * d;
    r[v + 4u] = iq4(hi4u(q)) * d;
  }
  return r;
}
#endif

#ifdef TYPE_Q2_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 84u;
// Chunk c: half n = c/4 of the super-block, bit pair j = c%4 of qs[32n .. 32n+31]; elements
// 0..15 use scale byte 8n+2j, elements 16..31 scale byte 8n+2j+1 (low nibble scale, high min).
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let sub = c & 7u;
  let n = sub >> 2u;
  let shift = 2u * (sub & 3u);
  let d = whalf(b + 80u);
  let dmin = whalf(b + 82u);
  for (var v = 0u; v < 8u; v++) {
    let sc = wbyte(b + 8u * n + 2u * (sub & 3u) + v / 4u);
    let dl = d * f32(sc & 15u);
    let ml = dmin * f32(sc >> 4u);
    let q = exact_f32((bytes4(wword(b + 16u + 32u * n + 4u * v)) >> vec4<u32>(shift)) & vec4<u32>(3u));
    r[v] = dl * q - ml;
  }
  return r;
}
#endif

#ifdef TYPE_Q3_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 110u;
// Chunk c: half n = c/4, bit pair j = c%4 of qs[32n + l]; high bit from hmask[l] bit 4n+j
// (value −4 when clear); 6-bit signed scales 8n+2j (l < 16) and 8n+2j+1 (l ≥ 16).
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let sub = c & 7u;
  let n = sub >> 2u;
  let j = sub & 3u;
  let d = whalf(b + 108u);
  for (var v = 0u; v < 8u; v++) {
    let is = 8u * n + 2u * j + v / 4u;
    var low: u32;
    if (is < 8u) {
      low = wbyte(b + 96u + is) & 15u;
    } else {
      low = wbyte(b + 96u + is - 8u) >> 4u;
    }
    let high = (wbyte(b + 96u + 8u + (is % 4u)) >> (2u * (is / 4u))) & 3u;
    let dl = d * f32(i32(low | (high << 4u)) - 32);
    let q = (bytes4(wword(b + 32u + 32u * n + 4u * v)) >> vec4<u32>(2u * j)) & vec4<u32>(3u);
    let h = (bytes4(wword(b + 4u * v)) >> vec4<u32>(4u * n + j)) & vec4<u32>(1u);
    // q − 4·(1 − h) as one small integer minus 4, exact in any evaluation order: with two
    // exact_f32 values in one float expression, Dawn on the H200 gave wrong Q3_K weights.
    r[v] = dl * (exact_f32(q | (h << vec4<u32>(2u))) - 4.0);
  }
  return r;
}
#endif

#ifdef TYPE_Q4_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 144u;
// Chunk c = sub-block c: nibble (c%2) of qs[32·(c/2) + l], scale/min pair c.
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let sub = c & 7u;
  let sm = scale_min_k4(b + 4u, sub);
  let d1 = whalf(b) * sm.x;
  let m1 = whalf(b + 2u) * sm.y;
  let shift = 4u * (sub & 1u);
  for (var v = 0u; v < 8u; v++) {
    let q = (bytes4(wword(b + 16u + 32u * (sub >> 1u) + 4u * v)) >> vec4<u32>(shift)) & vec4<u32>(15u);
    r[v] = d1 * exact_f32(q) - m1;
  }
  return r;
}
#endif

#ifdef TYPE_Q5_K
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 176u;
// As Q4_K (qs at 48) plus a fifth bit: bit c of qh[l].
fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  var r: array<vec4<f32>, 8>;
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let sub = c & 7u;
  let sm = scale_min_k4(b + 4u, sub);
  let d1 = whalf(b) * sm.x;
  let m1 = whalf(b + 2u) * sm.y;
  let shift = 4u * (sub & 1u);
  for (var v = 0u; v < 8u; v++) {
    let q = (bytes4(wword(b + 48u + 32u * (sub >> 1u) + 4u * v)) >> vec4<u32>(shift)) & vec4<u32>(15u);
    let h = (bytes4(wword(b + 16u + 4u * v)) >> vec4<u32>(sub)) & vec4<u32>(1u);
    r[v] = d1 * exact_f32(q + 16u * h) - m1;
  }
  return r;
}
#endif

#ifdef TYPE_Q6_K
const BLOCK_ELEMS = 256u;
// The GPU's Q6_K block (engine/gpu/weight_layout.ts repacks the file's at upload): the 256 values
// q (0..63) a byte each in element order, the int8 scales at byte 256 (scale e/16 for element e),
// d (f16) at 272, padding to 288, so rows lie at 16-byte offsets; under W_VEC4 a chunk is two
// 16-byte loads of values, one of scales and one for d. A value is d·sc·(q − 32) with d·sc
// first, as llama.cpp's dequantize_row_q6_K and engine/quant/dequant.ts round it.
const BLOCK_BYTES = 288u;

// Four values of one word, q − 32 exactly (2^23 + q less 2^23 + 32), times the scale d·sc.
fn q6k4(q: u32, dsc: f32) -> vec4<f32> {
  return dsc * (bitcast<vec4<f32>>(bytes4(q) | vec4<u32>(0x4b000000u)) - 8388640.0);
}

fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  let b = row_byte + (c >> 3u) * BLOCK_BYTES;
  let sub = c & 7u;
#ifdef W_VEC4
  let lo = w[(b >> 4u) + 2u * sub];
  let hi = w[(b >> 4u) + 2u * sub + 1u];
  let sv = w[(b >> 4u) + 16u];
  let d = unpack2x16float(w[(b >> 4u) + 17u].x).x;
  let sp = select(select(sv.x, sv.y, sub >= 2u), select(sv.z, sv.w, sub >= 6u), sub >= 4u);
  let scw = bitcast<i32>(sp >> ((sub & 1u) * 16u));
  let q = array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
#else
  let at = (b >> 2u) + 8u * sub;
  let d = whalf(b + 272u);
  // Both scales from the halfword at an even offset.
  let s2 = b + 256u + 2u * sub;
  let scw = bitcast<i32>(w[s2 >> 2u] >> ((s2 & 2u) * 8u));
  let q = array<u32, 8>(
    w[at], w[at + 1u], w[at + 2u], w[at + 3u], w[at + 4u], w[at + 5u], w[at + 6u], w[at + 7u],
  );
#endif
  let d0 = d * f32((scw << 24u) >> 24u);
  let d1 = d * f32((scw << 16u) >> 24u);
  return array<vec4<f32>, 8>(
    q6k4(q[0], d0), q6k4(q[1], d0), q6k4(q[2], d0), q6k4(q[3], d0),
    q6k4(q[4], d1), q6k4(q[5], d1), q6k4(q[6], d1), q6k4(q[7], d1),
  );
}
#endif

#ifdef TYPE_IQ4_XS
const BLOCK_ELEMS = 256u;
const BLOCK_BYTES = 136u;
// Chunk c = sub-block ib: 6-bit scale from scales_l nibble and 2 bits of scales_h, offset −32.
// Blocks of 136 bytes from a bound buffer's start: every row starts at a multiple of 4 bytes,
// so each field is read as whole words.
struct Raw {
  // d | scales_h << 16, and scales_l.
  h0: u32,
  h1: u32,
  q0: u32,
  q1: u32,
  q2: u32,
  q3: u32,
  ib: u32,
}

fn load32(row_byte: u32, c: u32) -> Raw {
  let i = (row_byte + (c >> 3u) * BLOCK_BYTES) >> 2u;
  let ib = c & 7u;
  let q = i + 2u + 4u * ib;
  return Raw(w[i], w[i + 1u], w[q], w[q + 1u], w[q + 2u], w[q + 3u], ib);
}

fn decode32(r: Raw) -> array<vec4<f32>, 8> {
  let ib = r.ib;
  let scales_h = r.h0 >> 16u;
  let ls = ((r.h1 >> (8u * (ib / 2u) + 4u * (ib % 2u))) & 15u) | (((scales_h >> (2u * ib)) & 3u) << 4u);
  let dl = unpack2x16float(r.h0).x * f32(i32(ls) - 32);
  return array<vec4<f32>, 8>(
    iq4(lo4u(r.q0)) * dl, iq4(lo4u(r.q1)) * dl, iq4(lo4u(r.q2)) * dl, iq4(lo4u(r.q3)) * dl,
    iq4(hi4u(r.q0)) * dl, iq4(hi4u(r.q1)) * dl, iq4(hi4u(r.q2)) * dl, iq4(hi4u(r.q3)) * dl,
  );
}

fn dequant32(row_byte: u32, c: u32) -> array<vec4<f32>, 8> {
  return decode32(load32(row_byte, c));
}
#endif

// Bytes of a row of k values: whole blocks (Q8_0's last GPU block may hold fewer than 256 values).
fn bytes_of_row(k: u32) -> u32 {
  return ((k + BLOCK_ELEMS - 1u) / BLOCK_ELEMS) * BLOCK_BYTES;
}
