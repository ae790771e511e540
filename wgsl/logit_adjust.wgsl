// logit_adjust: a run's logit adjustments on one row, in place, before argmax and topk: mode 0
// applies the biases and penalties (x → rep(x + bias, repeat) − subtract, rep(v, r) = v / r for
// v > 0, else v · r), mode 1 sets every token the mask does not allow to MASKED (topk then skips
// it). Matches engine/reference/logits.ts adjustLogits (which writes -Infinity for MASKED).
// Bindings: 0 logits: the row at offset + i, n values f32 | 1 mask: u32 words from mask_offset, bit
//   (i & 31) of word i >> 5 allows token i, ids from 32·words on are not allowed | 2 bias: `pairs`
//   records of 4 words from record bias_offset (id u32, bias, repeat, subtract as f32 bits;
//   distinct ids) | 3 params.
// Dispatch: (ceil(pairs / WG)) in mode 0, (ceil(n / WG)) in mode 1; one thread per pair or token.
//   WG = 256. Variants: none.

struct Params {
  n: u32,
  offset: u32,
  words: u32,
  pairs: u32,
  mode: u32,
  mask_offset: u32,
  bias_offset: u32,
}

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read> mask: array<u32>;
@group(0) @binding(2) var<storage, read> bias: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG = 256u;
const MASKED = -0x1.fffffep+127f;

@compute @workgroup_size(WG)
fn main(
  @builtin(global_invocation_id) gid: vec3<u32>,
  @builtin(num_workgroups) groups: vec3<u32>,
) {
  let i = gid.x + gid.y * groups.x * WG;
  if (params.mode == 0u) {
    if (i < params.pairs) {
      let b = 4u * (params.bias_offset + i);
      let at = params.offset + bias[b];
      let v = logits[at] + bitcast<f32>(bias[b + 1u]);
      let r = bitcast<f32>(bias[b + 2u]);
      logits[at] = select(v * r, v / r, v > 0.0) - bitcast<f32>(bias[b + 3u]);
    }
    return;
  }
  if (i < params.n) {
    let word = i >> 5u;
    if (word >= params.words || ((mask[params.mask_offset + word] >> (i & 31u)) & 1u) == 0u) {
      logits[params.offset + i] = MASKED;
    }
  }
}
