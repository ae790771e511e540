// The MTP head drafting on the GPU engine (engine/gpu/mtp_forward.ts): the same drafts as the
// reference engine's from the same runs, kept up through shared steps, fused decoding, verify
// runs and rewinds; drafted decoding gives plain decoding's tokens; restores stop drafts.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { compileKernel, lateKernels } from "../engine/gpu/kernel.ts";
import { GET_ROWS } from "../engine/gpu/kernels/get_rows.ts";
import { GgmlType } from "../engine/quant/ggml_types.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";
import { decodeDrafted } from "./_drafting.ts";

const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q8_0", mtp: true }));
const tokenizer = TextTokenizer.fromGguf(model.metadata);
const CTX = 96;
const PROMPT = Uint32Array.of(5, 9, 13, 21, 34, 5, 9, 13);
const OPEN = { first: 0, end: 4, ctx: CTX, maxRewind: 4, snapshots: 1, mtp: true };

/**
 * The drafts after each stage of a fixed walk through a slot's life: a prompt, single decode
 * steps, a verify run of four rows rewound to two, another prompt from position 0.
 */
async function walk(stage: Stage, slot: number): Promise<number[][]> {
  const out: number[][] = [];
  const draft = async (id: number) => out.push([...await stage.draft!(slot, id, 3)]);
  const ids = (...v: number[]) => ({ kind: "ids" as const, ids: Uint32Array.from(v) });
  await stage.run(slot, ids(...PROMPT), PROMPT.length, 0);
  await draft(40);
  await stage.run(slot, ids(40), 1, 8);
  await draft(41);
  await stage.run(slot, ids(41, 7, 8, 9), 4, 9, { rewindable: true, logits: "all" });
  await draft(7);
  await stage.rewind(slot, 11);
  await draft(8);
  await stage.run(slot, ids(8), 1, 11);
  await draft(3);
  await stage.run(slot, ids(3, 4, 5), 3, 0);
  await draft(6);
  return out;
}

gpuTest(
  "the GPU's MTP head drafts what the reference's drafts, through runs, rewinds and shared steps",
  async (gpu) => {
    const reference = await openReferenceStage(model, { ...OPEN, slots: 1 });
    const want = await walk(reference, 0);
    reference.close();
    assert.ok(want.every((d) => d.length === 3), "the reference drafts three each time");
    const stage = await openGpuStage(model, gpu, { ...OPEN, slots: 2, log: () => {} });
    try {
      assert.ok(stage.draft, "a whole-model stage opened with mtp drafts");
      assert.deepEqual(await walk(stage, 1), want, "alone");
      // Two slots walking at once share their steps: each gets the drafts it gets alone.
      const both = await Promise.all([walk(stage, 0), walk(stage, 1)]);
      assert.deepEqual(both, [want, want], "in shared steps");
      // Fused greedy steps keep the block filled as single runs do.
      await stage.run(0, { kind: "ids", ids: PROMPT }, PROMPT.length, 0);
      const fused = await stage.decodeFused!(0, 40, 8, 3);
      const afterFused = await stage.draft!(0, fused.ids[2], 3);
      await stage.run(1, { kind: "ids", ids: PROMPT }, PROMPT.length, 0);
      for (const [i, id] of [40, fused.ids[0], fused.ids[1]].entries()) {
        await stage.run(1, { kind: "ids", ids: Uint32Array.of(id) }, 1, 8 + i);
      }
      assert.deepEqual(await stage.draft!(1, fused.ids[2], 3), afterFused, "fused == single steps");
      // A restored slot has no hidden row to start from until it runs again.
      await stage.save(0, 0);
      await stage.restore(1, 0);
      assert.equal((await stage.draft!(1, 5, 3)).length, 0, "none after a restore");
      await stage.run(1, { kind: "ids", ids: Uint32Array.of(5) }, 1, 11);
      assert.equal((await stage.draft!(1, 6, 3)).length, 3, "drafts again after a run");
      await assert.rejects(stage.draft!(0, 1 << 30, 3), /vocabulary/);
      await assert.rejects(stage.draft!(0, 5, -1), /whole number/);
    } finally {
      stage.close();
    }
  },
);

gpuTest("drafted decoding with the GPU's MTP head gives plain decoding's tokens", async (gpu) => {
  const request = (temperature: number) =>
    temperature === 0 ? greedy([...PROMPT], { maxTokens: 20, stopIds: new Set() }) : {
      prompt: [...PROMPT],
      maxTokens: 20,
      stopIds: new Set<number>(),
      sampling: { temperature, topK: 40, topP: 0.95, seed: 7n },
    };
  const plainStage = await openGpuStage(model, gpu, {
    ...OPEN,
    mtp: false,
    slots: 1,
    log: () => {},
  });
  assert.equal(plainStage.draft, undefined, "no MTP head unless asked for");
  const plain = (await completeOnce({ local: plainStage, tokenizer }, request(0))).ids;
  plainStage.close();
  const stage = await openGpuStage(model, gpu, { ...OPEN, slots: 1, log: () => {} });
  try {
    for (const temperature of [0, 0.001]) {
      const { ids, verifies, drafted } = await decodeDrafted(
        { local: stage, tokenizer, draft: 3 },
        request(temperature),
      );
      assert.deepEqual(ids, plain, `temperature ${temperature}`);
      assert.ok(verifies > 0 && drafted >= verifies, `${verifies} verify runs, ${drafted} drafts`);
    }
  } finally {
    stage.close();
    model.close();
  }
});

gpuTest(
  "a drafting stage's steps of every shape find their kernels built when it opened",
  async (gpu) => {
    // The bench model's types: IQ4_XS experts, whose layouts change with the step's rows.
    const bench = await openGguf(
      await testModel({ arch: "qwen35moe", quant: "iq4_xs", mtp: true }),
    );
    const lines: string[] = [];
    const log = (line: string) => lines.push(line);
    const stage = await openGpuStage(bench, gpu, { ...OPEN, slots: 2, log });
    const before = lateKernels(gpu).length;
    try {
      const ids = (...v: number[]) => ({ kind: "ids" as const, ids: Uint32Array.from(v) });
      await stage.run(0, ids(...PROMPT), PROMPT.length, 0);
      // Verify runs of every length a speculative step takes, sampled (every row's candidates).
      let pos = PROMPT.length;
      for (let n = 2; n <= OPEN.maxRewind; n++) {
        const run = Array.from({ length: n }, (_, i) => 40 + i);
        const verify = {
          rewindable: true,
          logits: "all",
          rows: "decode",
          topk: 4,
          candidates: "every",
        } as const;
        await stage.run(0, ids(...run), n, pos, verify);
        await stage.rewind(0, pos + 1);
        pos++;
        assert.equal((await stage.draft!(0, 7, n)).length, n);
      }
      await stage.decodeFused!(0, 9, pos, 3);
      await stage.run(1, ids(...PROMPT), PROMPT.length, 0);
      await Promise.all([stage.run(0, ids(1), 1, pos + 3), stage.run(1, ids(2), 1, PROMPT.length)]);
      assert.deepEqual(lateKernels(gpu).slice(before), [], "no step compiled a kernel");
      // One that did would say so: a variant built outside the plan shows in the next step's log.
      await compileKernel(gpu, GET_ROWS, GgmlType.F16);
      await stage.run(0, ids(3), 1, pos + 4);
      const said = lines.some((l) => /built kernel get_rows_F16 on the spot/.test(l));
      assert.ok(said, lines.join("\n"));
    } finally {
      stage.close();
      bench.close();
    }
  },
);

/**
 * A slot's life with a run that skips the MTP block (StageRunOptions.mtp false; none where `skip`
 * is false): each run's greedy id, then how many drafts follow it.
 */
async function skipping(stage: Stage, slot: number, skip = true): Promise<number[]> {
  const out: number[] = [];
  const step = async (v: number[], base: number, mtp?: false) => {
    const o = await stage.run(slot, { kind: "ids", ids: Uint32Array.from(v) }, v.length, base, {
      logits: "last",
      ...(mtp === false ? { mtp } : {}),
    });
    const id = o.kind === "ids" ? o.ids[0] : -1;
    out.push(id, (await stage.draft!(slot, id, 3)).length);
  };
  await step([...PROMPT], 0);
  await step([40], 8, skip ? false : undefined);
  // The block missed position 8: no drafts until the slot starts again.
  await step([41], 9);
  await stage.save(slot, 0);
  await step([...PROMPT], 0);
  await stage.restore(slot, 0);
  // The snapshot was saved with the gap.
  await step([42], 10);
  await step([3, 4, 5], 0);
  return out;
}

gpuTest(
  "runs that skip the MTP block give the same tokens, and the slot drafts none until it starts again",
  async (gpu) => {
    // A model of its own: the file's shared one is closed by the test that uses it last.
    const model = await openGguf(
      await testModel({ arch: "qwen35moe", quant: "q8_0", mtp: true }),
    );
    const reference = await openReferenceStage(model, { ...OPEN, slots: 1 });
    const want = await skipping(reference, 0);
    reference.close();
    const drafts = want.filter((_, i) => i % 2 === 1);
    assert.deepEqual(drafts, [3, 0, 0, 3, 0, 3], "drafts stop at the skipped run");
    const ids = (walked: number[]) => walked.filter((_, i) => i % 2 === 0);
    const all = await openReferenceStage(model, { ...OPEN, slots: 1 });
    const unskipped = await skipping(all, 0, false);
    all.close();
    assert.deepEqual(ids(unskipped), ids(want), "the same tokens with the block running");
    assert.deepEqual(unskipped.filter((_, i) => i % 2 === 1), [3, 3, 3, 3, 3, 3]);
    const stage = await openGpuStage(model, gpu, { ...OPEN, slots: 1, log: () => {} });
    try {
      assert.deepEqual(await skipping(stage, 0), want, "the GPU as the reference");
      // In a step shared with a slot that skips the block, a slot that runs it drafts what it
      // drafts alone.
      const two = await openGpuStage(model, gpu, {
        ...OPEN,
        slots: 2,
        shareSteps: true,
        log: () => {},
      });
      try {
        const prompt = (slot: number, mtp?: false) =>
          two.run(slot, { kind: "ids", ids: PROMPT }, PROMPT.length, 0, {
            logits: "last",
            ...(mtp === false ? { mtp } : {}),
          });
        await prompt(0);
        const alone = [...await two.draft!(0, 40, 3)];
        assert.equal(alone.length, 3);
        await Promise.all([prompt(0), prompt(1, false)]);
        assert.deepEqual([...await two.draft!(0, 40, 3)], alone);
        assert.equal((await two.draft!(1, 40, 3)).length, 0);
      } finally {
        two.close();
      }
      // Fused greedy steps skip it too.
      await stage.run(0, { kind: "ids", ids: PROMPT }, PROMPT.length, 0, { logits: "last" });
      assert.equal((await stage.draft!(0, 40, 3)).length, 3);
      const fused = await stage.decodeFused!(0, 40, 8, 2, { mtp: false });
      assert.equal((await stage.draft!(0, fused.ids[1], 3)).length, 0);
      // Several sequences' fused steps never run it: a call is refused until each says so, and
      // then skips it as decodeFused did, with the same tokens.
      await stage.run(0, { kind: "ids", ids: PROMPT }, PROMPT.length, 0, { logits: "last" });
      const many = (options?: { mtp: false }) =>
        stage.decodeFusedMany!([{ slot: 0, id: 40, base: 8, options }], 2);
      await assert.rejects(() => many(), /Cannot run the MTP block for slot 0 .*mtp: false/);
      assert.equal(
        (await stage.draft!(0, 40, 3)).length,
        3,
        "the refused call left the slot as it was",
      );
      const [together] = await many({ mtp: false });
      assert.deepEqual([...together.ids], [...fused.ids]);
      assert.equal((await stage.draft!(0, together.ids[1], 3)).length, 0);
    } finally {
      stage.close();
      model.close();
    }
  },
);
