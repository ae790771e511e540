// GPU causal GQA attention with the sigmoid gate (engine/gpu/kernels/attention.ts) against
// engine/reference/gqa_attention.ts over caches of several 64-position blocks, and its batch
// invariance: a token's output is bit-identical however tokens are grouped into calls.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import {
  attention,
  ATTENTION_BLOCK,
  attentionPartialFloats,
} from "../engine/gpu/kernels/attention.ts";
import { f16ToF32, f32ToF16 } from "../engine/quant/f16.ts";
import { attention as refAttention } from "../engine/reference/gqa_attention.ts";
import { assertClose, gpuTest, randomF32, readF32, rng, submit, upload } from "./_gpu.ts";

/** f16 NaN: cache rows past the attended positions hold it, so any read of them would show. */
const F16_NAN = 0x7e00;

/**
 * A random f16 cache of `ctx` positions whose first `valid` hold values in [-2, 2): the packed
 * u32 words and the exact f32 values of the valid positions.
 */
function f16Cache(
  ctx: number,
  valid: number,
  row: number,
  r: () => number,
): { words: Uint32Array; values: Float32Array } {
  const words = new Uint32Array((ctx * row) / 2);
  const values = new Float32Array(valid * row);
  for (let i = 0; i < ctx * row; i++) {
    let h = F16_NAN;
    if (i < valid * row) {
      h = f32ToF16((2 * r() - 1) * 2);
      values[i] = f16ToF32(h);
    }
    words[i >> 1] |= h << (16 * (i & 1));
  }
  return { words, values };
}

interface Shape {
  readonly hq: number;
  readonly hkv: number;
  readonly dh: number;
}

/** A layer's inputs: query rows as attn_q leaves them (per head [q | gate]) and both caches. */
interface Layer {
  readonly shape: Shape;
  readonly qg: Float32Array;
  readonly kc: GPUBuffer;
  readonly vc: GPUBuffer;
}

/** o for tokens first..first+tokens of `layer` (token t at position t) in one call. */
async function runCall(
  ctx: GpuContext,
  layer: Layer,
  first: number,
  tokens: number,
  partFloats: number,
): Promise<Float32Array> {
  const { hq, hkv, dh } = layer.shape;
  const qRow = hq * 2 * dh;
  const o = createStorage(ctx, "o", tokens * hq * dh * 4);
  const part = createStorage(ctx, "partials", partFloats * 4);
  await submit(ctx, (enc) =>
    attention(enc, {
      q: upload(ctx, layer.qg.subarray(first * qRow, (first + tokens) * qRow)),
      kc: layer.kc,
      vc: layer.vc,
      part,
      o,
    }, {
      tokens,
      hq,
      hkv,
      dh,
      pos0: first,
      qStrideT: qRow,
      qStrideH: 2 * dh,
      gateOffset: dh,
      oStrideT: hq * dh,
    }));
  return await readF32(ctx, o, tokens * hq * dh);
}

function makeLayer(
  ctx: GpuContext,
  shape: Shape,
  npos: number,
  seed: number,
): Layer & { k: Float32Array; v: Float32Array } {
  const r = rng(seed);
  const row = shape.hkv * shape.dh;
  // The caches run past the last position, as a slot's cache does.
  const cachePos = npos + ATTENTION_BLOCK + 3;
  const k = f16Cache(cachePos, npos, row, r);
  const v = f16Cache(cachePos, npos, row, r);
  return {
    shape,
    qg: randomF32(npos * shape.hq * 2 * shape.dh, r),
    kc: upload(ctx, k.words),
    vc: upload(ctx, v.words),
    k: k.values,
    v: v.values,
  };
}

function fullPartials(shape: Shape, npos: number, maxBatch: number): number {
  return attentionPartialFloats({ hq: shape.hq, dh: shape.dh, ctx: npos, maxBatch });
}

gpuTest(
  "attention() matches the reference for every query over blocks of positions",
  async (ctx) => {
    const cases: [number, number, number, number, number][] = [
      [4, 2, 64, 60, 7],
      [6, 3, 96, 0, 2],
      [2, 1, 32, 130, 1],
      // a full group of 8 query heads per KV head, 4 blocks
      [16, 2, 128, 190, 3],
      // 16 query heads per KV head: two head groups per block
      [16, 1, 32, 70, 3],
      // 53 blocks: the combine's 4-block loads run for its first block lanes
      [2, 1, 32, 3330, 2],
      // 11 tokens of head dim 256 (the bench model's): a workgroup of 8 and one of 3 where the
      // device has ~42 KB of workgroup memory (the GPU box), of 4 elsewhere
      [16, 2, 256, 100, 11],
    ];
    for (const [hq, hkv, dh, pos0, T] of cases) {
      const shape = { hq, hkv, dh };
      const npos = pos0 + T;
      const layer = makeLayer(ctx, shape, npos, pos0 + dh + hq);
      const got = await runCall(ctx, layer, pos0, T, fullPartials(shape, npos, T));
      const want = new Float64Array(T * hq * dh);
      for (let t = 0; t < T; t++) {
        const q = new Float32Array(hq * dh);
        const gate = new Float32Array(hq * dh);
        for (let h = 0; h < hq; h++) {
          const at = ((pos0 + t) * hq + h) * 2 * dh;
          q.set(layer.qg.subarray(at, at + dh), h * dh);
          gate.set(layer.qg.subarray(at + dh, at + 2 * dh), h * dh);
        }
        want.set(
          refAttention({ q, gate, k: layer.k, v: layer.v }, {
            Hq: hq,
            Hkv: hkv,
            Dh: dh,
            nPos: pos0 + t + 1,
          }),
          t * hq * dh,
        );
      }
      // Outputs are convex combinations of V (|v| ≤ 2): f32 scores, exp and sums give ~1e-6.
      assertClose(got, want, 2, 1e-5, `attention Hq ${hq} Hkv ${hkv} dh ${dh} pos0 ${pos0}`);
    }
  },
);

/** The device with 16 KB of workgroup memory, where pass 1 takes one token a workgroup. */
function smallWorkgroupMemory(ctx: GpuContext): GpuContext {
  return { ...ctx, limits: { ...ctx.limits, maxComputeWorkgroupStorageSize: 16384 } };
}

gpuTest(
  "attention() gives every token the same bits in one call, one by one, split or chunked",
  async (device) => {
    // Workgroups of 8 or 4 tokens where the adapter has the memory (tiles straddle a block's
    // end), and of 1.
    for (const ctx of [device, smallWorkgroupMemory(device)]) {
      await sameBits(ctx);
    }
  },
);

/** Pass 1 on `ctx` gives the bits of one call for calls one by one, split and chunked. */
async function sameBits(ctx: GpuContext): Promise<void> {
  const shape = { hq: 16, hkv: 2, dh: 128 };
  // 37 tokens at positions 170..206: blocks 2 and 3 of 64 positions are partly filled.
  const first = 170;
  const T = 37;
  const npos = first + T;
  const layer = makeLayer(ctx, shape, npos, 7);
  const full = fullPartials(shape, npos, T);
  const bits = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);
  const one = bits(await runCall(ctx, layer, first, T, full));
  const row = shape.hq * shape.dh;
  const groupings: [string, number[], number][] = [
    ["one by one", Array(T).fill(1), full],
    ["20 + 17", [20, 17], full],
    // Partials room for 5 tokens: attention() runs the call in token chunks.
    [
      "chunked by a small scratch",
      [T],
      5 * shape.hq * Math.ceil(npos / ATTENTION_BLOCK) *
      (shape.dh + 2),
    ],
  ];
  for (const [what, sizes, partFloats] of groupings) {
    let t = 0;
    for (const n of sizes) {
      const got = bits(await runCall(ctx, layer, first + t, n, partFloats));
      for (let i = 0; i < n * row; i++) {
        if (got[i] !== one[t * row + i]) {
          assert.fail(
            `${what}: token ${first + t + Math.floor(i / row)} value ${i % row} has bits ${
              got[i].toString(16)
            }, one call gave ${one[t * row + i].toString(16)}`,
          );
        }
      }
      t += n;
    }
  }
}

Deno.test("the attention partials fit the device's largest storage binding, one token's at least", () => {
  // The bench model's heads at 32768 positions: 256 MiB of partials on a device that binds that
  // much, 128 MiB on Deno's builtin provider; a token's own partials (8.5 MB) whatever the limit.
  const shape = { hq: 16, dh: 256, ctx: 32768, maxBatch: 2048 };
  const oneToken = 16 * 512 * (256 + 2);
  const free = attentionPartialFloats(shape);
  assert.ok(4 * free > 2 ** 27 && 4 * free <= 2 ** 28, `${4 * free} bytes unlimited`);
  const builtin = attentionPartialFloats({ ...shape, maxBindingBytes: 2 ** 27 });
  assert.ok(4 * builtin <= 2 ** 27 && builtin >= 15 * oneToken, `${4 * builtin} bytes at 128 MiB`);
  assert.equal(attentionPartialFloats({ ...shape, maxBindingBytes: 2 ** 20 }), oneToken);
});
