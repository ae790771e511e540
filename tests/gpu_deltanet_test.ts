// GPU DeltaNet conv and recurrence (engine/kernels/{ssm_conv,gated_delta_net}.ts) against
// engine/reference/{deltanet,norms}.ts, token by token, for both key-head pairings.

import { createStorage } from "../engine/gpu/buffers.ts";
import { gatedDeltaNet, prepareGatedDeltaNet } from "../engine/kernels/gated_delta_net.ts";
import { prepareSsmConv, ssmConv } from "../engine/kernels/ssm_conv.ts";
import { convStep, deltaNetGates, deltaNetStep } from "../engine/reference/deltanet.ts";
import { gatedRmsNorm, l2NormHeads } from "../engine/reference/norms.ts";
import { assertClose, gpuTest, randomF32, readF32, rng, submit, upload } from "./_gpu.ts";
import { deltaNetHParams } from "./_hparams.ts";

gpuTest("ssmConv() matches convStep over a run of tokens and carries the state", async (ctx) => {
  await prepareSsmConv(ctx);
  const [C, Kc, T, stride] = [100, 4, 5, 130];
  const r = rng(11);
  const x = randomF32(T * stride, r, 2);
  const w = randomF32(C * Kc, r);
  const state0 = randomF32((Kc - 1) * C, r);
  const state = upload(ctx, state0);
  const u = createStorage(ctx, "u", T * C * 4);
  await submit(ctx, (enc) =>
    ssmConv(enc, { x: upload(ctx, x), w: upload(ctx, w), state, u }, {
      channels: C,
      kc: Kc,
      tokens: T,
      xOffset: 3,
      xStrideT: stride,
      uStrideT: C,
    }));
  const ref = Float64Array.from(state0);
  const want = new Float64Array(T * C);
  for (let t = 0; t < T; t++) {
    want.set(convStep(ref, x.subarray(3 + t * stride, 3 + t * stride + C), w), t * C);
  }
  // Four f32 products summed and a SiLU: within 1e-5 of the terms' size (≤ ~8).
  assertClose(await readF32(ctx, u, T * C), want, 8, 1e-5, "conv output");
  assertClose(await readF32(ctx, state, (Kc - 1) * C), ref, 2, 0, "conv state (raw inputs)");
});

gpuTest(
  "gatedDeltaNet() matches norms, gates, recurrence and gated norm per token",
  async (ctx) => {
    for (const arch of ["qwen3next", "qwen35moe"] as const) {
      const [Nk, Nv, Dk, Dv, T] = [2, 4, 48, 32, 3];
      const hp = deltaNetHParams(arch, Nk, Nv, Dk, Dv);
      await prepareGatedDeltaNet(ctx, Dk, Dv);
      const r = rng(arch.length);
      const C = hp.C;
      const u = randomF32(T * C, r);
      const ba = randomF32(T * 2 * Nv, r, 2);
      // z sits after the qkv channels of a wider projection row, as the forward pass lays it out.
      const zStride = C + Nv * Dv;
      const z = randomF32(T * zStride, r);
      const dt = randomF32(Nv, r);
      const ssmA = Float32Array.from(randomF32(Nv, r), (v) => -Math.exp(v));
      const normW = randomF32(Dv, r);
      const p = new Float32Array(2 * Nv + Dv);
      p.set(dt, 0);
      p.set(ssmA, Nv);
      p.set(normW, 2 * Nv);
      // GPU state (h, i, j); the reference keeps ggml's (h, j, i).
      const s0 = randomF32(Nv * Dk * Dv, r, 0.5);
      const refState = new Float64Array(Nv * Dv * Dk);
      for (let h = 0; h < Nv; h++) {
        for (let i = 0; i < Dk; i++) {
          for (let j = 0; j < Dv; j++) refState[(h * Dv + j) * Dk + i] = s0[(h * Dk + i) * Dv + j];
        }
      }
      const state = upload(ctx, s0);
      const y = createStorage(ctx, "y", T * Nv * Dv * 4);
      await submit(ctx, (enc) =>
        gatedDeltaNet(enc, {
          u: upload(ctx, u),
          ba: upload(ctx, ba),
          z: upload(ctx, z),
          p: upload(ctx, p),
          state,
          y,
        }, {
          nk: Nk,
          nv: Nv,
          dk: Dk,
          dv: Dv,
          tokens: T,
          interleave: arch === "qwen3next",
          uStrideT: C,
          baStrideT: 2 * Nv,
          zOffset: C,
          zStrideT: zStride,
          yStrideT: Nv * Dv,
          eps: 1e-6,
        }));
      const want = new Float64Array(T * Nv * Dv);
      for (let t = 0; t < T; t++) {
        const row = u.subarray(t * C, (t + 1) * C);
        const q = l2NormHeads(row.subarray(0, Nk * Dk), Dk, 1e-6);
        const k = l2NormHeads(row.subarray(Nk * Dk, 2 * Nk * Dk), Dk, 1e-6);
        const v = row.subarray(2 * Nk * Dk);
        const b = ba.subarray(t * 2 * Nv, t * 2 * Nv + Nv);
        const a = ba.subarray(t * 2 * Nv + Nv, (t + 1) * 2 * Nv);
        const { beta, g } = deltaNetGates(b, a, dt, ssmA);
        const o = deltaNetStep({ state: refState, q, k, v, beta, g }, hp);
        const zt = z.subarray(t * zStride + C, t * zStride + C + Nv * Dv);
        want.set(gatedRmsNorm(o, zt, normW, 1e-6), t * Nv * Dv);
      }
      const gotState = await readF32(ctx, state, Nv * Dk * Dv);
      const wantState = new Float64Array(Nv * Dk * Dv);
      for (let h = 0; h < Nv; h++) {
        for (let i = 0; i < Dk; i++) {
          for (let j = 0; j < Dv; j++) {
            wantState[(h * Dk + i) * Dv + j] = refState[(h * Dv + j) * Dk + i];
          }
        }
      }
      // f32 recurrence over 3 tokens of Dk-long dots, then an RMSNorm: outputs are O(1) after
      // the norm; 1e-4 covers the f32 dot-product and exp/log rounding (measured ~1e-6).
      assertClose(await readF32(ctx, y, T * Nv * Dv), want, 3, 1e-4, `${arch} output`);
      assertClose(gotState, wantState, 1, 1e-5, `${arch} state`);
    }
  },
);
