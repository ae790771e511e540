// The MTP head drafting on the last stage of a split (docs/WIRE.md DRAFT, WITH_IDS): the head's
// runs carry their token ids down the chain, the last stage runs the block over them and answers
// DRAFT; on a predictable model every draft is kept, through two and three stages, on both
// engines, and drafted decoding through the split gives the whole model's tokens.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { StageLink } from "../lib/scheduler/link.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";
import { decodeDrafted, type DraftedRun } from "./_drafting.ts";
import { type LocalServer, serveLocal } from "./_workers.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import type { StageOpenOptions } from "../engine/stage.ts";
import type { RemoteStage } from "../lib/wire/remote_stage.ts";

/** Opens a stage of `model` on one engine. */
type Opener = (model: GgufModel, options: StageOpenOptions) => Promise<Stage>;

const predictable = await openGguf(
  await testModel({ arch: "qwen35moe", quant: "q8_0", mtp: true, predictable: true }),
);
const random = await openGguf(await testModel({ arch: "qwen35moe", quant: "q8_0", mtp: true }));
const tokenizer = TextTokenizer.fromGguf(predictable.metadata);
const PROMPT = [300, 17, 512];
const SIZE = { slots: 1, ctx: 64, maxRewind: 4 };
const request = () => greedy(PROMPT, { maxTokens: 16, stopIds: new Set() });

/** The request decoded on `head` (and `link`) drafting 3 a step. */
function drafted(local: Stage, link?: StageLink): Promise<DraftedRun> {
  return decodeDrafted({ local, link, tokenizer, draft: 3 }, request());
}

/** A head of layers 0..first and workers serving `cuts` onwards, the last drafting. */
async function chain(
  model: typeof predictable,
  cuts: readonly number[],
  open: Opener = openReferenceStage,
  openHead: Opener = openReferenceStage,
) {
  const servers: LocalServer[] = [];
  let next: RemoteStage | undefined;
  for (let i = cuts.length - 1; i >= 0; i--) {
    const end = i + 1 < cuts.length ? cuts[i + 1] : 4;
    const server = await serveLocal(
      model,
      { first: cuts[i], end, ...SIZE, mtp: end === 4 },
      { next, open },
    );
    servers.unshift(server);
    if (i > 0) {
      next = await connectRemoteStage(server.address, {
        local: {
          first: 0,
          end: cuts[i],
          nLayer: 4,
          nEmbd: server.stage.nEmbd,
          ...SIZE,
          snapshots: 0,
          maxBatch: 64,
        },
        model,
      });
    }
  }
  const head = await openHead(model, { first: 0, end: cuts[0], ...SIZE, mtp: true });
  const remote = await connectRemoteStage(servers[0].address, { local: head, model });
  const link = new StageLink(remote);
  return {
    head,
    link,
    async close() {
      link.close();
      head.close();
      for (const s of servers) await s.stop();
    },
  };
}

Deno.test("a split's last stage drafts with the MTP block: every draft of a predictable model kept, two and three stages", async () => {
  for (const cuts of [[2], [1, 3]]) {
    const c = await chain(predictable, cuts);
    try {
      const got = await drafted(c.head, c.link);
      const counting = Array.from({ length: 16 }, (_, i) => 513 + i);
      assert.deepEqual(got.ids, counting, `${cuts}: the model counts up`);
      // The sequence never repeats: prompt lookup finds nothing, so these are the block's.
      assert.ok(
        got.drafted > 0 && got.accepted === got.drafted,
        `${cuts}: ${got.accepted} of ${got.drafted} kept`,
      );
    } finally {
      await c.close();
    }
  }
});

Deno.test("drafted decoding through a split with the MTP block gives the whole model's tokens", async () => {
  const whole = await openReferenceStage(random, { first: 0, end: 4, ...SIZE });
  const plain = (await completeOnce({ local: whole, tokenizer }, request())).ids;
  whole.close();
  const c = await chain(random, [2]);
  try {
    const got = await drafted(c.head, c.link);
    assert.deepEqual(got.ids, plain);
    assert.ok(got.verifies > 0, "drafts were verified");
  } finally {
    await c.close();
  }
});

Deno.test("a RUN without token ids skips the last stage's MTP block: that slot drafts none until it starts again at 0", async () => {
  const c = await chain(predictable, [2]);
  try {
    const hidden = (ids: Uint32Array, base = 0) =>
      c.head.run(0, { kind: "ids", ids }, ids.length, base);
    const prompt = Uint32Array.from(PROMPT);
    const rows = await hidden(prompt);
    assert.equal(rows.kind, "hidden");
    if (rows.kind !== "hidden") return;
    const withIds = await c.link.remote.run(0, { ...rows, ids: prompt }, 3, 0, { logits: "last" });
    const next = withIds.kind === "ids" ? withIds.ids[0] : -1;
    assert.deepEqual([...await c.link.draft(0, next, 3)], [next + 1, next + 2, next + 3]);
    // The same run without its ids: the same token, and no drafts after it.
    const without = await c.link.remote.run(0, rows, 3, 0, { logits: "last" });
    assert.deepEqual(without, withIds);
    assert.equal((await c.link.draft(0, next, 3)).length, 0);
    // A later run with its ids does not bring them back: the block missed positions 1..2.
    const one = await hidden(Uint32Array.of(next), 3);
    if (one.kind !== "hidden") return;
    await c.link.remote.run(0, { ...one, ids: Uint32Array.of(next) }, 1, 3, { logits: "last" });
    assert.equal((await c.link.draft(0, next + 1, 3)).length, 0);
    // Starting again at 0 does.
    await c.link.remote.run(0, { ...rows, ids: prompt }, 3, 0, { logits: "last" });
    assert.equal((await c.link.draft(0, next, 3)).length, 3);
  } finally {
    await c.close();
  }
});

gpuTest(
  "a split's last stage drafts with the MTP block on the GPU, what the whole model drafts",
  async (gpu) => {
    const onGpu: Opener = (m, o) => openGpuStage(m, gpu, { ...o, log: () => {} });
    const c = await chain(predictable, [2], onGpu, onGpu);
    try {
      const got = await drafted(c.head, c.link);
      assert.deepEqual(got.ids, Array.from({ length: 16 }, (_, i) => 513 + i));
      assert.ok(
        got.drafted > 0 && got.accepted === got.drafted,
        `${got.accepted} of ${got.drafted}`,
      );
    } finally {
      await c.close();
      predictable.close();
    }
    // On random weights the drafts depend on every hidden row and token the block has seen: the
    // split's last stage drafts exactly what the whole model's stage does after the same runs.
    const whole = await onGpu(random, { first: 0, end: 4, ...SIZE, mtp: true });
    const split = await chain(random, [2], onGpu, onGpu);
    try {
      const runs = [[5, 9, 13, 21, 34, 5, 9, 13], [40], [41, 7, 8]];
      let base = 0;
      for (const run of runs) {
        const ids = Uint32Array.from(run);
        await whole.run(0, { kind: "ids", ids }, ids.length, base);
        const h = await split.head.run(0, { kind: "ids", ids }, ids.length, base);
        assert.equal(h.kind, "hidden");
        if (h.kind !== "hidden") return;
        await split.link.remote.run(0, { kind: "hidden", rows: h.rows, ids }, ids.length, base);
        base += ids.length;
        const want = await whole.draft!(0, 60 + base, 3);
        assert.equal(want.length, 3);
        assert.deepEqual(await split.link.draft(0, 60 + base, 3), want, `after position ${base}`);
      }
    } finally {
      whole.close();
      await split.close();
      random.close();
    }
  },
);
