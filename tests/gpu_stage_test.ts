// Gates of the WebGPU stage (engine/gpu/gpu_stage.ts) on the generated tiny models:
// greedy ids and logits against the float64 CPU reference, split == unsplit at every layer
// boundary, interleaved slots == solo runs, shared steps of several slots == solo runs,
// snapshot/restore, split weight parts, request errors.

import assert from "node:assert/strict";
import { type GpuStage, openGpuStage, type StepProfile } from "../engine/gpu/gpu_stage.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import type { GpuContext } from "../engine/gpu/device.ts";
import { readHParams } from "../engine/hparams.ts";
import { runPipeline } from "../engine/pipeline.ts";
import { argmaxTopK } from "../engine/reference/logits.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { FusedOptions, Stage, StageOutput, StageRunOptions } from "../engine/stage.ts";
import { sampleToken, SplitMix64 } from "../lib/sampling/sample.ts";
import { gpuTest } from "./_gpu.ts";
import type { TestModelSpec } from "./_models.ts";
import {
  checkEveryCandidates,
  checkLogitPositions,
  checkRewind,
  greedySession,
  prompt,
  type Trace,
  withModel,
} from "./_stage_gates.ts";

const CTX = 48;
const MAX_BATCH = 8;
const TOPK = 8;

/**
 * GPU vs float64 reference on the same (exactly dequantized) weights: the only difference is
 * f32 arithmetic in another order through 4 blocks, prompt rows on tensor cores included (their
 * f16 operand pairs keep f32's accuracy). Measured logit differences are ≤ 1e-5 on every tiny
 * model; 2e-4 leaves 20x room. Greedy ids of quantized models are compared where the
 * reference's own top-2 gap exceeds twice this; on F32 models at every position.
 */
const LOGIT_TOL = 2e-4;

const session = greedySession(TOPK, 5);

function label(spec: TestModelSpec): string {
  return [spec.arch, spec.layout, spec.quant ?? "f32", spec.tied ? "tied" : ""].filter(Boolean)
    .join(" ");
}

/** GPU stages covering the model, cut at `cuts` (layer boundaries). */
async function openChain(
  gpu: GpuContext,
  model: GgufModel,
  cuts: readonly number[],
  opts: {
    slots?: number;
    snapshots?: number;
    maxPartBytes?: number;
    profile?: (p: StepProfile) => void;
    shareSteps?: boolean;
    maxBatch?: number;
    maxRewind?: number;
  } = {},
): Promise<GpuStage[]> {
  const nLayer = readHParams(model.metadata).nLayer;
  const bounds = [0, ...cuts, nLayer];
  const stages: GpuStage[] = [];
  for (let i = 0; i + 1 < bounds.length; i++) {
    stages.push(
      await openGpuStage(model, gpu, {
        first: bounds[i],
        end: bounds[i + 1],
        slots: opts.slots ?? 1,
        ctx: CTX,
        maxBatch: opts.maxBatch ?? MAX_BATCH,
        snapshots: opts.snapshots,
        maxRewind: opts.maxRewind,
        maxPartBytes: opts.maxPartBytes,
        profile: opts.profile,
        shareSteps: opts.shareSteps,
        log: () => {},
      }),
    );
  }
  return stages;
}

function closeAll(stages: readonly Stage[]): void {
  for (const s of stages) s.close();
}

/**
 * Runs a prompt (in chunks of 5, so prefill runs are not multiples of the 8-token tiles) and
 * then the reference's greedy continuation through the GPU stage and the reference's full
 * logits, and compares ids per position and the top-k of each call's last position.
 */
async function compareWithReference(gpu: GpuContext, spec: TestModelSpec): Promise<void> {
  await withModel(spec, async (model) => {
    const hp = readHParams(model.metadata);
    const ref = await openReferenceStage(model, {
      first: 0,
      end: hp.nLayer,
      slots: 1,
      ctx: CTX,
      maxBatch: MAX_BATCH,
    });
    const [stage] = await openChain(gpu, model, []);
    const exact = (spec.quant ?? "f32") === "f32";
    const name = label(spec);
    let compared = 0;
    try {
      const ids = prompt(model, 12, 1);
      let input = ids.subarray(0, 5);
      let base = 0;
      for (let call = 0; call < 9; call++) {
        const n = input.length;
        const logits = await ref.logits(0, { kind: "ids", ids: input }, n, base);
        const out = await stage.run(0, { kind: "ids", ids: input }, n, base, { topk: TOPK });
        if (out.kind !== "ids") throw new TypeError(`${name}: the last stage returned hidden rows`);
        for (let t = 0; t < n; t++) {
          const { argmax, top } = argmaxTopK(logits.subarray(t * hp.V, (t + 1) * hp.V), 2);
          if (exact || top[0].logit - top[1].logit > 2 * LOGIT_TOL) {
            assert.equal(out.ids[t], argmax, `${name}: greedy id at position ${base + t}`);
            compared++;
          }
        }
        const last = logits.subarray((n - 1) * hp.V, n * hp.V);
        const refTop = argmaxTopK(last, TOPK);
        assert.equal(out.top.length, TOPK);
        out.top.forEach((e, i) => {
          const where = `${name}: position ${base + n - 1}, rank ${i}`;
          assert.ok(
            Math.abs(e.logit - last[e.id]) <= LOGIT_TOL,
            `${where}: id ${e.id} logit ${e.logit}, reference ${last[e.id]}`,
          );
          assert.ok(
            Math.abs(e.logit - refTop.top[i].logit) <= LOGIT_TOL,
            `${where}: logit ${e.logit}, reference's rank-${i} logit ${refTop.top[i].logit}`,
          );
        });
        base += n;
        // Prefill in chunks of 5, 5, 2; then the reference's greedy continuation, token by token.
        input = base < ids.length ? ids.subarray(base, base + 5) : Uint32Array.of(refTop.argmax);
      }
    } finally {
      stage.close();
      ref.close();
    }
    assert.ok(compared >= 15, `${name}: only ${compared} positions were compared`);
  });
}

const F32_MODELS: readonly TestModelSpec[] = [
  { arch: "qwen3next" },
  { arch: "qwen3next", layout: "legacy" },
  { arch: "qwen35moe" },
  { arch: "qwen35" },
];

const QUANT_MODELS: readonly TestModelSpec[] = [
  { arch: "qwen35moe", quant: "q4_k_m" },
  { arch: "qwen3next", quant: "iq4_xs", layout: "legacy" },
  { arch: "qwen35", quant: "mixed" },
  { arch: "qwen35moe", quant: "q8_0", tied: true },
];

gpuTest(
  "GPU stage on F32 models: greedy ids equal the reference, logits within 2e-4",
  async (gpu) => {
    for (const spec of F32_MODELS) await compareWithReference(gpu, spec);
  },
);

gpuTest(
  "GPU stage on quantized models: ids equal the reference off near ties, logits within 2e-4",
  async (gpu) => {
    for (const spec of QUANT_MODELS) await compareWithReference(gpu, spec);
  },
);

gpuTest("GPU stages split at every layer boundary equal the unsplit stage", async (gpu) => {
  for (
    const spec of [{ arch: "qwen3next", layout: "legacy" }, {
      arch: "qwen35",
      quant: "q4_k_m",
    }] as const
  ) {
    await withModel(spec, async (model) => {
      const ids = prompt(model, 11, 2);
      const whole = await openChain(gpu, model, []);
      const want = await session(whole, 0, ids, 5);
      closeAll(whole);
      for (const cut of [1, 2, 3]) {
        const split = await openChain(gpu, model, [cut]);
        assert.deepEqual(await session(split, 0, ids, 5), want, `${label(spec)} split at ${cut}`);
        closeAll(split);
      }
    });
  }
});

gpuTest(
  "GPU stage: the last position's logits alone have the bits of every position's; none skips the head",
  async (gpu) => {
    // Chunks of 7 and 5: "all" multiplies the LM head in a prefill tile, "last" in the decode
    // product with the norm folded in, which must give the same bits.
    for (const spec of [{ arch: "qwen35moe", quant: "q4_k_m" }, { arch: "qwen3next" }] as const) {
      await withModel(spec, async (model) => {
        const ids = prompt(model, 12, 9);
        const whole = await openChain(gpu, model, []);
        await checkLogitPositions(whole, 0, ids, 7, 3);
        closeAll(whole);
        const split = await openChain(gpu, model, [2]);
        await checkLogitPositions(split, 0, ids, 7, 3);
        closeAll(split);
      });
    }
  },
);

gpuTest(
  "GPU stage: drafts verified in a rewindable run and rewound to the accepted ones continue as plain decoding, whole, split and beside another slot's steps",
  async (gpu) => {
    await withModel({ arch: "qwen3next", quant: "q4_k_m" }, async (model) => {
      const chain = await openChain(gpu, model, [], { maxRewind: 4 });
      await checkRewind(chain, 0, prompt(model, 6, 3), 3, 6);
      await checkEveryCandidates(chain, 0, prompt(model, 6, 3));
      closeAll(chain);
    });
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const ids = prompt(model, 6, 3);
      const split = await openChain(gpu, model, [1], { maxRewind: 4 });
      await checkRewind(split, 0, ids, 3, 6);
      await checkEveryCandidates(split, 0, ids);
      closeAll(split);
      // Slot 1 decodes plainly while slot 0 verifies drafts: shared steps keep each one's bits.
      const other = prompt(model, 5, 4);
      const solo = await openChain(gpu, model, [], { slots: 2 });
      const want = await session(solo, 1, other, 12);
      closeAll(solo);
      const shared = await openChain(gpu, model, [], { slots: 2, shareSteps: true, maxRewind: 4 });
      const [, got] = await Promise.all([
        checkRewind(shared, 0, ids, 3, 6),
        session(shared, 1, other, 12),
      ]);
      assert.deepEqual(got, want, "slot 1 beside the verifying slot");
      closeAll(shared);
    });
  },
);

gpuTest("GPU stage: two and four interleaved slots equal solo runs", async (gpu) => {
  await withModel({ arch: "qwen35moe" }, async (model) => {
    const prompts = [0, 1, 2, 3].map((s) => prompt(model, 7 + s, 10 + s));
    const solo = await openChain(gpu, model, []);
    const want: Trace[] = [];
    for (const p of prompts) want.push(await session(solo, 0, p, 6, { chunk: 4 }));
    closeAll(solo);
    for (const slots of [2, 4]) {
      const multi = await openChain(gpu, model, [2], { slots });
      const traces: Trace[] = prompts.slice(0, slots).map(() => ({ ids: [], tops: [] }));
      const pos = new Array(slots).fill(0);
      // Round robin: one call per slot per round, prefill chunks of 4 then single tokens, all
      // submitted before any result is awaited.
      for (let round = 0; round < 7; round++) {
        const calls = traces.map((tr, s) => {
          const p = prompts[s];
          const input = pos[s] < p.length
            ? p.subarray(pos[s], pos[s] + 4)
            : Uint32Array.of(tr.ids[tr.ids.length - 1]);
          const call = runPipeline(multi, s, input, pos[s], { topk: TOPK });
          pos[s] += input.length;
          return call;
        });
        (await Promise.all(calls)).forEach((out, s) => {
          traces[s].ids.push(...out.ids);
          traces[s].tops.push(out.top);
        });
      }
      for (let s = 0; s < slots; s++) {
        const n = traces[s].ids.length;
        assert.deepEqual(traces[s].ids, want[s].ids.slice(0, n), `${slots} slots: slot ${s} ids`);
        assert.deepEqual(
          traces[s].tops,
          want[s].tops.slice(0, traces[s].tops.length),
          `${slots} slots: slot ${s} top-k`,
        );
      }
      closeAll(multi);
    }
  });
});

/** What a slot's greedy decode gave: the first stage's hidden rows and the last stage's ids. */
interface Decoded {
  readonly hidden: Float32Array[];
  readonly ids: number[];
}

/** Prefills `p` (if any) into `slot` of the two-stage `chain`; the id to decode from. */
async function prefill(
  chain: readonly GpuStage[],
  slot: number,
  p: Uint32Array,
  first: number,
): Promise<number> {
  if (p.length === 0) return first;
  const out = await runPipeline(chain, slot, p, 0, { logits: "last" });
  return out.ids[0];
}

/** One greedy step of `slot` at `pos` through the two-stage `chain`, recorded in `d`. */
async function greedyStep(
  chain: readonly GpuStage[],
  slot: number,
  id: number,
  pos: number,
  d: Decoded,
): Promise<number> {
  const mid = await chain[0].run(slot, { kind: "ids", ids: Uint32Array.of(id) }, 1, pos);
  if (mid.kind !== "hidden") throw new TypeError("the first stage returns hidden rows");
  d.hidden.push(mid.rows);
  const last = await chain[1].run(slot, { kind: "hidden", rows: mid.rows }, 1, pos);
  if (last.kind !== "ids") throw new TypeError("the last stage returns ids");
  d.ids.push(last.ids[0]);
  return last.ids[0];
}

gpuTest(
  "GPU stage: greedy one-token runs of several slots share a step, each with its solo bits",
  async (gpu) => {
    await withModel({ arch: "qwen35moe" }, async (model) => {
      // Three slots at different positions, one starting from position 0 inside the shared step
      // (its DeltaNet state is cleared there, the others' not), through a split so both the
      // hidden rows and the ids of a shared step are checked.
      const prompts = [prompt(model, 7, 31), prompt(model, 3, 32), new Uint32Array(0)];
      const steps = 5;
      const want: Decoded[] = [];
      for (const p of prompts) {
        const solo = await openChain(gpu, model, [2]);
        const d: Decoded = { hidden: [], ids: [] };
        let id = await prefill(solo, 0, p, 17);
        for (let t = 0; t < steps; t++) id = await greedyStep(solo, 0, id, p.length + t, d);
        want.push(d);
        closeAll(solo);
      }
      const shared: number[] = [];
      const chain = await openChain(gpu, model, [2], {
        slots: 3,
        shareSteps: true,
        profile: (p) => shared.push(p.tokens),
      });
      const got: Decoded[] = prompts.map(() => ({ hidden: [], ids: [] }));
      const ids = await Promise.all(prompts.map((p, s) => prefill(chain, s, p, 17)));
      shared.length = 0;
      for (let t = 0; t < steps; t++) {
        await Promise.all(prompts.map(async (p, s) => {
          ids[s] = await greedyStep(chain, s, ids[s], p.length + t, got[s]);
        }));
      }
      closeAll(chain);
      got.forEach((g, s) => {
        assert.deepEqual(g.ids, want[s].ids, `slot ${s}: greedy ids`);
        g.hidden.forEach((rows, t) => {
          const alone = want[s].hidden[t];
          for (let i = 0; i < rows.length; i++) {
            if (!Object.is(rows[i], alone[i])) {
              throw new Error(
                `slot ${s} step ${t}: hidden value ${i} is ${rows[i]} shared, ${alone[i]} alone`,
              );
            }
          }
        });
      });
      // Every step of both stages ran the three slots at once.
      assert.deepEqual(shared, new Array(2 * steps).fill(3));
    });
  },
);

/** Whether two stage outputs are the same bits: hidden rows, or ids, candidates and normaliser. */
function sameBits(a: StageOutput, b: StageOutput, what: string): void {
  const bits = (x: ArrayLike<number>) => Array.from(new Uint32Array(Float32Array.from(x).buffer));
  if (a.kind === "hidden" || b.kind === "hidden") {
    assert.equal(a.kind, b.kind, `${what}: kind`);
    if (a.kind === "hidden" && b.kind === "hidden") {
      assert.deepEqual(bits(a.rows), bits(b.rows), `${what}: hidden rows`);
    }
    return;
  }
  assert.deepEqual([...a.ids], [...b.ids], `${what}: ids`);
  assert.deepEqual(a.top.map((e) => e.id), b.top.map((e) => e.id), `${what}: candidates`);
  assert.deepEqual(bits(a.top.map((e) => e.logit)), bits(b.top.map((e) => e.logit)), what);
  assert.ok(Object.is(a.lse, b.lse), `${what}: log-sum-exp ${a.lse} shared, ${b.lse} alone`);
}

gpuTest(
  "GPU stage: runs of every kind share one step, each with the bits it gets alone",
  async (gpu) => {
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const { V } = readHParams(model.metadata);
      const mask = new Uint32Array(Math.ceil(V / 32));
      for (let i = 0; i < V; i += 3) mask[i >>> 5] |= 1 << (i & 31);
      // Each slot's prefix runs alone in both chains; then one run of each kind shares a step:
      // a prompt chunk without logits, a prompt's last chunk with candidates, a mask and
      // penalties, a greedy decode, a sampled decode with biases, and every position of a run
      // from position 0 (its DeltaNet states cleared inside the shared step).
      const cases: { prefix: Uint32Array; ids: Uint32Array; options: StageRunOptions }[] = [
        { prefix: prompt(model, 4, 41), ids: prompt(model, 6, 42), options: { logits: "none" } },
        {
          prefix: prompt(model, 3, 43),
          ids: prompt(model, 5, 44),
          options: {
            logits: "last",
            topk: 8,
            adjust: {
              mask,
              bias: [{ id: 3, bias: 2.5 }, { id: 7, bias: -1, repeat: 1.3, subtract: 0.2 }],
            },
          },
        },
        { prefix: prompt(model, 7, 45), ids: prompt(model, 1, 46), options: { logits: "last" } },
        {
          prefix: prompt(model, 2, 47),
          ids: prompt(model, 1, 48),
          options: { logits: "last", topk: 5, adjust: { bias: [{ id: 1, bias: 1 }] } },
        },
        {
          prefix: new Uint32Array(0),
          ids: prompt(model, 3, 49),
          options: { logits: "all", topk: 3 },
        },
      ];
      const maxBatch = cases.reduce((n, c) => n + c.ids.length, 0);
      const through = async (chain: readonly GpuStage[], slot: number, c: (typeof cases)[0]) => {
        const base = c.prefix.length;
        const input = { kind: "ids" as const, ids: c.ids };
        const mid = await chain[0].run(slot, input, c.ids.length, base, c.options);
        if (mid.kind !== "hidden") throw new TypeError("the first stage returns hidden rows");
        const last = await chain[1].run(slot, mid, c.ids.length, base, c.options);
        return [mid, last];
      };
      const want: StageOutput[][] = [];
      for (const c of cases) {
        const solo = await openChain(gpu, model, [2], { maxBatch });
        if (c.prefix.length) await prefill(solo, 0, c.prefix, 0);
        want.push(await through(solo, 0, c));
        closeAll(solo);
      }
      const steps: number[] = [];
      const chain = await openChain(gpu, model, [2], {
        slots: cases.length,
        shareSteps: true,
        maxBatch,
        profile: (p) => steps.push(p.tokens),
      });
      try {
        for (const [s, c] of cases.entries()) {
          if (c.prefix.length) await prefill(chain, s, c.prefix, 0);
        }
        steps.length = 0;
        const got = await Promise.all(cases.map((c, s) => through(chain, s, c)));
        got.forEach((outs, s) =>
          outs.forEach((out, i) => sameBits(out, want[s][i], `slot ${s} stage ${i}`))
        );
        // One step on each stage ran all five runs; with tensor cores one step ran the prompt
        // runs' 14 rows, another the two decode rows.
        const kinds = chain[0].tensorCores ? [2, 2, 14, 14] : [maxBatch, maxBatch];
        assert.deepEqual(steps.sort((a, b) => a - b), kinds);
      } finally {
        closeAll(chain);
      }
    });
  },
);

gpuTest(
  "GPU stage: a slot that stopped holds no other run, a sampled and a greedy run share a step, close refuses waiting runs",
  async (gpu) => {
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const tokens: number[] = [];
      const [stage] = await openChain(gpu, model, [], {
        slots: 2,
        shareSteps: true,
        profile: (p) => tokens.push(p.tokens),
      });
      const id = (n: number) => ({ kind: "ids" as const, ids: Uint32Array.of(n) });
      // Both slots decode together, then slot 1 stops: slot 0's next run waits for it (the stage
      // cannot know it stopped) and then goes alone, as do the ones after it.
      await Promise.all([stage.run(0, id(5), 1, 0), stage.run(1, id(6), 1, 0)]);
      await stage.run(0, id(7), 1, 1);
      await stage.run(0, id(8), 1, 2);
      // A sampled run (top-k) and a greedy run share a step, each with its own outputs.
      const [sampled, greedy] = await Promise.all([
        stage.run(1, id(9), 1, 1, { topk: 4 }),
        stage.run(0, id(10), 1, 3),
      ]);
      assert.equal(sampled.kind, "ids");
      assert.equal(greedy.kind, "ids");
      if (sampled.kind === "ids") assert.equal(sampled.top.length, 4);
      if (greedy.kind === "ids") assert.equal(greedy.top.length, 0);
      assert.deepEqual(tokens, [2, 1, 1, 2]);
      // A run still waiting when the stage closes is refused, not left hanging.
      await Promise.all([stage.run(0, id(11), 1, 4), stage.run(1, id(12), 1, 2)]);
      const left = stage.run(0, id(13), 1, 5);
      stage.close();
      await assert.rejects(left, /closed/);
    });
  },
);

gpuTest(
  "GPU stage: slots share steps by default only where an awaited map is cheap (not Deno's builtin)",
  async (gpu) => {
    await withModel({ arch: "qwen35" }, async (model) => {
      const tokens: number[] = [];
      const [stage] = await openChain(gpu, model, [], {
        slots: 2,
        profile: (p) => tokens.push(p.tokens),
      });
      try {
        const id = (n: number) => ({ kind: "ids" as const, ids: Uint32Array.of(n) });
        await Promise.all([stage.run(0, id(5), 1, 0), stage.run(1, id(6), 1, 0)]);
        assert.deepEqual(tokens, gpu.provider === "builtin" ? [1, 1] : [2]);
        assert.equal(gpu.mapFloorMs >= 1, gpu.provider === "builtin");
      } finally {
        stage.close();
      }
    });
  },
);

gpuTest(
  "GPU stage: snapshot, other work, restore and continue equals uninterrupted",
  async (gpu) => {
    await withModel({ arch: "qwen3next" }, async (model) => {
      const a = prompt(model, 9, 3);
      const b = prompt(model, 6, 4);
      const stages = await openChain(gpu, model, [3], { slots: 2, snapshots: 2 });
      try {
        const want = await session(stages, 0, a, 6);
        // Prefix, save, then clobber the slot with another prompt before restoring.
        const head = await session(stages, 0, a, 0);
        for (const s of stages) await s.save(0, 1);
        await session(stages, 0, b, 3);
        await session(stages, 1, b, 2);
        for (const s of stages) assert.equal(await s.restore(0, 1), a.length);
        const rest = await session(stages, 0, Uint32Array.of(head.ids[head.ids.length - 1]), 5, {
          base: a.length,
        });
        assert.deepEqual([...head.ids, ...rest.ids], want.ids, "ids after restore");
        assert.deepEqual([...head.tops, ...rest.tops], want.tops, "top-k after restore");
        await assert.rejects(() => stages[0].restore(0, 0), /nothing was saved/);
        await assert.rejects(() => stages[0].save(0, 2), /snapshot places/);
      } finally {
        closeAll(stages);
      }
    });
  },
);

gpuTest("GPU stage: weights split into many small parts give the same results", async (gpu) => {
  await withModel({ arch: "qwen35moe", quant: "q4_k_m" }, async (model) => {
    const ids = prompt(model, 6, 5);
    const whole = await openChain(gpu, model, []);
    const want = await session(whole, 0, ids, 3);
    closeAll(whole);
    // 96 KiB parts: expert stacks (one expert per part), the embedding and the LM head span
    // several bindings.
    const parts = await openChain(gpu, model, [], { maxPartBytes: 96 * 1024 });
    assert.deepEqual(await session(parts, 0, ids, 3), want);
    closeAll(parts);
  });
});

gpuTest(
  "GPU stage rejects overflow, gaps, oversized runs and the wrong input kind",
  async (gpu) => {
    await withModel({ arch: "qwen35" }, async (model) => {
      const [first, last] = await openChain(gpu, model, [2]);
      try {
        const ids = prompt(model, 8, 6);
        await assert.rejects(() => first.run(0, { kind: "ids", ids }, 8, CTX - 4), RangeError);
        await assert.rejects(
          () => first.run(0, { kind: "ids", ids: prompt(model, 9, 6) }, 9, 0),
          /takes 1\.\.8/,
        );
        await first.run(0, { kind: "ids", ids: ids.subarray(0, 4) }, 4, 0);
        await assert.rejects(() => first.run(0, { kind: "ids", ids }, 8, 5), /position 4/);
        await assert.rejects(() => first.run(1, { kind: "ids", ids }, 8, 0), /slots/);
        await assert.rejects(() => last.run(0, { kind: "ids", ids }, 8, 0), /hidden rows/);
        await assert.rejects(
          () => first.run(0, { kind: "ids", ids: Uint32Array.of(1 << 30) }, 1, 0),
          /vocabulary/,
        );
        // Filling the context exactly is fine; one more position is not.
        for (let base = 0; base < CTX; base += 8) {
          const out = await first.run(0, { kind: "ids", ids }, 8, base);
          await last.run(
            0,
            out.kind === "hidden" ? out : { kind: "hidden", rows: new Float32Array() },
            8,
            base,
          );
        }
        await assert.rejects(
          () => first.run(0, { kind: "ids", ids: ids.subarray(0, 1) }, 1, CTX),
          /context holds/,
        );
      } finally {
        first.close();
        last.close();
      }
    });
  },
);

gpuTest(
  "GPU stage profile: one sample per run, GPU time where timestamps exist, same results",
  async (gpu) => {
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const ids = prompt(model, 6, 7);
      const plain = await openChain(gpu, model, []);
      const want = await session(plain, 0, ids, 2);
      closeAll(plain);
      const samples: StepProfile[] = [];
      const profiled = await openChain(gpu, model, [], { profile: (p) => samples.push(p) });
      assert.deepEqual(await session(profiled, 0, ids, 2), want);
      closeAll(profiled);
      // Two prefill calls (5 + 1 tokens) and two decode calls.
      assert.deepEqual(samples.map((p) => p.tokens), [5, 1, 1, 1]);
      for (const p of samples) {
        assert.ok(p.dispatches >= 4 * 8, `${p.dispatches} dispatches for 4 blocks and the head`);
        assert.ok(p.encodeMs >= 0 && p.waitMs >= 0);
        assert.equal(p.gpuMs === undefined, !gpu.features.timestamps);
        if (p.gpuMs !== undefined) {
          assert.ok(p.gpuMs >= 0 && p.gpuMs < 60_000, `GPU time ${p.gpuMs} ms`);
        }
      }
    });
  },
);

gpuTest(
  "GPU stage decodeFused() sampling on the device draws what the head draws from per-step runs",
  async (gpu) => {
    const params = { temperature: 1.5, topK: 12, topP: 0.95 };
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const ids = prompt(model, 7, 8);
      const [stage] = await openChain(gpu, model, []);
      try {
        const head = await session([stage], 0, ids, 0);
        const first = head.ids[head.ids.length - 1];
        // Per step, as a split deployment's head samples: each step's candidates read back.
        const rng = new SplitMix64(77n);
        const want: number[] = [];
        let id = first;
        for (let s = 0; s < 6; s++) {
          const out = await stage.run(
            0,
            { kind: "ids", ids: Uint32Array.of(id) },
            1,
            ids.length + s,
            {
              topk: params.topK,
            },
          );
          assert.equal(out.kind, "ids");
          if (out.kind !== "ids") return;
          id = sampleToken(out.ids[0], out.top, params, rng);
          want.push(id);
        }
        // Fused, in two calls (the second's first step was encoded while the first ran).
        await session([stage], 0, ids, 0);
        const draws = new SplitMix64(77n);
        const got: number[] = [];
        id = first;
        for (const [from, n] of [[0, 2], [2, 4]]) {
          const out = await stage.decodeFused(0, id, ids.length + from, n, {
            topk: params.topK,
            sampling: { params, draws: Uint32Array.from({ length: n }, () => draws.nextU32()) },
          });
          got.push(...out.ids);
          id = out.ids[n - 1];
        }
        assert.deepEqual(got, want);
        // Temperature 1.5 over a random model's flat logits: not every pick was the argmax.
        const greedy = await session([stage], 0, ids, 6);
        assert.notDeepEqual(got, greedy.ids.slice(ids.length), "the draws left the argmax");
        await assert.rejects(
          () =>
            stage.decodeFused(0, id, ids.length + 6, 2, {
              sampling: { params, draws: new Uint32Array(2) },
            }),
          /topk ≥ 1/,
        );
      } finally {
        stage.close();
      }
    });
  },
);

gpuTest(
  "GPU stage decodeFusedMany() gives each sequence what decodeFused gives it alone",
  async (gpu) => {
    const params = { temperature: 1.5, topK: 12, topP: 0.95 };
    await withModel({ arch: "qwen35moe" }, async (model) => {
      const prompts = [7, 5, 6, 4].map((n, i) => prompt(model, n, 8 + i));
      const [stage] = await openChain(gpu, model, [], { slots: 4, maxBatch: 16 });
      const rng = new SplitMix64(5n);
      const draws = Uint32Array.from({ length: 3 }, () => rng.nextU32());
      // Greedy with a top-k, sampled, and two sequences whose biases pick their tokens: each
      // reads its own bias records.
      const options: FusedOptions[] = [
        { topk: TOPK },
        { topk: params.topK, sampling: { params, draws } },
        { bias: [{ id: 3, bias: 1000 }] },
        { bias: [{ id: 5, bias: 1000 }] },
      ];
      const prefill = async () => {
        const lasts: number[] = [];
        for (const [slot, ids] of prompts.entries()) {
          const out = await session([stage], slot, ids, 0);
          lasts.push(out.ids[out.ids.length - 1]);
        }
        return lasts;
      };
      try {
        const lasts = await prefill();
        const steps = 3;
        const alone = [];
        for (const [slot, o] of options.entries()) {
          alone.push(await stage.decodeFused(slot, lasts[slot], prompts[slot].length, steps, o));
        }
        assert.deepEqual([...alone[2].ids, ...alone[3].ids], [3, 3, 3, 5, 5, 5]);
        await prefill();
        const many = await stage.decodeFusedMany(
          options.map((o, slot) => ({
            slot,
            id: lasts[slot],
            base: prompts[slot].length,
            options: o,
          })),
          steps,
        );
        assert.deepEqual(many.map((o) => [...o.ids]), alone.map((o) => [...o.ids]));
        assert.deepEqual(many.map((o) => o.top), alone.map((o) => o.top));
        assert.deepEqual(many.map((o) => o.lse), alone.map((o) => o.lse));
        // Every slot moved on by the steps: the next runs continue there, as after decodeFused.
        for (const [slot, o] of many.entries()) {
          const next = await stage.run(
            slot,
            { kind: "ids", ids: o.ids.subarray(steps - 1) },
            1,
            prompts[slot].length + steps,
          );
          assert.equal(next.kind, "ids");
        }
        const two = (slots: number[]) => slots.map((slot) => ({ slot, id: 1, base: 1 }));
        await assert.rejects(
          () => stage.decodeFusedMany(two([1, 1]), 2),
          /each on a slot of its own/,
        );
        await assert.rejects(() => stage.decodeFusedMany(two([0, 1]), 8), /expected 1\.\.7/);
      } finally {
        stage.close();
      }
    });
  },
);

gpuTest(
  "GPU stage decodeFused() equals token-by-token runs and needs the whole model",
  async (gpu) => {
    for (const spec of [{ arch: "qwen35moe" }, { arch: "qwen3next", layout: "legacy" }] as const) {
      await withModel(spec, async (model) => {
        const ids = prompt(model, 7, 8);
        const [stage] = await openChain(gpu, model, []);
        try {
          const want = await session([stage], 0, ids, 6);
          const head = await session([stage], 0, ids, 0);
          const got = await stage.decodeFused(0, head.ids[head.ids.length - 1], ids.length, 6, {
            topk: TOPK,
          });
          assert.deepEqual([...head.ids, ...got.ids], want.ids, `${label(spec)} ids`);
          assert.deepEqual(got.top, want.tops[want.tops.length - 1], `${label(spec)} top-k`);
          // The slot moved on by 6: the next run continues there.
          const next = await stage.run(0, { kind: "ids", ids: Uint32Array.of(got.ids[5]) }, 1, 13);
          assert.equal(next.kind, "ids");
        } finally {
          stage.close();
        }
        const split = await openChain(gpu, model, [2]);
        await assert.rejects(() => split[0].decodeFused(0, 1, 0, 2), /whole model/);
        closeAll(split);
      });
    }
  },
);
