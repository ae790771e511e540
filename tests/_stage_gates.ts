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
