// Speculative decoding through the scheduler (lib/scheduler/draft.ts): drafts verified in
// rewindable runs give exactly plain greedy decoding's tokens, on the reference and GPU engines,
// whole and over the wire, with drafts both accepted and refused; sampled, a seeded request is
// reproduced exactly, split or not, and a near-zero temperature gives greedy decoding's tokens.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { complete, completeOnce, greedy } from "../lib/scheduler/complete.ts";
import type { SequenceRequest } from "../lib/scheduler/sequence.ts";
import type { DraftMode } from "../lib/scheduler/draft.ts";
import { StageLink } from "../lib/scheduler/link.ts";
import { Scheduler } from "../lib/scheduler/scheduler.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import { gpuTest } from "./_gpu.ts";
import { testModel } from "./_models.ts";
import { serveLocal } from "./_workers.ts";
import { decodeDrafted, type DraftedRun } from "./_drafting.ts";

const model = await openGguf(await testModel({ arch: "qwen35moe", quant: "q4_k_m" }));
const tokenizer = TextTokenizer.fromGguf(model.metadata);
const CTX = 96;
const PROMPT = [5, 9, 13, 21, 34, 5, 9, 13];
const request = (temperature = 0): SequenceRequest =>
  temperature === 0 ? greedy(PROMPT, { maxTokens: 40, stopIds: new Set() }) : {
    prompt: PROMPT,
    maxTokens: 40,
    stopIds: new Set(),
    sampling: { temperature, topK: 40, topP: 0.95, seed: 7n },
  };

/** Plain greedy decoding of the request on the whole reference model. */
async function plain(): Promise<number[]> {
  const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
  try {
    return (await completeOnce({ local: whole, tokenizer }, request())).ids;
  } finally {
    whole.close();
  }
}

const want = await plain();

/**
 * Drafts from plain decoding's own tokens, every third step's second draft made wrong: random
 * tiny models repeat nothing a lookup could find, and this way every step's outcome is known
 * (all drafts kept, or one kept and the slot rewound).
 */
function oracle(history: readonly number[], most: number): number[] {
  const at = history.length - PROMPT.length;
  const drafts = want.slice(at, at + most);
  if (at % 3 === 0 && drafts.length > 1) drafts[1] = drafts[1] === 0 ? 1 : drafts[1] - 1;
  return drafts;
}

/** Layers first..end on the reference engine, one slot keeping 4 positions to rewind. */
function reference(first: number, end: number) {
  return openReferenceStage(model, { first, end, slots: 1, ctx: CTX, maxRewind: 4 });
}

/** The request drafted under `draft` on `local` (and `link`) by the oracle. */
async function drafted(local: Stage, draft: DraftMode, link?: StageLink, temperature = 0) {
  const run = await decodeDrafted(
    { local, link, tokenizer, draft, drafter: oracle },
    request(temperature),
  );
  // Verify runs are generated tokens' rows, not prompt: only the prompt counts as prefill.
  assert.equal(run.prefillTokens, PROMPT.length);
  return run;
}

/**
 * Every drafted run gave plain decoding's tokens and verified drafts; drafting every step, it kept
 * some, not all (under "auto" which steps draft follows the gate's timings, so a loaded machine
 * may try only steps whose drafts are all right).
 */
function check(got: DraftedRun, what: string, everyStep = true): void {
  assert.deepEqual(got.ids, want, `${what}: the tokens of plain decoding`);
  assert.ok(got.verifies > 0, `${what}: drafts were verified`);
  assert.ok(
    got.accepted > 0 && (everyStep ? got.accepted < got.drafted : got.accepted <= got.drafted),
    `${what}: ${got.accepted} of ${got.drafted} kept`,
  );
}

Deno.test("drafted decoding on the reference: greedy gives plain decoding's tokens, sampled is seeded, whole and over the wire", async () => {
  for (const draft of [3, "auto"] as const) {
    const whole = await reference(0, 4);
    check(await drafted(whole, draft), `whole, --draft ${draft}`, draft !== "auto");
    whole.close();
  }
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: CTX, maxRewind: 4 });
  const head = await reference(0, 2);
  const remote = await connectRemoteStage(worker.address, { local: head, model });
  const link = new StageLink(remote);
  try {
    check(await drafted(head, 3, link), "split, --draft 3");
    // Sampled: each draft kept with its probability; seeded, the split gives the whole's tokens.
    const whole = await reference(0, 4);
    const sampled = await drafted(whole, 3, undefined, 0.8);
    assert.deepEqual((await drafted(head, 3, link, 0.8)).ids, sampled.ids, "sampled, split");
    // A tiny random model's distribution at 0.8 is nearly flat, so these drafts (greedy
    // decoding's) are rarely kept: the kept path runs at 0.001 below.
    assert.ok(sampled.verifies > 0 && sampled.accepted <= sampled.drafted);
    assert.notDeepEqual(sampled.ids, want, "sampling at 0.8 strays from greedy");
    // Every row's 1024 candidates would not fit one run's share: such a request decodes plainly.
    const wide = new Scheduler({
      local: whole,
      tokenizer,
      slots: 1,
      queue: 1,
      snapshots: 0,
      draft: 3,
      drafter: oracle,
    });
    const sampling = { temperature: 0.8, topK: 1024, topP: 1, seed: 7n };
    await complete(wide, { ...request(0.8), sampling });
    assert.equal(wide.stats.drafts.verifies, 0);
    await wide.close();
    // At a temperature near 0 the sampler is greedy, and so are the drafts it keeps.
    check(await drafted(whole, 3, undefined, 0.001), "sampled at 0.001");
    whole.close();
  } finally {
    link.close();
    head.close();
    await worker.stop();
  }
});

Deno.test("a scheduler asked to verify more drafts than its stages keep refuses to start", async () => {
  const whole = await openReferenceStage(model, {
    first: 0,
    end: 4,
    slots: 1,
    ctx: CTX,
    maxRewind: 3,
  });
  try {
    assert.throws(
      () => new Scheduler({ local: whole, tokenizer, slots: 1, queue: 1, snapshots: 0, draft: 3 }),
      /Cannot verify 3 drafts a step: the stages keep 3 positions to rewind.*--rewind 4/,
    );
  } finally {
    whole.close();
  }
});

/**
 * `whole` with plain steps of 100 ms and speculative steps that lose to them though every draft is
 * right: with `mtp`, the stage drafts (as an MTP head would) in 600 ms; without, it has no drafts
 * and its verify runs take 600 ms. `skipped` says, per request, whether each run skipped the block.
 */
function losingStage(whole: Stage, mtp: boolean) {
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  let pos = 0;
  const skipped: boolean[][] = [];
  const stage = new Proxy(whole, {
    get(target, key) {
      if (key === "draft") {
        if (!mtp) return undefined;
        return async (_slot: number, _id: number, k: number) => {
          await sleep(600);
          return Uint32Array.from(want.slice(pos - PROMPT.length + 1, pos - PROMPT.length + 1 + k));
        };
      }
      if (key === "run") {
        return async (...args: Parameters<Stage["run"]>) => {
          const [, , n, base, options] = args;
          if (base === 0) skipped.push([]);
          skipped[skipped.length - 1].push(options?.mtp === false);
          if (n === 1) await sleep(100);
          else if (!mtp && options?.rewindable) await sleep(600);
          const out = await target.run(...args);
          pos = base + n;
          return out;
        };
      }
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { stage, skipped };
}

Deno.test("--draft auto counts the drafting in a speculative step's cost, stops when it costs more, and the next request starts paused without the MTP block", async () => {
  const whole = await reference(0, 4);
  const { stage, skipped } = losingStage(whole, true);
  try {
    // Twice on one head: the second request starts paused for the DRAFT_BACKOFF tokens the
    // first one's losing try set (more than its 12), so it drafts nothing.
    const { runs, verifies, drafted, accepted } = await decodeDrafted(
      { local: stage, tokenizer, draft: "auto" },
      greedy(PROMPT, { maxTokens: 12, stopIds: new Set() }),
      2,
    );
    assert.deepEqual(runs, [want.slice(0, 12), want.slice(0, 12)]);
    assert.equal(accepted, drafted, "every draft was right");
    assert.equal(verifies, 1, `one speculative step, then plain steps: ${verifies} ${drafted}`);
    // The first request's runs feed the MTP block until its losing try pauses it past its end;
    // the second's, which cannot draft before its end, all skip it.
    assert.equal(skipped.length, 2);
    const fed = skipped[0].indexOf(true);
    assert.ok(fed >= 2 && skipped[0].slice(fed).every((s) => s), `${skipped[0]}`);
    assert.ok(skipped[1].length > 0 && skipped[1].every((s) => s), `${skipped[1]}`);
  } finally {
    whole.close();
  }
});

Deno.test("--draft auto with prompt lookup: each request's gate starts fresh, whatever the last one learned", async () => {
  const whole = await reference(0, 4);
  const { stage } = losingStage(whole, false);
  const right = (history: readonly number[], most: number) =>
    want.slice(history.length - PROMPT.length, history.length - PROMPT.length + most);
  try {
    const { runs, verifies, drafted, accepted } = await decodeDrafted(
      { local: stage, tokenizer, draft: "auto", drafter: right },
      greedy(PROMPT, { maxTokens: 12, stopIds: new Set() }),
      2,
    );
    assert.deepEqual(runs, [want.slice(0, 12), want.slice(0, 12)]);
    assert.equal(accepted, drafted, "every draft was right");
    assert.equal(verifies, 2, `one losing try a request: ${verifies} ${drafted}`);
  } finally {
    whole.close();
  }
});

gpuTest(
  "drafted decoding on the GPU gives plain greedy decoding's tokens, sampled near 0 too",
  async (gpu) => {
    const stage = await openGpuStage(model, gpu, {
      first: 0,
      end: 4,
      slots: 1,
      ctx: CTX,
      maxRewind: 4,
      log: () => {},
    });
    try {
      check(await drafted(stage, 3), "GPU, --draft 3");
      check(await drafted(stage, 3, undefined, 0.001), "GPU, sampled at 0.001");
    } finally {
      stage.close();
    }
  },
);

Deno.test("drafts from the model's MTP head on the reference give plain decoding's tokens, greedy and sampled near 0", async () => {
  const mtpModel = await openGguf(
    await testModel({ arch: "qwen35moe", quant: "q4_k_m", mtp: true }),
  );
  const open = (mtp: boolean) =>
    openReferenceStage(mtpModel, {
      first: 0,
      end: 4,
      slots: 1,
      ctx: CTX,
      maxRewind: 4,
      snapshots: 1,
      mtp,
    });
  try {
    const plainStage = await open(false);
    assert.equal(plainStage.draft, undefined, "no MTP head unless asked for");
    const plainIds = (await completeOnce({ local: plainStage, tokenizer }, request())).ids;
    plainStage.close();
    const stage = await open(true);
    for (const temperature of [0, 0.001]) {
      const { ids, verifies, drafted } = await decodeDrafted(
        { local: stage, tokenizer, draft: 3 },
        request(temperature),
      );
      assert.deepEqual(ids, plainIds, `temperature ${temperature}`);
      // Prompt lookup finds nothing in a random model's output: these drafts are the head's.
      assert.ok(verifies > 0 && drafted >= verifies, `${verifies} verify runs, ${drafted} drafts`);
    }
    // The head drafts from the rows of the slot's last run: the same drafts from the same run,
    // none after a restore (the snapshot holds no MTP state).
    const ids = Uint32Array.from(PROMPT);
    await stage.run(0, { kind: "ids", ids }, ids.length, 0, { logits: "none" });
    await stage.save(0, 0);
    const first = await stage.draft!(0, 5, 3);
    await stage.run(0, { kind: "ids", ids }, ids.length, 0, { logits: "none" });
    assert.deepEqual(await stage.draft!(0, 5, 3), first);
    assert.equal(first.length, 3);
    await stage.restore(0, 0);
    assert.equal((await stage.draft!(0, 5, 3)).length, 0);
    stage.close();
  } finally {
    mtpModel.close();
  }
});
