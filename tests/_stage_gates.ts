// What the Stage gate tests share: a tiny model opened per test, seeded prompts, greedy sessions,
// the logits-positions gate. Used by tests/gpu_stage_test.ts, engine/reference/reference_stage_test.ts,
// lib/wire/peer_test.ts and the bench's tests.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { readHParams } from "../engine/hparams.ts";
import { runPipeline } from "../engine/pipeline.ts";
import type { LastOutput, Stage, StageRunOptions, TopEntry } from "../engine/stage.ts";
import { testModel, type TestModelSpec } from "./_models.ts";

/** Opens the test model of `spec` for `body` and closes it after. */
export async function withModel(
  spec: TestModelSpec,
  body: (m: GgufModel) => Promise<void>,
): Promise<void> {
  const model = await openGguf(await testModel(spec));
  try {
    await body(model);
  } finally {
    model.close();
  }
}

/** A prompt of `n` ids spread over the vocabulary, different per `seed`. */
export function prompt(model: GgufModel, n: number, seed: number): Uint32Array {
  const V = readHParams(model.metadata).V;
  return Uint32Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729 + 13) % V);
}

/** What a greedy session produced: every position's greedy id and the top-k after each call. */
export interface Trace {
  readonly ids: number[];
  readonly tops: (readonly TopEntry[])[];
}

/** Runs greedy sessions through a chain of stages. */
export type Session = (
  stages: readonly Stage[],
  slot: number,
  ids: Uint32Array,
  gen: number,
  options?: { chunk?: number; base?: number },
) => Promise<Trace>;

/**
 * A session that prefills `ids` in chunks (`chunk` unless a call says otherwise) on `slot` from
 * position `base`, then decodes `gen` greedy tokens one by one, recording the top `topk` after
 * each call.
 */
export function greedySession(topk: number, chunk: number): Session {
  return async (stages, slot, ids, gen, options = {}) => {
    const step = options.chunk ?? chunk;
    const trace: Trace = { ids: [], tops: [] };
    let pos = options.base ?? 0;
    for (let at = 0; at < ids.length; at += step) {
      const part = ids.subarray(at, at + step);
      const out = await runPipeline(stages, slot, part, pos, { topk });
      trace.ids.push(...out.ids);
      trace.tops.push(out.top);
      pos += part.length;
    }
    for (let i = 0; i < gen; i++) {
      const next = trace.ids[trace.ids.length - 1];
      const out = await runPipeline(stages, slot, Uint32Array.of(next), pos++, { topk });
      trace.ids.push(...out.ids);
      trace.tops.push(out.top);
    }
    return trace;
  };
}

/**
 * The gate of StageRunOptions.logits on a chain of stages: `ids` prefilled on `slot` in chunks
 * of `chunk`, then `gen` decode steps, once with every position's logits and once as the
 * scheduler runs it ("none" for every chunk but the last, "last" for it and each step), with a
 * top-k and a logit bias on each last position. "last" must give the bits of "all"'s last
 * position (ids, top-k, log-sum-exp), "none" nothing, and the decode steps after "none" chunks
 * must continue exactly: the slot moved on alike. A "none" run asking for a top-k, and an
 * unknown `logits`, are refused without moving the slot.
 */
export async function checkLogitPositions(
  stages: readonly Stage[],
  slot: number,
  ids: Uint32Array,
  chunk: number,
  gen: number,
): Promise<void> {
  const head: StageRunOptions = { topk: 5, adjust: { bias: [{ id: ids[0], bias: 0.5 }] } };
  const calls = async (lastOnly: boolean): Promise<LastOutput[]> => {
    const outs: LastOutput[] = [];
    let pos = 0;
    const step = async (part: Uint32Array, final: boolean) => {
      const logits = !lastOnly ? "all" : final ? "last" : "none";
      outs.push(
        await runPipeline(
          stages,
          slot,
          part,
          pos,
          logits === "none" ? { logits } : {
            ...head,
            logits,
          },
        ),
      );
      pos += part.length;
    };
    for (let at = 0; at < ids.length; at += chunk) {
      await step(ids.subarray(at, at + chunk), at + chunk >= ids.length);
      if (lastOnly && pos === chunk) {
        const part = ids.subarray(pos, pos + 1);
        await assert.rejects(
          () => runPipeline(stages, slot, part, pos, { logits: "none", topk: 1 }),
          /Cannot return top-k candidates or adjust logits of a run with logits "none"/,
        );
        const bad = { logits: "first" } as unknown as StageRunOptions;
        await assert.rejects(() => runPipeline(stages, slot, part, pos, bad), /"first"/);
      }
    }
    for (let i = 0; i < gen; i++) {
      await step(Uint32Array.of(outs[outs.length - 1].ids.at(-1)!), true);
    }
    return outs;
  };
  const all = await calls(false);
  const lastOnly = await calls(true);
  const chunks = Math.ceil(ids.length / chunk);
  assert.equal(lastOnly.length, all.length);
  all.forEach((want, i) => {
    const expected = i < chunks - 1
      ? { ids: new Uint32Array(), top: [], lse: NaN }
      : { ids: want.ids.slice(-1), top: want.top, lse: want.lse };
    assert.deepEqual(lastOnly[i], expected, `call ${i} (${chunks} prefill chunks)`);
  });
  assert.equal(all[chunks - 1].top.length, 5);
}

/** Stage.rewind on every stage of a chain in this process (a RemoteStage rewinds its chain). */
export async function rewindChain(stages: readonly Stage[], slot: number, pos: number) {
  for (const stage of stages) await stage.rewind(slot, pos);
}

/**
 * The gate of rewindable runs on a chain opened with maxRewind ≥ drafts + 1: `ids` prefilled on
 * `slot`, then its greedy continuation decoded as speculative steps would, each verifying
 * `drafts` drafted tokens in one rewindable run of generated rows and rewinding to what the model
 * accepted: once with every draft right (no rewind), and once each with draft w wrong (the
 * model accepts w of them). Every verified position's greedy id must be plain decoding's, and a
 * plain step after the speculation must give plain decoding's bits at that position (ids, top-k,
 * log-sum-exp): the rewound slot holds exactly the state of the tokens kept. Also checks the
 * refusals: a rewind after a run that kept no trail, outside the last run, and a rewindable run
 * longer than the stages keep.
 */
export async function checkRewind(
  stages: readonly Stage[],
  slot: number,
  ids: Uint32Array,
  drafts: number,
  gen: number,
): Promise<void> {
  const topk = { topk: 4 };
  const P = ids.length;
  const plain: LastOutput[] = [await runPipeline(stages, slot, ids, 0, topk)];
  for (let i = 0; i < gen + drafts + 1; i++) {
    plain.push(await runPipeline(stages, slot, plain[i].ids.slice(-1), P + i, topk));
  }
  // g[i]: the token fed at position P + i.
  const g = plain.map((o) => o.ids.at(-1)!);
  for (let wrong = -1; wrong < drafts; wrong++) {
    await runPipeline(stages, slot, ids, 0, { logits: "none" });
    let pos = P;
    let rounds = 0;
    while (pos < P + gen) {
      const i = pos - P;
      const input = Uint32Array.from({ length: drafts + 1 }, (_, j) => g[i + j]);
      // The wrong draft differs from the model's token at that place.
      if (wrong >= 0 && rounds === 0) {
        const right = g[i + wrong + 1];
        input[wrong + 1] = right === 0 ? 1 : right - 1;
      }
      const out = await runPipeline(stages, slot, input, pos, {
        rows: "decode",
        logits: "all",
        rewindable: true,
      });
      let accepted = 0;
      while (accepted < drafts && out.ids[accepted] === input[accepted + 1]) accepted++;
      for (let j = 0; j <= accepted; j++) {
        assert.equal(out.ids[j], g[i + j + 1], `draft ${wrong} wrong: id at position ${pos + j}`);
      }
      if (accepted < drafts) await rewindChain(stages, slot, pos + accepted + 1);
      pos += accepted + 1;
      rounds++;
    }
    const step = await runPipeline(stages, slot, Uint32Array.of(g[pos - P]), pos, topk);
    assert.deepEqual(step, plain[pos - P + 1], `draft ${wrong} wrong: the step at ${pos}`);
  }
  await runPipeline(stages, slot, ids, 0, { logits: "none" });
  await assert.rejects(() => rewindChain(stages, slot, P), /kept no trail/);
  const two = ids.subarray(0, 2);
  await runPipeline(stages, slot, two, P, { rows: "decode", rewindable: true });
  await assert.rejects(() => rewindChain(stages, slot, P), /can go back to/);
  await assert.rejects(() => rewindChain(stages, slot, P + 3), /can go back to/);
  const long = new Uint32Array(stages[0].maxRewind + 1);
  await assert.rejects(
    () => runPipeline(stages, slot, long, P + 2, { rows: "decode", rewindable: true }),
    /keeps at most/,
  );
}

/**
 * The gate of StageRunOptions.candidates "every" on a chain: `ids` prefilled on `slot`, then four
 * generated rows in one run with every position's top 5 must give, position by position, the ids
 * and candidates four plain one-row steps give (the last one's also as `top` and `lse`); asking
 * for them with logits "last" or with adjustments is refused.
 */
export async function checkEveryCandidates(
  stages: readonly Stage[],
  slot: number,
  ids: Uint32Array,
): Promise<void> {
  const P = ids.length;
  const rows = Uint32Array.of(ids[0], ids[1], ids[2], ids[0]);
  await runPipeline(stages, slot, ids, 0, { logits: "none" });
  const plain: LastOutput[] = [];
  for (let t = 0; t < rows.length; t++) {
    plain.push(await runPipeline(stages, slot, rows.subarray(t, t + 1), P + t, { topk: 5 }));
  }
  await runPipeline(stages, slot, ids, 0, { logits: "none" });
  const every = await runPipeline(stages, slot, rows, P, {
    topk: 5,
    rows: "decode",
    candidates: "every",
  });
  assert.deepEqual([...every.ids], plain.map((o) => o.ids[0]));
  assert.deepEqual(every.tops, plain.map((o) => o.top));
  assert.deepEqual([every.top, every.lse], [plain[3].top, plain[3].lse]);
  const refused = [
    { topk: 5, candidates: "every", logits: "last" },
    { topk: 5, candidates: "every", adjust: { bias: [{ id: 1, bias: 1 }] } },
  ] as const;
  for (const options of refused) {
    await assert.rejects(
      () => runPipeline(stages, slot, rows, P + 4, options),
      /Cannot return every position's candidates/,
    );
  }
}
