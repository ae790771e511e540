// ssm_conv: the DeltaNet causal depthwise conv + SiLU over a run of tokens, with the conv state
// (the last kc−1 raw inputs, oldest first) read at the start and written back at the end.
// Matches engine/reference/deltanet.ts convStep applied token by token (f32 sum, taps in order,
// explicit fmas: mul_mat_vec's CONV epilogue computes a decode token's the same way, same bits).
// Bindings: 0 x: raw qkv of token t at x_offset + t·x_stride_t, f32 | 1 w (channels, kc) f32
//   | 2 state (kc−1, channels) f32 from state_offset | 3 u (u_offset + t·u_stride_t + c) f32
//   | under MULTI 4 seqs: the step's sequence table, 4 u32 an entry (engine/gpu/gpu_forward.ts
//   SEQ_WORDS: state index, row, tokens, position) | under TRAIL (not with MULTI) 4 trail: the
//   run's history, (kc − 1 + tokens, channels) f32 from trail_offset: the state before the run,
//   then each token's raw input, so that the state after token t is rows t + 1 … t + kc − 1
//   (a rewind copies them back) | params.
// Dispatch: (channel tiles, 1, token groups of RUN); a thread per channel walks the RUN tokens of
//   its group. Under MULTI, (channel tiles, 1, sequences): one token of each of the table's
//   entries seq0.., its rows at row·stride of x and u, its state at index·state_stride.
//   WG = 64; kc ≤ RUN + 1 = 9. Variants: MULTI, TRAIL.
//
// Every token's output is the same sum of the same kc inputs in the same order, read from x, or
// from the state for positions before the run, so a token's bits do not depend on how tokens are
// split into calls. Only group 0 reaches back into the state (later groups start ≥ RUN ≥ kc − 1
// positions in), and the thread that read a channel's state writes it back after its tokens:
// no other invocation touches that channel's state. (One thread walking all tokens per channel
// left 128 workgroups latency-bound for ~0.5 ms per 512-token call on an H200.)

struct Params {
  channels: u32,
  kc: u32,
  tokens: u32,
  x_offset: u32,
  x_stride_t: u32,
  u_offset: u32,
  u_stride_t: u32,
  state_offset: u32,
  state_stride: u32,
  seq0: u32,
  trail_offset: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> u: array<f32>;
#ifdef MULTI
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;
#else
#ifdef TRAIL
@group(0) @binding(4) var<storage, read_write> trail: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;
#else
@group(0) @binding(4) var<uniform> params: Params;
#endif
#endif

const WG = 64u;
const RUN = 8u;

// Where this workgroup's run sits: x and u from its first token, the state, tokens, first token.
struct Run {
  xo: u32,
  uo: u32,
  so: u32,
  tokens: u32,
  t0: u32,
}

fn run_of(wid: vec3<u32>) -> Run {
#ifdef MULTI
  let e = 4u * (params.seq0 + wid.z);
  let row = seqs[e + 1u];
  return Run(
    params.x_offset + row * params.x_stride_t,
    params.u_offset + row * params.u_stride_t,
    params.state_offset + seqs[e] * params.state_stride,
    1u,
    0u,
  );
#else
  return Run(params.x_offset, params.u_offset, params.state_offset, params.tokens, wid.z * RUN);
#endif
}

// The raw input of channel c at position p of the run (p + kc − 1 ≥ 0): x, or the state before it.
fn input(r: Run, p: i32, c: u32) -> f32 {
  if (p >= 0) {
    return x[r.xo + u32(p) * params.x_stride_t + c];
  }
  return state[r.so + u32(p + i32(params.kc) - 1) * params.channels + c];
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let c = gid.x;
  let C = params.channels;
  if (c >= C) {
    return;
  }
  let r = run_of(wid);
  let kc = params.kc;
  let tokens = r.tokens;
  let t0 = r.t0;
  let t1 = min(t0 + RUN, tokens);
  for (var t = t0; t < t1; t++) {
    let first = i32(t) - i32(kc) + 1;
    var s = 0.0;
    for (var j = 0u; j + 1u < kc; j++) {
      s = fma(w[c * kc + j], input(r, first + i32(j), c), s);
    }
    s = fma(w[c * kc + kc - 1u], x[r.xo + t * params.x_stride_t + c], s);
    u[r.uo + t * params.u_stride_t + c] = s / (1.0 + exp(-s));
#ifdef TRAIL
    trail[params.trail_offset + (kc - 1u + t) * C + c] = x[r.xo + t * params.x_stride_t + c];
#endif
  }
  // The state after the run: its last kc − 1 inputs. Row j reads row j + tokens of the old state
  // or x, never a row already rewritten.
  if (t0 == 0u) {
#ifdef TRAIL
    for (var j = 0u; j + 1u < kc; j++) {
      trail[params.trail_offset + j * C + c] = state[r.so + j * C + c];
    }
#endif
    for (var j = 0u; j + 1u < kc; j++) {
      state[r.so + j * C + c] = input(r, i32(tokens + j) - i32(kc) + 1, c);
    }
  }
}
