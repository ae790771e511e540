// GPU greedy ids, logit adjustments, top-k and log-sum-exp (engine/gpu/kernels/{argmax,logit_adjust,
// topk}.ts) against engine/reference/logits.ts, ties breaking toward the lower id as it does; the
// GPU's sampled ids (kernels/sample.ts) against the head's sampler.

import assert from "node:assert/strict";
import { createStorage } from "../engine/gpu/buffers.ts";
import { argmax, argmaxScratchWords } from "../engine/gpu/kernels/argmax.ts";
import { logitAdjust } from "../engine/gpu/kernels/logit_adjust.ts";
import { logSumExp, topK, topKScratchWords, topKWords } from "../engine/gpu/kernels/topk.ts";
import {
  argmaxTopK,
  biasLogits,
  logSumExp as refLogSumExp,
  maskLogits,
} from "../engine/reference/logits.ts";
import { BAN, encodeBias, type LogitAdjust, MAX_TOPK } from "../engine/stage.ts";
import { sample } from "../engine/gpu/kernels/sample.ts";
import { wgslSource } from "../engine/gpu/wgsl.ts";
import { EXP2_HI, EXP2_LO, samplerWords, type SamplingParams } from "../engine/sampler.ts";
import { sampleToken, SplitMix64 } from "../lib/sampling/sample.ts";
import { gpuTest, randomF32, readU32, rng, submit, upload } from "./_gpu.ts";

const f32 = (bits: number) => new Float32Array(new Uint32Array([bits]).buffer)[0];

interface Case {
  readonly V: number;
  readonly rows: number;
  readonly k: number;
  readonly adjust?: LogitAdjust;
}

/** A mask allowing every id for which `allow` holds, over `words` words. */
function maskOf(words: number, allow: (id: number) => boolean): Uint32Array {
  const mask = new Uint32Array(words);
  for (let id = 0; id < 32 * words; id++) if (allow(id)) mask[id >>> 5] |= 1 << (id & 31);
  return mask;
}

const CASES: readonly Case[] = [
  { V: 1000, rows: 3, k: 5 },
  { V: 257, rows: 2, k: 40 },
  { V: 5000, rows: 1, k: 1 },
  // Rows over many first-pass chunks (a vocabulary's worth): the chunks' candidates merged.
  { V: 150_000, rows: 2, k: 40 },
  { V: 40_000, rows: 1, k: 600 },
  // k beyond the old two-pass kernel's 256, up to the one limit; k above V returns V entries.
  { V: 3000, rows: 1, k: MAX_TOPK },
  { V: 700, rows: 1, k: MAX_TOPK },
  // A grammar's mask (a short mask leaves the ids past it out) and a sampler's biases.
  { V: 2000, rows: 2, k: 64, adjust: { mask: maskOf(40, (id) => id % 7 === 3) } },
  { V: 600, rows: 1, k: 300, adjust: { mask: maskOf(19, (id) => id > 500 || id === 4) } },
  {
    V: 1500,
    rows: 1,
    k: 8,
    adjust: { bias: [{ id: 1499, bias: 90 }, { id: 7, bias: -50 }, { id: 0, bias: 3.5 }] },
  },
  {
    V: 1500,
    rows: 1,
    k: 3,
    adjust: { mask: maskOf(47, (id) => id < 9), bias: [{ id: 2, bias: 40 }] },
  },
  // Penalties: repeat divides a positive logit and multiplies a negative one, then subtract; a
  // ban; the tied run straddling the k-th place is among them.
  {
    V: 1200,
    rows: 2,
    k: 16,
    adjust: {
      bias: [
        { id: 10, bias: 0, repeat: 1.7, subtract: 0.4 },
        { id: 11, bias: -9, repeat: 3, subtract: 0 },
        { id: 44, bias: 0.5, repeat: 0.25, subtract: -1 },
        { id: 97, bias: BAN },
        { id: 700, bias: 0, repeat: 1.1, subtract: 2.5 },
      ],
    },
  },
];

gpuTest("argmax, logitAdjust, topK and the log-sum-exp equal the reference", async (ctx) => {
  for (const { V, rows, k, adjust } of CASES) {
    const where = `V ${V} k ${k}${adjust ? " adjusted" : ""}`;
    const r = rng(V + k);
    const logits = randomF32(V * rows, r, 4);
    // Ties: equal maxima in row 0, equal values at the top of the last row, and a run of equal
    // values straddling the k-th place, which only some of them can take.
    logits[10] = logits[900 % V] = 50;
    const last = (rows - 1) * V;
    for (let i = 0; i < 6; i++) logits[last + (i * 97) % V] = 20;
    const order = [...logits.subarray(last, last + V).keys()]
      .sort((a, b) => logits[last + b] - logits[last + a]);
    const place = Math.min(k, V) - 1;
    const tied = logits[last + order[place]];
    for (const i of order.slice(Math.max(7, place - 8), place + 8)) logits[last + i] = tied;
    const src = upload(ctx, logits);
    const ids = createStorage(ctx, "ids", rows * 4);
    const argmaxScratch = createStorage(ctx, "argmax scratch", argmaxScratchWords(rows) * 4);
    const top = createStorage(ctx, "top", topKWords(k) * 4);
    const scratch = createStorage(ctx, "top-k scratch", topKScratchWords(V, k) * 4);
    const mask = adjust?.mask ? upload(ctx, adjust.mask) : undefined;
    const records = encodeBias(adjust?.bias ?? []);
    const bias = records.length ? upload(ctx, new Uint32Array(records.buffer)) : undefined;
    await submit(ctx, (enc) => {
      // As gpu_forward.ts encodes a head: biases, the normaliser, the mask, argmax, top-k.
      const row = { n: V, offset: last };
      logitAdjust(enc, { logits: src, mask, bias }, {
        ...row,
        words: 0,
        pairs: adjust?.bias?.length ?? 0,
      });
      logSumExp(enc, { src, scratch, out: top }, { ...row, k });
      logitAdjust(enc, { logits: src, mask, bias }, {
        ...row,
        words: adjust?.mask?.length ?? 0,
        pairs: 0,
      });
      argmax(enc, { src, scratch: argmaxScratch, out: ids }, { n: V, rows });
      topK(enc, { src, scratch, out: top }, { n: V, k, offset: last });
    });
    const gotIds = await readU32(ctx, ids, rows);
    const biased = biasLogits(logits.subarray(last, last + V), adjust?.bias);
    const lastRow = maskLogits(biased, adjust?.mask);
    for (let row = 0; row < rows; row++) {
      const ref = argmaxTopK(row === rows - 1 ? lastRow : logits.subarray(row * V, row * V + V), 0);
      assert.equal(gotIds[row], ref.argmax, `${where} row ${row} argmax`);
    }
    const words = await readU32(ctx, top, topKWords(k));
    const got = Array.from(
      { length: k },
      (_, i) => ({ id: words[2 * i + 1], logit: f32(words[2 * i]) }),
    )
      .filter((e) => e.id !== 0xffffffff);
    const ref = argmaxTopK(lastRow, k);
    assert.equal(got.length, ref.top.length, `${where}: candidate count`);
    // Biases and penalties are applied in f32 on the GPU and in f64 by the reference: compare ids
    // exactly, values to f32 rounding.
    assert.deepEqual(got.map((e) => e.id), ref.top.map((e) => e.id), `${where}: ids`);
    got.forEach((e, i) =>
      assert.ok(Math.abs(e.logit - ref.top[i].logit) <= 1e-5 * Math.abs(e.logit), `${where} #${i}`)
    );
    // The normaliser is over the biased row, before the mask.
    const lse = f32(words[2 * k]);
    const want = refLogSumExp(biased);
    assert.ok(Math.abs(lse - want) <= 1e-4, `${where}: log-sum-exp ${lse}, expected ${want}`);
  }
});

gpuTest(
  "argmax() of a long row over many groups takes the lowest id of equal maxima",
  async (ctx) => {
    // 248 groups of 1024 values for one row: maxima in groups 200, 3 and 3 again.
    const V = 253_000;
    const logits = randomF32(V, rng(7), 4);
    logits[204_800] = logits[3_100] = logits[3_900] = 9;
    const ids = createStorage(ctx, "ids", 4);
    const scratch = createStorage(ctx, "argmax scratch", argmaxScratchWords(1) * 4);
    await submit(
      ctx,
      (enc) => argmax(enc, { src: upload(ctx, logits), scratch, out: ids }, { n: V, rows: 1 }),
    );
    assert.equal((await readU32(ctx, ids, 1))[0], 3_100);
  },
);

gpuTest("sample() draws the id the head's sampler draws from the same candidates", async (ctx) => {
  // The WGSL tables are the TypeScript ones (the kernel's own test below needs them equal).
  const wgsl = wgslSource("sample.wgsl");
  for (const [name, table] of [["EXP2_HI", EXP2_HI], ["EXP2_LO", EXP2_LO]] as const) {
    const body = wgsl.match(new RegExp(`const ${name} = array<u32, 64>\\(([^)]*)\\)`))![1];
    assert.deepEqual(body.match(/\d+/g)!.map(Number), table, `${name} in wgsl/sample.wgsl`);
  }
  const r = rng(31);
  const cases: {
    k: number;
    params: SamplingParams;
    scale: number;
    ties?: boolean;
    /** Candidates the top-k found (the rest of its k pairs missing: a mask or bans). */
    found?: number;
  }[] = [
    { k: 40, params: { temperature: 0.7, topK: 40, topP: 0.9 }, scale: 4 },
    { k: 40, params: { temperature: 1, topK: 0, topP: 1 }, scale: 2 },
    { k: 64, params: { temperature: 0.2, topK: 20, topP: 0.95, minP: 0.05 }, scale: 0.5 },
    { k: 300, params: { temperature: 1.3, topK: 0, topP: 0.5, minKeep: 3 }, scale: 3 },
    { k: MAX_TOPK, params: { temperature: 2, topK: 0, topP: 1 }, scale: 30 },
    { k: 8, params: { temperature: 1e-6, topK: 0, topP: 1 }, scale: 1, ties: true },
    { k: 16, params: { temperature: 0.8, topK: 0, topP: 0.01, minP: 0.5, minKeep: 5 }, scale: 1 },
    { k: 40, params: { temperature: 1, topK: 40, topP: 1 }, scale: 1, found: 5 },
    { k: 40, params: { temperature: 1, topK: 3, topP: 1 }, scale: 1, found: 2 },
    { k: 40, params: { temperature: 1, topK: 40, topP: 1 }, scale: 1, found: 0 },
  ];
  const draws = 24;
  // What the argmax left where the kernel leaves it.
  const GREEDY = 4242;
  for (const [c, { k, params, scale, ties, found = k }] of cases.entries()) {
    // Candidates as topK leaves them: descending logits (ties the lower id first), then
    // missing pairs (the masked value, no id).
    const logits = Float32Array.from({ length: k }, () => (2 * r() - 1) * scale + 10)
      .sort((a, b) => b - a);
    if (ties) logits.fill(logits[0], 0, 3);
    const ids = Array.from({ length: found }, (_, i) => (i * 7919 + 13) % 100_000);
    const pairs = new Uint32Array(2 * k + 1);
    const bits = new Uint32Array(logits.buffer);
    for (let i = 0; i < k; i++) {
      pairs[2 * i] = i < found ? bits[i] : 0xff7fffff;
      pairs[2 * i + 1] = i < found ? ids[i] : 0xffffffff;
    }
    const stream = new SplitMix64(BigInt(c));
    const u = Uint32Array.from({ length: draws }, () => stream.nextU32());
    const drawsBuffer = upload(ctx, Uint32Array.from([...samplerWords(params, k), ...u]));
    const top = upload(ctx, pairs);
    const out = upload(ctx, new Uint32Array(draws).fill(GREEDY));
    await submit(ctx, (enc) => {
      for (let s = 0; s < draws; s++) {
        sample(enc, { top, draws: drawsBuffer, out }, {
          topOffset: 0,
          drawsOffset: 0,
          draw: s,
          outOffset: s,
        });
      }
    });
    const got = await readU32(ctx, out, draws);
    const candidates = ids.map((id, i) => ({ id, logit: logits[i] }));
    const head = new SplitMix64(BigInt(c));
    const want = Array.from({ length: draws }, () => sampleToken(GREEDY, candidates, params, head));
    assert.deepEqual([...got], want, `k ${k}, ${found} found, ${JSON.stringify(params)}`);
    if (found >= 40) assert.ok(new Set(want).size > 1, `k ${k}: the draws pick several candidates`);
  }
});
