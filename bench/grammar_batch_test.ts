// The bench's grammar part (bench/grammar_batch.ts) on the tiny test vocabulary: every case timed
// cold and warm with figures in order, and the vocabulary chosen for the masks.

import assert from "node:assert/strict";
import { tinyTokenizer } from "../tests/_tiny_tokenizer.ts";
import { benchGrammar, GRAMMAR_CASES, isPresetFiller, type StepFigures } from "./grammar_batch.ts";
import { BENCH_SPECS } from "./grammar_specs.ts";

Deno.test("benchGrammar: each case's steps of N sequences, cold then warm, in order", async () => {
  const { tokenizer } = tinyTokenizer("qwen35");
  const lines: string[] = [];
  const report = await benchGrammar({
    tokenizer,
    source: "model",
    sequences: 4,
    steps: 20,
    replyTokens: 12,
    budget: false,
    seed: 3,
    log: (line) => lines.push(line),
  });
  assert.equal(report.sequences, 4);
  assert.equal(report.steps, 20);
  assert.deepEqual(report.vocabulary, {
    tokens: tokenizer.vocabSize,
    // Every token but the control ones (<|im_start|>, <|im_end|>, <|endoftext|>) has bytes.
    textTokens: tokenizer.vocabSize - 3,
    source: "model",
  });
  assert.match(report.cpu, /\(\d+ cores\)$/);
  assert.equal(report.loadAverage.length, 2);
  assert.deepEqual(report.cases.map((c) => c.name), Object.keys(GRAMMAR_CASES));
  const ordered = (f: StepFigures, what: string) => {
    const list = [f.stepMsP50, f.stepMsP90, f.stepMsP99, f.stepMsMax];
    assert.ok(list.every((ms, i) => ms >= 0 && (i === 0 || ms >= list[i - 1])), what);
  };
  for (const c of report.cases) {
    assert.deepEqual(c.grammars, GRAMMAR_CASES[c.name]);
    ordered(c, c.name);
    ordered(c.processCpu, `${c.name} process CPU`);
    ordered(c.cold, `${c.name} cold`);
    // Replies of at most 12 tokens: each sequence began more than one in 20 steps.
    assert.ok(c.documents > 4, `${c.name}: ${c.documents} replies`);
  }
  assert.equal(lines.length, 1 + report.cases.length, lines.join("\n"));
  // The cases name only grammars the bench has, and the mix leaves out the tool call and GBNF.
  for (const grammars of Object.values(GRAMMAR_CASES)) {
    assert.ok(grammars.every((g) => g in BENCH_SPECS), grammars.join());
  }
  assert.ok(!GRAMMAR_CASES.mix.some((g) => BENCH_SPECS[g].kind !== "schema"));
});

Deno.test("isPresetFiller: only a vocabulary of the bench preset's size that is mostly fillers", () => {
  const text = new Uint8Array([0x61]);
  const none = new Uint8Array();
  const of = (vocabSize: number, withBytes: number) => ({
    vocabSize,
    tokenBytes: (id: number) => (id < withBytes ? text : none),
  });
  assert.equal(isPresetFiller(of(248_320, 4_263)), true, "the generated qwen35moe-35b's");
  assert.equal(isPresetFiller(of(248_320, 248_000)), false, "a real model's of that size");
  assert.equal(isPresetFiller(of(151_936, 4_000)), false, "another size");
  assert.equal(isPresetFiller(tinyTokenizer("qwen35").tokenizer), false);
});
