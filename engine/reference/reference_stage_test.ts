// Stage gates of the CPU reference: split == unsplit bit for bit, slot isolation, snapshots,
// resets and request errors, on the generated tiny models of every arch (engine/reference/reference_stage.ts).

import assert from "node:assert/strict";
import type { GgufModel } from "../gguf/gguf_model.ts";
import { readHParams } from "../hparams.ts";
import { runPipeline } from "../pipeline.ts";
import { openReferenceStage, type ReferenceStage } from "./reference_stage.ts";
import type { TestModelSpec } from "../../tests/_models.ts";
import {
  checkEveryCandidates,
  checkLogitPositions,
  checkRewind,
  greedySession,
  prompt,
  type Trace,
  withModel,
} from "../../tests/_stage_gates.ts";

const MODELS: readonly TestModelSpec[] = [
  { arch: "qwen3next" },
  { arch: "qwen3next", layout: "legacy" },
  { arch: "qwen35moe" },
  { arch: "qwen35" },
  { arch: "qwen35", quant: "q4_k_m" },
  { arch: "qwen35moe", quant: "q8_0", tied: true },
];

const CTX = 64;
const TOPK = 4;

const session = greedySession(TOPK, 16);

function label(spec: TestModelSpec): string {
  return [spec.arch, spec.layout, spec.quant, spec.tied ? "tied" : ""].filter(Boolean).join(" ");
}

function open(
  model: GgufModel,
  first: number,
  end: number,
  slots = 1,
  snapshots = 0,
  maxRewind = 0,
) {
  return openReferenceStage(model, {
    first,
    end,
    slots,
    ctx: CTX,
    maxBatch: 16,
    snapshots,
    maxRewind,
  });
}

for (const spec of MODELS) {
  Deno.test(`reference ${label(spec)}: layers [0,k) then [k,n) equal [0,n) bit for bit`, async () => {
    await withModel(spec, async (model) => {
      const n = readHParams(model.metadata).nLayer;
      const ids = prompt(model, 12, 1);
      const whole = await open(model, 0, n);
      const expected = await session([whole], 0, ids, 4, { chunk: 5 });
      const logits = await whole.logits(0, { kind: "ids", ids }, ids.length, 0);
      // The session must say something: greedy ids are not all one token.
      assert.ok(new Set(expected.ids).size > 1, `degenerate output ${expected.ids}`);
      for (let k = 1; k < n; k++) {
        const front = await open(model, 0, k);
        const back = await open(model, k, n);
        assert.deepEqual(await session([front, back], 0, ids, 4, { chunk: 5 }), expected, `k ${k}`);
        const hidden = await front.run(0, { kind: "ids", ids }, ids.length, 0);
        assert.equal(hidden.kind, "hidden");
        if (hidden.kind !== "hidden") return;
        const splitLogits = await back.logits(0, hidden, ids.length, 0);
        assert.deepEqual(splitLogits, logits, `logits at k ${k}`);
      }
    });
  });

  Deno.test(`reference ${label(spec)}: two slots interleaved token by token equal each alone`, async () => {
    await withModel(spec, async (model) => {
      const n = readHParams(model.metadata).nLayer;
      const prompts = [prompt(model, 9, 2), prompt(model, 6, 3)];
      const gen = 3;
      // Alone: batched prefill, then decode, each on a fresh stage.
      const alone = [];
      for (const p of prompts) alone.push(await session([await open(model, 0, n)], 0, p, gen));
      // Together: one token per call, alternating slots.
      const stage = await open(model, 0, n, 2);
      const together = prompts.map((): Trace => ({ ids: [], tops: [] }));
      const steps = prompts.map((p) => p.length + gen);
      for (let t = 0; t < Math.max(...steps); t++) {
        for (const [s, p] of prompts.entries()) {
          if (t >= steps[s]) continue;
          const tr = together[s];
          const id = t < p.length ? p[t] : tr.ids[tr.ids.length - 1];
          const out = await runPipeline([stage], s, Uint32Array.of(id), t, { topk: TOPK });
          tr.ids.push(out.ids[0]);
          tr.tops.push(out.top);
        }
      }
      for (const [s, p] of prompts.entries()) {
        assert.deepEqual(together[s].ids, alone[s].ids, `slot ${s} ids`);
        // Alone recorded one top after the prefill call, then one per decoded token.
        assert.deepEqual(together[s].tops.slice(p.length - 1), alone[s].tops, `slot ${s} tops`);
      }
    });
  });
}

Deno.test("reference: logits of the last position alone, or none, as the scheduler asks, whole and split", async () => {
  await withModel({ arch: "qwen3next", layout: "legacy" }, async (model) => {
    const ids = prompt(model, 12, 5);
    const whole = await open(model, 0, 4);
    await checkLogitPositions([whole], 0, ids, 5, 3);
    const split = [await open(model, 0, 2), await open(model, 2, 4)];
    await checkLogitPositions(split, 0, ids, 5, 3);
  });
});

Deno.test("reference: verify drafts in a rewindable run, rewind to the accepted ones, continue = plain decoding, whole and split", async () => {
  await withModel({ arch: "qwen35moe" }, async (model) => {
    const ids = prompt(model, 6, 2);
    await checkRewind([await open(model, 0, 4, 1, 0, 4)], 0, ids, 3, 6);
    await checkEveryCandidates([await open(model, 0, 4)], 0, ids);
    await checkRewind(
      [await open(model, 0, 1, 1, 0, 4), await open(model, 1, 4, 1, 0, 4)],
      0,
      ids,
      3,
      6,
    );
  });
});

Deno.test("reference snapshot: save, run something else, restore, continue = uninterrupted", async () => {
  await withModel({ arch: "qwen35moe" }, async (model) => {
    const n = readHParams(model.metadata).nLayer;
    const ids = prompt(model, 10, 4);
    const expected = await session([await open(model, 0, n)], 0, ids, 5);

    const stage = await open(model, 0, n, 2, 2);
    const prefill = await session([stage], 0, ids, 0);
    await stage.save(0, 1);
    // Continue past the snapshot, then overwrite the slot with another sequence.
    const next = prefill.ids[prefill.ids.length - 1];
    const cont = await session([stage], 0, Uint32Array.of(next), 4, { base: ids.length });
    await session([stage], 0, prompt(model, 7, 5), 2);
    // Restore into the same slot and into the other one: both continue as if uninterrupted.
    for (const slot of [0, 1]) {
      assert.equal(await stage.restore(slot, 1), ids.length);
      const again = await session([stage], slot, Uint32Array.of(next), 4, { base: ids.length });
      assert.deepEqual(again, cont, `slot ${slot}`);
    }
    assert.deepEqual([...prefill.ids, ...cont.ids], expected.ids);
    await assert.rejects(() => stage.restore(0, 0), RangeError);
    await assert.rejects(() => stage.save(0, 2), RangeError);
  });
});

Deno.test("reference restart at base 0 resets attention and DeltaNet state", async () => {
  await withModel({ arch: "qwen3next" }, async (model) => {
    const n = readHParams(model.metadata).nLayer;
    const ids = prompt(model, 8, 6);
    const fresh = await session([await open(model, 0, n)], 0, ids, 3);
    const stage = await open(model, 0, n);
    await session([stage], 0, prompt(model, 11, 7), 2);
    assert.deepEqual(await session([stage], 0, ids, 3), fresh);
  });
});

Deno.test("reference stage rejects gaps, overflow and bad inputs, and keeps its state", async () => {
  await withModel({ arch: "qwen35" }, async (model) => {
    const n = readHParams(model.metadata).nLayer;
    const V = readHParams(model.metadata).V;
    const ids = prompt(model, 6, 8);
    const expected = await session([await open(model, 0, n)], 0, ids, 3);

    const stage: ReferenceStage = await open(model, 0, n, 2);
    await session([stage], 0, ids, 0);
    const one = (id: number) => ({ kind: "ids", ids: Uint32Array.of(id) }) as const;
    const rejects = async (f: () => Promise<unknown>, type: ErrorConstructor) => {
      await assert.rejects(async () => await f(), type);
    };
    await rejects(() => stage.run(0, one(1), 1, ids.length + 1), RangeError); // gap
    await rejects(() => stage.run(0, one(1), 1, ids.length - 1), RangeError); // rewind
    await rejects(() => stage.run(0, one(1), 1, -1), RangeError);
    await rejects(() => stage.run(0, one(1), 0, ids.length), RangeError); // empty
    await rejects(() => stage.run(0, one(1), 2, ids.length), RangeError); // ids vs n
    await rejects(() => stage.run(0, one(V), 1, ids.length), RangeError); // not a token
    await rejects(
      () => stage.run(0, { kind: "ids", ids: new Uint32Array(17) }, 17, ids.length),
      RangeError,
    ); // over maxBatch 16
    await rejects(() => stage.run(2, one(1), 1, 0), RangeError); // no slot 2
    await rejects(
      () =>
        stage.run(
          0,
          { kind: "hidden", rows: new Float32Array(readHParams(model.metadata).D) },
          1,
          ids.length,
        ),
      TypeError,
    );
    await rejects(() => stage.run(0, one(1), 1, ids.length, { topk: -1 }), RangeError);
    await rejects(() => stage.save(0, 0), RangeError); // no snapshot places
    // Overflow: slot 1 filled to the end of the context, then one more.
    const fill = new Uint32Array(16);
    for (let base = 0; base < CTX; base += 16) {
      await stage.run(1, { kind: "ids", ids: fill }, 16, base);
    }
    await rejects(() => stage.run(1, one(1), 1, CTX), RangeError);

    // Slot 0 was left exactly where it was.
    const next = (await session([stage], 0, ids, 0)).ids.at(-1)!;
    assert.deepEqual(
      (await session([stage], 0, Uint32Array.of(next), 2, { base: ids.length })).ids,
      expected.ids.slice(ids.length),
    );

    // A middle/last stage takes hidden rows, and only the last has logits.
    const back = await open(model, 1, n);
    await rejects(() => back.run(0, one(1), 1, 0), TypeError);
    const front = await open(model, 0, 1);
    await rejects(() => front.logits(0, one(1), 1, 0), RangeError);
    await rejects(() => open(model, 0, n + 1), RangeError);
    await rejects(() => open(model, 2, 2), RangeError);
    stage.close();
    await rejects(() => stage.run(0, one(1), 1, 0), TypeError);
  });
});
