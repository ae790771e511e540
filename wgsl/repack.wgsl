// repack: rows of a weight tensor from the GGUF file's layout (src) into the GPU's (dst), for the
// types engine/gpu/weight_layout.ts lays out anew (Q8_0, Q6_K); an invocation writes one word.
// Runs once a part while the weights load, so the host only reads the file. Matches
// engine/quant/dequant.ts's values as wgsl/_include/dequant.wgsl reads them
// (tests/gpu_weight_layout_test.ts).
// Bindings: 0 src: the file's rows from byte 0, 4 bytes of padding past the last | 1 dst | params.
// Dispatch: ⌈rows · row_words / 256⌉ workgroups, folded to 2-D (x at most 65535).
// Variants: TYPE_Q8_0, TYPE_Q6_K.

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

struct Params {
  rows: u32,
  k: u32,
  src_row_bytes: u32,
  row_words: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

// The 4 bytes at an even byte offset of src (the file's blocks have even sizes).
fn src_word(b: u32) -> u32 {
  let i = b >> 2u;
  if ((b & 2u) == 0u) {
    return src[i];
  }
  return (src[i] >> 16u) | (src[i + 1u] << 16u);
}

#ifdef TYPE_Q8_0
// Word w of a 272-byte block g: quants of file block 8g + w/8 (w < 64), else the d of blocks
// 8g + 2(w − 64) and the next; zeros past the row's last block.
fn word(row: u32, wi: u32) -> u32 {
  let g = wi / 68u;
  let w = wi % 68u;
  let blocks = params.k / 32u;
  let base = row * params.src_row_bytes;
  if (w < 64u) {
    let b = 8u * g + w / 8u;
    if (b >= blocks) {
      return 0u;
    }
    return src_word(base + 34u * b + 2u + 4u * (w % 8u));
  }
  let b0 = 8u * g + 2u * (w - 64u);
  var out = 0u;
  if (b0 < blocks) {
    out = src_word(base + 34u * b0) & 0xffffu;
  }
  if (b0 + 1u < blocks) {
    out = out | (src_word(base + 34u * (b0 + 1u)) << 16u);
  }
  return out;
}
#endif

#ifdef TYPE_Q6_K
// Word w of a 288-byte block i: values 4w..4w+3 (w < 64; element 128n + 32k + l takes nibble
// k >> 1 of ql[64n + 32(k & 1) + l] and bits 2k of qh[32n + l], four bytes at once), then the
// 16 scales, d, zeros.
fn word(row: u32, wi: u32) -> u32 {
  let i = wi / 72u;
  let w = wi % 72u;
  let blk = row * params.src_row_bytes + 210u * i;
  if (w < 64u) {
    let e = 4u * w;
    let n = e / 128u;
    let k = (e % 128u) / 32u;
    let l = e % 32u;
    let ql = src_word(blk + 64u * n + 32u * (k & 1u) + l);
    let qh = src_word(blk + 128u + 32u * n + l);
    return ((ql >> (4u * (k >> 1u))) & 0x0f0f0f0fu) | (((qh >> (2u * k)) & 0x03030303u) << 4u);
  }
  if (w < 68u) {
    return src_word(blk + 192u + 4u * (w - 64u));
  }
  if (w == 68u) {
    return src_word(blk + 208u) & 0xffffu;
  }
  return 0u;
}
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let o = gid.x + gid.y * groups.x * 256u;
  if (o >= params.rows * params.row_words) {
    return;
  }
  dst[o] = word(o / params.row_words, o % params.row_words);
}
