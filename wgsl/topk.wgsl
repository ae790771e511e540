// topk: the k largest values of one row with their indices, descending (ties: lower index first),
// for any k up to MAXK (mode 1), or the row's log-sum-exp (mode 0). Matches
// engine/reference/logits.ts argmaxTopK and logSumExp.
// Bindings: 0 src: row r at src_offset + r·src_stride + i, n values f32; values ≤ MASKED
//   (logit_adjust's masked tokens) are no candidates and add nothing to the sum | 1 dst: row r's
//   results at dst_offset + r·dst_stride: k (f32 bits, index) u32 pairs (mode 1), then the
//   log-sum-exp as f32 bits at 2·k (mode 0) | 2 params.
// Dispatch: (groups, 1, rows); workgroup (g, r) takes the chunk [g·chunk, (g+1)·chunk) of row r.
//   With one group it writes the results; with more, its partials go to dst (scratch) from
//   r·scratch_stride: mode 1 its chunk's top k at 2·k·g, mode 0 its (max, sum of exp) at 2·g.
//   WG = 256. Missing entries (k above the candidates) are (MASKED, 0xffffffff). Rows are
//   independent: a row's results are the bits it gets alone.
// Variants: MERGE, one workgroup a row finishing what `groups` workgroups left in src (u32,
//   row r's from r·scratch_stride): mode 1 the top k of their groups·k candidates (n = groups·k),
//   mode 0 the log-sum-exp of their n = groups partials. Every entry of the row's top k is among its chunk's top k, and the chunks
//   come in index order with each sorted, so among equal values the lower position is the lower
//   index and the merge picks what one pass over the row would.
//
// Mode 0 is one pass of online max and sum of exp. Mode 1 histograms each value's key (f32 order
// as u32 order) 8 bits at a time, four passes fixing the k-th largest key (radix select); keys
// above it are gathered, then keys equal to it (the lowest indices first when more tie than
// fit), and a bitonic sort orders the ≤ MAXK candidates. One workgroup reads its values several
// times, each read a chain of dependent loads: spreading the row over groups is what makes a
// vocabulary of 248k cheap.

struct Params {
  n: u32,
  k: u32,
  src_offset: u32,
  mode: u32,
  chunk: u32,
  groups: u32,
  src_stride: u32,
  scratch_stride: u32,
  dst_offset: u32,
  dst_stride: u32,
}

#ifdef MERGE
@group(0) @binding(0) var<storage, read> src: array<u32>;
#else
@group(0) @binding(0) var<storage, read> src: array<f32>;
#endif
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG = 256u;
const MAXK = 1024u;
const NONE = 0xffffffffu;
const MASKED = -0x1.fffffep+127f;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> red_m: array<f32, WG>;
var<workgroup> red_s: array<f32, WG>;
var<workgroup> counts: array<u32, WG>;
var<workgroup> sk: array<u32, MAXK>;
var<workgroup> si: array<u32, MAXK>;
var<workgroup> taken: atomic<u32>;
var<workgroup> valid_total: atomic<u32>;
// Broadcast by thread 0: the key prefix found so far, the entries still needed at that prefix,
// the candidates to return (min(k, valid)), and how many entries share the last bin's key.
var<workgroup> wg_prefix: u32;
var<workgroup> wg_need: u32;
var<workgroup> wg_kk: u32;
var<workgroup> wg_ties: u32;

// f32 order as u32 order; -0 is keyed as +0 so that the two tie as they compare.
fn key_of(v: f32) -> u32 {
  var b = bitcast<u32>(v);
  if (b == 0x80000000u) {
    b = 0u;
  }
  if ((b & 0x80000000u) != 0u) {
    return ~b;
  }
  return b | 0x80000000u;
}

fn value_of(key: u32) -> f32 {
  if ((key & 0x80000000u) != 0u) {
    return bitcast<f32>(key & 0x7fffffffu);
  }
  return bitcast<f32>(~key);
}

// Where this workgroup's entries start in src (under MERGE, its row's partials), and the index of
// its first one.
var<private> off: u32;
var<private> first_id: u32;

// Entry e of this workgroup: its value and its index in the row.
fn value_at(e: u32) -> f32 {
#ifdef MERGE
  return bitcast<f32>(src[off + 2u * e]);
#else
  return src[off + e];
#endif
}

fn id_at(e: u32) -> u32 {
#ifdef MERGE
  return src[off + 2u * e + 1u];
#else
  return first_id + e;
#endif
}

// Entry a comes before entry b: larger key, then lower index.
fn before(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
  return ka > kb || (ka == kb && ia < ib);
}

@compute @workgroup_size(WG)
fn main(
  @builtin(local_invocation_index) lid: u32,
  @builtin(workgroup_id) wid: vec3<u32>,
) {
  let row = wid.z;
  let final_at = params.dst_offset + row * params.dst_stride;
#ifdef MERGE
  off = row * params.scratch_stride;
  let n = params.n;
  let out_at = final_at;
  let partial = false;
#else
  first_id = wid.x * params.chunk;
  off = params.src_offset + row * params.src_stride + first_id;
  let n = min(params.chunk, params.n - first_id);
  // A group of several writes its partials to its own place in its row's scratch.
  let partial = params.groups > 1u;
  let scratch_at = row * params.scratch_stride;
  let out_at = select(final_at, scratch_at + 2u * params.k * wid.x, partial);
#endif

  if (params.mode == 0u) {
    // Online max and sum of exp, per thread, then merged pairwise.
    var m = MASKED;
    var s = 0.0;
#ifdef MERGE
    for (var g = lid; g < n; g += WG) {
      let m2 = bitcast<f32>(src[off + 2u * g]);
      let s2 = bitcast<f32>(src[off + 2u * g + 1u]);
      let mm = max(m, m2);
      s = s * exp(m - mm) + s2 * exp(m2 - mm);
      m = mm;
    }
#else
    for (var e = lid; e < n; e += WG) {
      let v = value_at(e);
      if (v > MASKED) {
        if (v > m) {
          s = s * exp(m - v) + 1.0;
          m = v;
        } else {
          s += exp(v - m);
        }
      }
    }
#endif
    red_m[lid] = m;
    red_s[lid] = s;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w >>= 1u) {
      if (lid < w) {
        let m2 = red_m[lid + w];
        let mm = max(red_m[lid], m2);
        red_s[lid] = red_s[lid] * exp(red_m[lid] - mm) + red_s[lid + w] * exp(m2 - mm);
        red_m[lid] = mm;
      }
      workgroupBarrier();
    }
    // No return under lid == 0 (Tint's uniformity analysis would reject the barriers below).
#ifndef MERGE
    if (lid == 0u && partial) {
      dst[scratch_at + 2u * wid.x] = bitcast<u32>(red_m[0]);
      dst[scratch_at + 2u * wid.x + 1u] = bitcast<u32>(red_s[0]);
    }
#endif
    if (lid == 0u && !partial) {
      dst[final_at + 2u * params.k] = bitcast<u32>(red_m[0] + log(red_s[0]));
    }
    return;
  }

  // The valid count and a histogram of the top key byte.
  var valid = 0u;
  for (var e = lid; e < n; e += WG) {
    let v = value_at(e);
    if (v > MASKED) {
      valid += 1u;
      atomicAdd(&hist[key_of(v) >> 24u], 1u);
    }
  }
  atomicAdd(&valid_total, valid);
  workgroupBarrier();
  if (lid == 0u) {
    let kk = min(params.k, atomicLoad(&valid_total));
    wg_prefix = 0u;
    wg_need = kk;
    wg_kk = kk;
    wg_ties = 0u;
  }
  workgroupBarrier();

  // Radix select: the k-th largest key, one byte per pass, high byte first.
  for (var digit = 0u; digit < 4u; digit++) {
    let shift = 24u - 8u * digit;
    if (digit > 0u) {
      let high = ~((1u << (shift + 8u)) - 1u);
      let prefix = wg_prefix;
      atomicStore(&hist[lid], 0u);
      workgroupBarrier();
      for (var e = lid; e < n; e += WG) {
        let v = value_at(e);
        let key = key_of(v);
        if (v > MASKED && (key & high) == prefix) {
          atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
      }
      workgroupBarrier();
    }
    if (lid == 0u && wg_need > 0u) {
      var need = wg_need;
      var b = 256u;
      loop {
        b -= 1u;
        let c = atomicLoad(&hist[b]);
        if (c >= need || b == 0u) {
          wg_ties = c;
          break;
        }
        need -= c;
      }
      wg_prefix = wg_prefix | (b << shift);
      wg_need = need;
    }
    workgroupBarrier();
  }

  let kk = workgroupUniformLoad(&wg_kk);
  let threshold = workgroupUniformLoad(&wg_prefix);
  let need = workgroupUniformLoad(&wg_need);
  let ties = workgroupUniformLoad(&wg_ties);
  // Keys above the threshold, and the threshold's own when every one of them fits.
  for (var e = lid; e < n; e += WG) {
    let v = value_at(e);
    let key = key_of(v);
    if (kk > 0u && v > MASKED && (key > threshold || (key == threshold && ties == need))) {
      let at = atomicAdd(&taken, 1u);
      sk[at] = key;
      si[at] = id_at(e);
    }
  }
  workgroupBarrier();
  // More ties than places: the lowest indices, from contiguous per-thread ranges in order.
  if (ties != need && kk > 0u) {
    let per = (n + WG - 1u) / WG;
    let lo = min(n, lid * per);
    let hi = min(n, lo + per);
    var c = 0u;
    for (var e = lo; e < hi; e++) {
      let v = value_at(e);
      if (v > MASKED && key_of(v) == threshold) {
        c += 1u;
      }
    }
    counts[lid] = c;
    workgroupBarrier();
    if (lid == 0u) {
      var acc = 0u;
      for (var t = 0u; t < WG; t++) {
        let ct = counts[t];
        counts[t] = acc;
        acc += ct;
      }
    }
    workgroupBarrier();
    let start = kk - need;
    var rank = counts[lid];
    for (var e = lo; e < hi && rank < need; e++) {
      let v = value_at(e);
      if (v > MASKED && key_of(v) == threshold) {
        sk[start + rank] = threshold;
        si[start + rank] = id_at(e);
        rank += 1u;
      }
    }
    workgroupBarrier();
  }

  // Bitonic sort of the kk candidates, padded to a power of two with entries that sort last.
  var size = 1u;
  while (size < kk) {
    size <<= 1u;
  }
  for (var i = kk + lid; i < size; i += WG) {
    sk[i] = 0u;
    si[i] = NONE;
  }
  workgroupBarrier();
  for (var block = 2u; block <= size; block <<= 1u) {
    for (var stride = block / 2u; stride > 0u; stride >>= 1u) {
      for (var t = lid; t < size / 2u; t += WG) {
        let i = 2u * stride * (t / stride) + t % stride;
        let j = i + stride;
        let descending = (i & block) == 0u;
        let swap = select(
          before(sk[i], si[i], sk[j], si[j]),
          before(sk[j], si[j], sk[i], si[i]),
          descending,
        );
        if (swap) {
          let tk = sk[i];
          let ti = si[i];
          sk[i] = sk[j];
          si[i] = si[j];
          sk[j] = tk;
          si[j] = ti;
        }
      }
      workgroupBarrier();
    }
  }

  for (var r = lid; r < params.k; r += WG) {
    if (r < kk) {
      dst[out_at + 2u * r] = bitcast<u32>(value_of(sk[r]));
      dst[out_at + 2u * r + 1u] = si[r];
    } else {
      dst[out_at + 2u * r] = bitcast<u32>(MASKED);
      dst[out_at + 2u * r + 1u] = NONE;
    }
  }
}
