// Steps encoded before they are submitted (engine/gpu/encoder.ts EncodedStep), as a GPU stage
// encodes a decode step while the GPU runs the one before: Params at submit, stale arenas.

import assert from "node:assert/strict";
import { GpuMemory } from "../engine/gpu/buffers.ts";
import { ParamArena, StepEncoder } from "../engine/gpu/encoder.ts";
import { rmsNorm } from "../engine/gpu/kernels/rms_norm.ts";
import { gpuTest, randomF32, readF32, rng, upload } from "./_gpu.ts";

const N = 64;

function refRmsNorm(x: Float32Array, w: Float32Array, eps: number): number[] {
  const scale = 1 / Math.sqrt(x.reduce((s, v) => s + v * v, 0) / x.length + eps);
  return Array.from(x, (v, i) => v * scale * w[i]);
}

gpuTest("steps encoded ahead keep their own Params until submitted, in order", async (ctx) => {
  const mem = new GpuMemory(ctx);
  try {
    const arena = new ParamArena(mem, 1);
    const r = rng(3);
    const x = randomF32(2 * N, r, 2);
    const w = randomF32(N, r, 1);
    const b = { x: upload(ctx, x), w: upload(ctx, w), y: mem.storage("y", 2 * N * 4) };
    // Both steps use arena slot 0: the first's Params must still be its own when it runs.
    const steps = [0, 1].map((row) => {
      const enc = new StepEncoder(ctx, arena);
      const at = row * N;
      rmsNorm(enc, b, { n: N, rows: 1, eps: 1e-5, xOffset: at, yOffset: at });
      return enc.encode();
    });
    assert.ok(steps.every((s) => !s.stale && s.dispatches === 1));
    ctx.device.pushErrorScope("validation");
    for (const s of steps) s.submit();
    assert.equal(await ctx.device.popErrorScope(), null);
    const y = await readF32(ctx, b.y, 2 * N);
    for (const row of [0, 1]) {
      const want = refRmsNorm(x.subarray(row * N, row * N + N), w, 1e-5);
      want.forEach((v, i) => assert.ok(Math.abs(y[row * N + i] - v) <= 1e-5 * (1 + Math.abs(v))));
    }
    // A step with more dispatches than the arena holds replaces it: the one encoded before is
    // stale (its bind groups name the old buffer) and must be encoded again.
    const before = new StepEncoder(ctx, arena);
    rmsNorm(before, b, { n: N, rows: 1, eps: 1e-5 });
    const old = before.encode();
    const big = new StepEncoder(ctx, arena);
    for (let i = 0; i < 3; i++) rmsNorm(big, b, { n: N, rows: 1, eps: 1e-5 });
    const grown = big.encode();
    assert.ok(old.stale && !grown.stale && arena.slots >= 3);
  } finally {
    mem.destroy();
  }
});
