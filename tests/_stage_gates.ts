// What the Stage gate tests share: a tiny model opened per test, seeded prompts, greedy sessions.
// Used by tests/gpu_stage_test.ts, engine/reference/reference_stage_test.ts and the bench's tests.

import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { readHParams } from "../engine/hparams.ts";
import { runPipeline } from "../engine/pipeline.ts";
import type { Stage, TopEntry } from "../engine/stage.ts";
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
