// ssm_conv: the DeltaNet causal depthwise conv + SiLU over a run of tokens, with the conv state
// (the last kc−1 raw inputs, oldest first) read at the start and written back at the end.
// Matches engine/reference/deltanet.ts convStep applied token by token (f32 sum, taps in order).
// Bindings: 0 x: raw qkv of token t at x_offset + t·x_stride_t, f32 | 1 w (channels, kc) f32
//   | 2 state (kc−1, channels) f32 | 3 u (t·u_stride_t + c) f32 | 4 params.
// Dispatch: (channel tiles); one thread per channel walks the tokens in order. WG = 64;
//   kc ≤ 8. Variants: none.

struct Params {
  channels: u32,
  kc: u32,
  tokens: u32,
  x_offset: u32,
  x_stride_t: u32,
  u_stride_t: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> u: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG = 64u;
const MAX_KC = 8u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  let C = params.channels;
  if (c >= C) {
    return;
  }
  let kc = params.kc;
  var win: array<f32, MAX_KC>;
  for (var j = 0u; j + 1u < kc; j++) {
    win[j] = state[j * C + c];
  }
  for (var t = 0u; t < params.tokens; t++) {
    let xv = x[params.x_offset + t * params.x_stride_t + c];
    var s = 0.0;
    for (var j = 0u; j + 1u < kc; j++) {
      s += w[c * kc + j] * win[j];
    }
    s += w[c * kc + kc - 1u] * xv;
    u[t * params.u_stride_t + c] = s / (1.0 + exp(-s));
    for (var j = 0u; j + 2u < kc; j++) {
      win[j] = win[j + 1u];
    }
    win[kc - 2u] = xv;
  }
  for (var j = 0u; j + 1u < kc; j++) {
    state[j * C + c] = win[j];
  }
}
