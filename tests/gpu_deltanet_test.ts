// GPU DeltaNet conv and recurrence (engine/gpu/kernels/{ssm_conv,gated_delta_net}.ts) against
// engine/reference/{deltanet,norms}.ts, token by token, for both key-head pairings; and the
// recurrence's batch invariance (a run of tokens in one call or split into calls, bit for bit).

import { createStorage } from "../engine/gpu/buffers.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import { gatedDeltaNet } from "../engine/gpu/kernels/gated_delta_net.ts";
import { ssmConv } from "../engine/gpu/kernels/ssm_conv.ts";
import { convStep, deltaNetGates, deltaNetStep } from "../engine/reference/deltanet.ts";
import { gatedRmsNorm, l2NormHeads } from "../engine/reference/norms.ts";
import { assertClose, gpuTest, randomF32, readF32, rng, submit, upload } from "./_gpu.ts";
import { deltaNetHParams } from "./_hparams.ts";

/** ssmConv over x's T tokens in calls of `calls[i]` tokens: the outputs, then the final state. */
async function convRuns(
  ctx: GpuContext,
  [C, Kc, stride]: readonly number[],
  x: Float32Array,
  w: Float32Array,
  state0: Float32Array,
  calls: readonly number[],
): Promise<{ u: Float32Array; state: Float32Array }> {
  const T = calls.reduce((a, b) => a + b, 0);
  const state = upload(ctx, state0);
  const us = calls.map((n) => createStorage(ctx, "u", n * C * 4));
  const xb = upload(ctx, x);
  const wb = upload(ctx, w);
  await submit(ctx, (enc) => {
    let t0 = 0;
    calls.forEach((n, i) => {
      ssmConv(enc, { x: xb, w: wb, state, u: us[i] }, {
        channels: C,
        kc: Kc,
        tokens: n,
        xOffset: 3 + t0 * stride,
        xStrideT: stride,
        uStrideT: C,
      });
      t0 += n;
    });
  });
  const u = new Float32Array(T * C);
  let t0 = 0;
  for (const [i, n] of calls.entries()) {
    u.set(await readF32(ctx, us[i], n * C), t0 * C);
    t0 += n;
  }
  return { u, state: await readF32(ctx, state, (Kc - 1) * C) };
}

gpuTest(
  "ssmConv() matches convStep over a run of tokens, carries the state, and splits bit for bit",
  async (ctx) => {
    // 21 tokens: three groups of the kernel's 8, the last partial.
    const [C, Kc, T, stride] = [100, 4, 21, 130];
    const r = rng(11);
    const x = randomF32(T * stride, r, 2);
    const w = randomF32(C * Kc, r);
    const state0 = randomF32((Kc - 1) * C, r);
    const whole = await convRuns(ctx, [C, Kc, stride], x, w, state0, [T]);
    const ref = Float64Array.from(state0);
    const want = new Float64Array(T * C);
    for (let t = 0; t < T; t++) {
      want.set(convStep(ref, x.subarray(3 + t * stride, 3 + t * stride + C), w), t * C);
    }
    // Four f32 products summed and a SiLU: within 1e-5 of the terms' size (≤ ~8).
    assertClose(whole.u, want, 8, 1e-5, "conv output");
    assertClose(whole.state, ref, 2, 0, "conv state (raw inputs)");
    // Calls shorter than the state (1, 2 tokens) and longer than a group (9).
    const split = await convRuns(ctx, [C, Kc, stride], x, w, state0, [1, 2, 9, 1, 8]);
    for (const [what, a, b] of [["u", split.u, whole.u], ["state", split.state, whole.state]]) {
      const i = (a as Float32Array).findIndex((v, i) => !Object.is(v, (b as Float32Array)[i]));
      if (i >= 0) throw new Error(`conv ${what}[${i}] is ${a[i]} in calls, ${b[i]} in one call`);
    }
  },
);

type Arch = "qwen3next" | "qwen35moe";

/** Random inputs of a DeltaNet layer over T tokens, laid out as the forward pass lays them out. */
interface DeltaNetCase {
  readonly arch: Arch;
  readonly Nk: number;
  readonly Nv: number;
  readonly Dk: number;
  readonly Dv: number;
  readonly T: number;
  /** Channels of u per token: [q | k | v]. */
  readonly C: number;
  readonly u: Float32Array;
  readonly ba: Float32Array;
  /** z sits after the qkv channels of a wider projection row: stride C + Nv·Dv, offset C. */
  readonly z: Float32Array;
  readonly p: Float32Array;
  /** Initial state (h, i, j) as the GPU keeps it. */
  readonly s0: Float32Array;
}

function deltaNetCase(arch: Arch, dims: readonly number[], T: number, seed: number): DeltaNetCase {
  const [Nk, Nv, Dk, Dv] = dims;
  const r = rng(seed);
  const C = deltaNetHParams(arch, Nk, Nv, Dk, Dv).C;
  const u = randomF32(T * C, r);
  const ba = randomF32(T * 2 * Nv, r, 2);
  const z = randomF32(T * (C + Nv * Dv), r);
  const dt = randomF32(Nv, r);
  const ssmA = Float32Array.from(randomF32(Nv, r), (v) => -Math.exp(v));
  const p = new Float32Array(2 * Nv + Dv);
  p.set(dt, 0);
  p.set(ssmA, Nv);
  p.set(randomF32(Dv, r), 2 * Nv);
  const s0 = randomF32(Nv * Dk * Dv, r, 0.5);
  return { arch, Nk, Nv, Dk, Dv, T, C, u, ba, z, p, s0 };
}

/**
 * Runs the recurrence on the GPU over the case's tokens, split into calls of `calls[i]` tokens
 * (each submitted on its own, inputs uploaded per call), carrying the state between them.
 */
async function runGpu(
  ctx: GpuContext,
  c: DeltaNetCase,
  calls: readonly number[],
): Promise<{ y: Float32Array; state: Float32Array }> {
  const { Nk, Nv, Dk, Dv, C } = c;
  const zStride = C + Nv * Dv;
  const state = upload(ctx, c.s0);
  const p = upload(ctx, c.p);
  const y = new Float32Array(c.T * Nv * Dv);
  let t0 = 0;
  for (const n of calls) {
    const yBuf = createStorage(ctx, "y", n * Nv * Dv * 4);
    await submit(ctx, (enc) =>
      gatedDeltaNet(enc, {
        u: upload(ctx, c.u.slice(t0 * C, (t0 + n) * C)),
        ba: upload(ctx, c.ba.slice(t0 * 2 * Nv, (t0 + n) * 2 * Nv)),
        z: upload(ctx, c.z.slice(t0 * zStride, (t0 + n) * zStride)),
        p,
        state,
        y: yBuf,
      }, {
        nk: Nk,
        nv: Nv,
        dk: Dk,
        dv: Dv,
        tokens: n,
        interleave: c.arch === "qwen3next",
        uStrideT: C,
        baStrideT: 2 * Nv,
        zOffset: C,
        zStrideT: zStride,
        yStrideT: Nv * Dv,
        eps: 1e-6,
      }));
    y.set(await readF32(ctx, yBuf, n * Nv * Dv), t0 * Nv * Dv);
    t0 += n;
  }
  if (t0 !== c.T) throw new Error(`runGpu: calls cover ${t0} tokens, the case has ${c.T}`);
  return { y, state: await readF32(ctx, state, Nv * Dk * Dv) };
}

/** The CPU reference over the case's tokens: outputs and final state in the GPU's layout. */
function runReference(c: DeltaNetCase): { y: Float64Array; state: Float64Array } {
  const { Nk, Nv, Dk, Dv, T, C } = c;
  const hp = deltaNetHParams(c.arch, Nk, Nv, Dk, Dv);
  const dt = c.p.subarray(0, Nv);
  const ssmA = c.p.subarray(Nv, 2 * Nv);
  const normW = c.p.subarray(2 * Nv);
  const zStride = C + Nv * Dv;
  // The reference keeps ggml's (h, j, i) state layout; the GPU (h, i, j).
  const at = (h: number, i: number, j: number) => (h * Dk + i) * Dv + j;
  const refState = new Float64Array(Nv * Dv * Dk);
  for (let h = 0; h < Nv; h++) {
    for (let i = 0; i < Dk; i++) {
      for (let j = 0; j < Dv; j++) refState[(h * Dv + j) * Dk + i] = c.s0[at(h, i, j)];
    }
  }
  const y = new Float64Array(T * Nv * Dv);
  for (let t = 0; t < T; t++) {
    const row = c.u.subarray(t * C, (t + 1) * C);
    const q = l2NormHeads(row.subarray(0, Nk * Dk), Dk, 1e-6);
    const k = l2NormHeads(row.subarray(Nk * Dk, 2 * Nk * Dk), Dk, 1e-6);
    const v = row.subarray(2 * Nk * Dk);
    const b = c.ba.subarray(t * 2 * Nv, t * 2 * Nv + Nv);
    const a = c.ba.subarray(t * 2 * Nv + Nv, (t + 1) * 2 * Nv);
    const { beta, g } = deltaNetGates(b, a, dt, ssmA);
    const o = deltaNetStep({ state: refState, q, k, v, beta, g }, hp);
    const zt = c.z.subarray(t * zStride + C, t * zStride + C + Nv * Dv);
    y.set(gatedRmsNorm(o, zt, normW, 1e-6), t * Nv * Dv);
  }
  const state = new Float64Array(Nv * Dk * Dv);
  for (let h = 0; h < Nv; h++) {
    for (let i = 0; i < Dk; i++) {
      for (let j = 0; j < Dv; j++) state[at(h, i, j)] = refState[(h * Dv + j) * Dk + i];
    }
  }
  return { y, state };
}

/** The device with a smaller workgroup-size limit, so the kernel picks fewer row slices. */
function limited(ctx: GpuContext, invocations: number): GpuContext {
  return { ...ctx, limits: { ...ctx.limits, maxComputeInvocationsPerWorkgroup: invocations } };
}

gpuTest(
  "gatedDeltaNet() matches norms, gates, recurrence and gated norm per token",
  async (ctx) => {
    // [Nk, Nv, Dk, Dv] and the workgroup-size limit: 48 x 32 and the model's 128 x 128 heads, each
    // with the device's own row slices and with fewer (longer per-thread row runs; at 64 threads
    // each also stages two of the 96 q and k elements).
    const variants = [
      { dims: [2, 4, 48, 32], gpu: ctx },
      { dims: [2, 4, 48, 32], gpu: limited(ctx, 64) },
      { dims: [2, 4, 128, 128], gpu: ctx },
      { dims: [2, 4, 128, 128], gpu: limited(ctx, 256) },
    ];
    for (const arch of ["qwen3next", "qwen35moe"] as const) {
      for (const { dims, gpu } of variants) {
        const c = deltaNetCase(arch, dims, 3, arch.length + dims[2]);
        const got = await runGpu(gpu, c, [c.T]);
        const want = runReference(c);
        const what = `${arch} ${dims[2]}x${
          dims[3]
        } (≤ ${gpu.limits.maxComputeInvocationsPerWorkgroup} threads)`;
        // f32 recurrence over 3 tokens of Dk-long dots, then an RMSNorm: outputs are O(1) after
        // the norm; 1e-4 covers the f32 dot-product and exp/log rounding (measured ~1e-6).
        assertClose(got.y, want.y, 3, 1e-4, `${what} output`);
        assertClose(got.state, want.state, 1, 1e-5, `${what} state`);
      }
    }
  },
);

gpuTest(
  "gatedDeltaNet() gives bit-identical outputs and state however the tokens are split into calls",
  async (ctx) => {
    // Calls of one token run one workgroup a head, longer ones split each head's columns and
    // normalise in a second dispatch. The model's heads; 64-wide heads, whose norm dispatch takes
    // 64 tokens a workgroup (70 tokens: two); and 32-wide heads on 64 threads, never split, whose
    // one workgroup normalises 32 tokens a round (70 tokens: three rounds).
    const cases = (["qwen3next", "qwen35moe"] as const).flatMap((arch) => [
      { arch, dims: [2, 4, 128, 128], gpu: ctx, calls: [Array<number>(13).fill(1), [6, 7]] },
      { arch, dims: [2, 4, 64, 64], gpu: ctx, calls: [[33, 1, 36]] },
      { arch, dims: [2, 4, 48, 32], gpu: limited(ctx, 64), calls: [[33, 1, 36]] },
    ]);
    for (const { arch, dims, gpu, calls: splits } of cases) {
      const T = splits[0].reduce((a, b) => a + b, 0);
      const c = deltaNetCase(arch, dims, T, 7 + arch.length + dims[3]);
      const whole = await runGpu(gpu, c, [T]);
      if (T > 32) {
        const want = runReference(c);
        assertClose(whole.y, want.y, 3, 1e-4, `${arch} ${T} tokens output`);
        assertClose(whole.state, want.state, 1, 1e-5, `${arch} ${T} tokens state`);
      }
      for (const calls of splits) {
        const split = await runGpu(gpu, c, calls);
        for (
          const [what, a, b] of [["output", whole.y, split.y], [
            "state",
            whole.state,
            split.state,
          ]] as const
        ) {
          const i = a.findIndex((x, k) => !Object.is(x, b[k]));
          if (i >= 0) {
            throw new Error(
              `${arch} ${what} differs between 1 call of ${T} tokens and calls of [${calls}] at element ${i}: ${
                a[i]
              } vs ${b[i]}; the recurrence must run the same arithmetic per token`,
            );
          }
        }
      }
    }
  },
);
