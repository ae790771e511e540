// wgsl/_include/f16_round.wgsl against JavaScript's Math.f16round on every kind of value the split
// products round: ties both ways, carries into the exponent, f16's subnormals and its largest.

import assert from "node:assert/strict";
import { expandWgsl } from "../engine/gpu/wgsl.ts";
import { gpuTest, readF32, rng, upload } from "./_gpu.ts";

const SHADER = `
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
${expandWgsl("_include/f16_round.wgsl", {})}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  if (id.x < arrayLength(&x)) {
    y[id.x] = f16_round(x[id.x]);
  }
}`;

/**
 * Values on and around every f16 rounding boundary kind, then random ones over f16's range: all
 * below 65520, where f16 rounds to infinity (the products' inputs are scaled below 2^15).
 */
function values(): Float32Array {
  const out: number[] = [
    0,
    -0,
    65504,
    -65504,
    65519,
    -65519.99,
    6.103515625e-5,
    5.9604644775390625e-8,
  ];
  const f32 = new Float32Array(1);
  const bits = new Uint32Array(f32.buffer);
  for (let e = -26; e <= 15; e++) {
    for (
      const m of [1, 1.5, 1.0009765625, 1.00048828125, 1.00146484375, 1.99951171875, 1.999755859375]
    ) {
      for (const sign of [1, -1]) {
        f32[0] = sign * m * 2 ** e;
        out.push(f32[0]);
        // The f32 neighbours of each value: just below and just above a tie.
        for (const d of [-1, 1]) {
          bits[0] += d;
          out.push(f32[0]);
          bits[0] -= d;
        }
      }
    }
  }
  const r = rng(7);
  for (let i = 0; i < 20000; i++) out.push((2 * r() - 1) * 2 ** (Math.floor(r() * 42) - 26));
  return Float32Array.from(out.filter((v) => Math.abs(v) < 65520));
}

gpuTest("f16_round gives the f16 nearest each f32, ties to even, subnormals kept", async (ctx) => {
  const x = values();
  const xb = upload(ctx, x);
  const yb = upload(ctx, new Float32Array(x.length));
  const pipeline = ctx.device.createComputePipeline({
    layout: "auto",
    compute: { module: ctx.device.createShaderModule({ code: SHADER }), entryPoint: "main" },
  });
  const enc = ctx.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(
    0,
    ctx.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: xb } }, { binding: 1, resource: { buffer: yb } }],
    }),
  );
  pass.dispatchWorkgroups(Math.ceil(x.length / 64));
  pass.end();
  ctx.device.queue.submit([enc.finish()]);
  const y = await readF32(ctx, yb, x.length);
  const wrong: string[] = [];
  for (let i = 0; i < x.length; i++) {
    const want = Math.f16round(x[i]);
    if (!Object.is(y[i], want) && !(y[i] === 0 && want === 0)) {
      wrong.push(`${x[i]} -> ${y[i]}, f16 ${want}`);
    }
  }
  assert.deepEqual(wrong.slice(0, 10), [], `${wrong.length} of ${x.length} values rounded wrongly`);
});
