// The scheduler on a whole-model GPU stage: greedy and sampled sequences decode several steps per
// readback (decodeFused) and must end exactly where per-step decoding ends, on length and on stop
// text, sampled ones with the same draws; penalised sequences (logit changes on the last stage)
// match the reference stage's, and those biased alone decode fused.

import assert from "node:assert/strict";
import { openGpuStage } from "../engine/gpu/gpu_stage.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { BAN, type Stage } from "../engine/stage.ts";
import { Scheduler } from "../lib/scheduler/scheduler.ts";
import type { SequenceEvent, SequenceRequest } from "../lib/scheduler/sequence.ts";
import type { PenaltyOptions } from "../lib/sampling/penalties.ts";
import { tinyModel } from "./_head.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { gpuTest } from "./_gpu.ts";

/** `stage` with decodeFused hidden (the scheduler then runs one step per readback). */
function perStepOnly(stage: Stage): Stage {
  return new Proxy(stage, {
    get: (target, key) => {
      if (key === "decodeFused") return undefined;
      const value = Reflect.get(target, key);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** `stage` counting its decodeFused calls. */
function countingFused(stage: Stage): { stage: Stage; calls: () => number } {
  let calls = 0;
  const wrapped = new Proxy(stage, {
    get: (target, key) => {
      const value = Reflect.get(target, key);
      if (typeof value !== "function") return value;
      if (key !== "decodeFused") return value.bind(target);
      return (...args: Parameters<NonNullable<Stage["decodeFused"]>>) => {
        calls++;
        return stage.decodeFused!(...args);
      };
    },
  });
  return { stage: wrapped, calls: () => calls };
}

async function run(stage: Stage, tokenizer: TextTokenizer, request: SequenceRequest) {
  const scheduler = new Scheduler({ local: stage, tokenizer, slots: 1, queue: 0, snapshots: 0 });
  try {
    const seq = await scheduler.admit(request);
    const ids: number[] = [];
    const texts: string[] = [];
    let end: string | undefined;
    for await (const e of seq.events as ReadableStream<SequenceEvent>) {
      if (e.type === "token") {
        ids.push(e.id);
        texts.push(e.text);
      }
      if (e.type === "end") end = e.reason;
      if (e.type === "error") throw e.error;
    }
    return { ids, texts, end, outputTokens: scheduler.stats.outputTokens };
  } finally {
    await scheduler.close();
  }
}

gpuTest(
  "greedy and sampled sequences decode fused on a whole-model GPU stage as per-step decoding does",
  async (gpu) => {
    const model = await openGguf(await tinyModel());
    const stage = await openGpuStage(model, gpu, { first: 0, end: 4, slots: 1, ctx: 128 });
    try {
      const tokenizer = TextTokenizer.fromGguf(model.metadata);
      const prompt = tokenizer.encode("Two machines serve one model");
      const request = (
        maxTokens: number,
        sampling: SequenceRequest["sampling"],
        stop?: string[],
      ): SequenceRequest => ({ prompt, maxTokens, stop, sampling });
      const greedy = (maxTokens: number, stop?: string[]) =>
        request(maxTokens, { temperature: 0, topK: 40, topP: 1, seed: 1n }, stop);

      // 13 tokens: the first from the prompt's run, then bursts of 8 and 4 (not a whole burst).
      const counted = countingFused(stage);
      const fused = await run(counted.stage, tokenizer, greedy(13));
      const stepwise = await run(perStepOnly(stage), tokenizer, greedy(13));
      assert.equal(stepwise.ids.length, 13);
      assert.deepEqual(fused.ids, stepwise.ids);
      assert.equal(fused.end, "max_tokens");
      assert.equal(stepwise.end, "max_tokens");
      assert.equal(fused.outputTokens, 13);
      assert.equal(counted.calls(), 2, "12 tokens after the first in two fused calls");

      // A stop text inside a burst: the fused run drops the rest of the burst.
      const at = stepwise.texts.findIndex((t, i) => i >= 3 && t.trim().length > 0);
      assert.ok(at >= 3, `a token with text to stop on: ${JSON.stringify(stepwise.texts)}`);
      const stop = [stepwise.texts[at]];
      const fusedStop = await run(stage, tokenizer, greedy(13, stop));
      const stepStop = await run(perStepOnly(stage), tokenizer, greedy(13, stop));
      assert.equal(stepStop.end, "stop_sequence");
      assert.deepEqual(fusedStop, stepStop);
      assert.ok(fusedStop.ids.length < 13, "the stop ended the sequence early");

      // Sampled: the stage draws each step itself, with the sequence's own draws, and the tokens
      // are the head's per-step draws from the read-back candidates.
      const sampled = request(13, { temperature: 1.2, topK: 20, topP: 0.95, seed: 7n });
      const countedSampled = countingFused(stage);
      const fusedSampled = await run(countedSampled.stage, tokenizer, sampled);
      const stepSampled = await run(perStepOnly(stage), tokenizer, sampled);
      assert.deepEqual(fusedSampled, stepSampled);
      assert.equal(countedSampled.calls(), 2, "sampled: 12 tokens in two fused calls");
      assert.notDeepEqual(fusedSampled.ids, fused.ids, "the draws left the greedy path");
    } finally {
      stage.close();
      model.close();
    }
  },
);

gpuTest(
  "penalties and logit bias on the GPU stage give the reference stage's sequence; a bias alone fused",
  async (gpu) => {
    const model = await openGguf(await tinyModel());
    const stage = await openGpuStage(model, gpu, { first: 0, end: 4, slots: 1, ctx: 128 });
    const reference = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: 128 });
    try {
      const tokenizer = TextTokenizer.fromGguf(model.metadata);
      const prompt = tokenizer.encode("Two machines serve one model");
      const far = tokenizer.encode(" zebra").at(-1)!;
      const withPenalties = (temperature: number, penalties?: PenaltyOptions): SequenceRequest => ({
        prompt,
        maxTokens: 10,
        sampling: { temperature, topK: 40, topP: 1, seed: 7n, penalties },
      });
      const penalised = (temperature: number) =>
        withPenalties(temperature, {
          // A token far from the top forced first, then kept out by its frequency penalty.
          logitBias: new Map([[far, 100]]),
          frequency: 150,
          penaltyLastN: 64,
          penaltyScope: "output",
          repeat: 1.3,
          repeatLastN: 16,
        });
      const counted = countingFused(stage);
      const gpuRun = await run(counted.stage, tokenizer, penalised(0));
      const refRun = await run(reference, tokenizer, penalised(0));
      assert.deepEqual(gpuRun.ids, refRun.ids);
      assert.equal(gpuRun.ids[0], far);
      assert.ok(!gpuRun.ids.slice(1).includes(far), `${gpuRun.ids}`);
      assert.equal(counted.calls(), 0, "a penalised sequence is never decoded fused");
      const sampled = await run(stage, tokenizer, penalised(0.7));
      assert.deepEqual(sampled.ids, (await run(reference, tokenizer, penalised(0.7))).ids);

      // A bias alone (a boost and a ban, as ignore_eos bans) is the same every step: decoded
      // fused, greedy and sampled, with the per-step and the reference stage's tokens.
      const plain = await run(stage, tokenizer, withPenalties(0));
      const biased = (temperature: number) =>
        withPenalties(temperature, { logitBias: new Map([[far, 4], [plain.ids[1], BAN]]) });
      for (const temperature of [0, 0.9]) {
        const fused = countingFused(stage);
        const got = await run(fused.stage, tokenizer, biased(temperature));
        assert.ok(fused.calls() > 0, `temperature ${temperature}: a biased sequence decodes fused`);
        assert.ok(!got.ids.includes(plain.ids[1]), "the banned token never comes");
        assert.deepEqual(got, await run(perStepOnly(stage), tokenizer, biased(temperature)));
        assert.deepEqual(got.ids, (await run(reference, tokenizer, biased(temperature))).ids);
      }
    } finally {
      reference.close();
      stage.close();
      model.close();
    }
  },
);

gpuTest(
  "sequences of every kind at once share the GPU stage's steps, each equal to its run alone",
  async (gpu) => {
    const model = await openGguf(await tinyModel());
    const steps: number[] = [];
    const stage = await openGpuStage(model, gpu, {
      first: 0,
      end: 4,
      slots: 4,
      ctx: 128,
      shareSteps: true,
      profile: (p) => steps.push(p.tokens),
      log: () => {},
    });
    try {
      const tokenizer = TextTokenizer.fromGguf(model.metadata);
      const far = tokenizer.encode(" zebra").at(-1)!;
      const request = (text: string, sampling: Partial<SequenceRequest["sampling"]>) => ({
        prompt: tokenizer.encode(text),
        maxTokens: 9,
        sampling: { temperature: 0, topK: 40, topP: 1, seed: 3n, ...sampling },
      });
      // Greedy, sampled, penalised with a bias and a long prompt: alone each runs its prompt in
      // one chunk (and the greedy one fused); together their prompts go in chunks of 3 and every
      // step carries the others' tokens.
      const requests: SequenceRequest[] = [
        request("Two machines serve one model", {}),
        request("A river keeps its own counsel", { temperature: 0.7, seed: 11n }),
        request("Stones remember every flood", {
          temperature: 0.9,
          seed: 5n,
          penalties: { logitBias: new Map([[far, 3]]), frequency: 0.5, penaltyLastN: 16 },
        }),
        request(
          "The head holds the first layers and the worker the rest, and between them the wire",
          { temperature: 0.7, seed: 2n },
        ),
      ];
      const alone: number[][] = [];
      for (const r of requests) alone.push((await run(stage, tokenizer, r)).ids);
      const scheduler = new Scheduler({
        local: stage,
        tokenizer,
        slots: 4,
        queue: 0,
        snapshots: 0,
        prefillChunk: 3,
      });
      try {
        steps.length = 0;
        const together = await Promise.all(requests.map(async (r) => {
          const seq = await scheduler.admit(r);
          const ids: number[] = [];
          for await (const e of seq.events as ReadableStream<SequenceEvent>) {
            if (e.type === "token") ids.push(e.id);
            if (e.type === "error") throw e.error;
          }
          return ids;
        }));
        together.forEach((ids, i) => assert.deepEqual(ids, alone[i], `sequence ${i}`));
        assert.ok(
          steps.some((t) => t >= 4),
          `some step carried all four sequences: ${steps.join(" ")}`,
        );
      } finally {
        await scheduler.close();
      }
    } finally {
      stage.close();
      model.close();
    }
  },
);
