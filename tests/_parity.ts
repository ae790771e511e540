// Parity of an engine's stage chain with llama.cpp's recorded greedy runs (tests/fixtures/*.json).
// Used by tests/llama_parity_test.ts for the CPU reference; any engine that builds Stages can reuse it.

import { openGguf } from "../engine/gguf/read.ts";
import type { GgufModel } from "../engine/gguf/gguf_model.ts";
import { chainMaxBatch, runPipeline } from "../engine/pipeline.ts";
import type { Stage, TopEntry } from "../engine/stage.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { Candidate, LlamaRun, PerPosition } from "../tools/fixtures/driver.ts";
import {
  FIXTURE_DIR,
  fixtureName,
  type ModelFixture,
  type ModelSpec,
  type PromptRecord,
  readFixture,
  RECORD_HINT,
  TOKENIZER_FIXTURE,
} from "../tools/fixtures/fixture_format.ts";
import { sha256File, testModel } from "./_models.ts";

/** Opens the chain of stages covering every layer, able to hold `ctx` positions in slot 0. */
export type StageChainFactory = (
  model: GgufModel,
  ctx: number,
) => Promise<readonly Stage[]>;

/** Largest allowed |ours − llama.cpp| for a top-8 logit, per position of one prompt. */
export interface PositionTolerance {
  /** At prompt position i (only its greedy id is recorded: the id check uses it). */
  prefill(i: number): number;
  /** At generated position j. */
  gen(j: number): number;
}

/** One llama.cpp run to hold ours against, and how far ours may be from it. */
export interface Comparison {
  readonly label: string;
  readonly run: LlamaRun;
  readonly tolerance: PositionTolerance;
}

/** Picks, for each prompt of a fixture, the llama.cpp runs to compare with. */
export type ComparisonPlan = (
  record: PromptRecord,
  prompt: number,
) => readonly Comparison[];

export interface ComparisonReport {
  /** Largest |ours − llama.cpp| over the compared logits. */
  maxLogitDiff: number;
  /** Largest |ours − llama.cpp| / tolerance: how much of the bound was used. */
  maxBoundUsed: number;
  /** Generated positions whose top-8 logits were compared. */
  logitPositions: number;
  /** Positions (prefill and generated) where our greedy id had to equal llama.cpp's. */
  idPositions: number;
  /** Positions left out of the id check: llama.cpp's top-2 gap ≤ 2·tolerance (a near tie). */
  nearTies: number;
}

/** Per comparison label. */
export type ParityReport = Record<string, ComparisonReport>;

/** Candidates asked of the engine: more than the 8 recorded, so a slightly lower-ranked id is found. */
const OUR_TOPK = 16;
/** Mismatches listed in one failure message. */
const SHOW = 12;

/** Our run over one prompt, teacher-forced with llama.cpp's continuation. */
interface OurRun {
  /** Greedy id at each prompt position. */
  readonly prefill: readonly number[];
  /** Greedy id and top-16 at each generated position. */
  readonly gen: readonly number[];
  readonly top: readonly (readonly TopEntry[])[];
}

/**
 * Throws unless the model at `path` is byte for byte the one a fixture was recorded on: after a
 * generator change the recorded llama.cpp numbers describe another model.
 */
export async function checkModelHash(
  recorded: { readonly sha256: string; readonly spec: ModelSpec },
  path: string,
  fixture: string = fixtureName(recorded.spec),
): Promise<void> {
  const actual = await sha256File(path);
  if (actual !== recorded.sha256) {
    throw new Error(
      `Cannot compare with fixture "${fixture}": model "${path}" has sha256 ${actual}, the ` +
        `fixture was recorded on ${recorded.sha256} (the generator changed); ${RECORD_HINT}`,
    );
  }
}

/**
 * Prefill in chunks of the chain's batch limit, then feeds llama.cpp's continuation one token
 * per call: teacher forcing, so one early difference cannot cascade through the rest.
 */
async function runOurs(
  stages: readonly Stage[],
  record: PromptRecord,
): Promise<OurRun> {
  const chunk = chainMaxBatch(stages);
  const options = { topk: OUR_TOPK };
  const prefill: number[] = [];
  const gen: number[] = [];
  const top: (readonly TopEntry[])[] = [];
  for (let base = 0; base < record.ids.length; base += chunk) {
    const ids = Uint32Array.from(record.ids.slice(base, base + chunk));
    const out = await runPipeline(stages, 0, ids, base, options);
    prefill.push(...out.ids);
    if (base + chunk >= record.ids.length) {
      gen.push(out.ids[out.ids.length - 1]);
      top.push(out.top);
    }
  }
  for (let j = 0; j + 1 < record.gen.length; j++) {
    const ids = Uint32Array.of(record.gen[j]);
    const out = await runPipeline(
      stages,
      0,
      ids,
      record.ids.length + j,
      options,
    );
    gen.push(out.ids[0]);
    top.push(out.top);
  }
  return { prefill, gen, top };
}

/** Collects one comparison's measurements and mismatch messages. */
class Tally {
  readonly report: ComparisonReport = {
    maxLogitDiff: 0,
    maxBoundUsed: 0,
    logitPositions: 0,
    idPositions: 0,
    nearTies: 0,
  };
  readonly problems: string[] = [];

  /** Our greedy id must equal llama.cpp's unless llama.cpp's top-2 gap makes it a near tie. */
  id(
    ours: number,
    theirs: number,
    gap: number,
    tol: number,
    where: string,
  ): void {
    if (gap <= 2 * tol) {
      this.report.nearTies++;
      return;
    }
    this.report.idPositions++;
    if (ours !== theirs) {
      this.problems.push(
        `${where}: greedy id ${ours}, llama.cpp ${theirs} (its top-2 gap ${gap})`,
      );
    }
  }

  /**
   * Every llama.cpp candidate we also rank must be within tolerance; one we do not rank must sit
   * below our lowest listed logit (plus tolerance), or ours would have listed it; and every id of
   * our top 8 that llama.cpp did not list must sit below llama.cpp's 8th logit (plus tolerance).
   */
  top(
    theirs: readonly Candidate[],
    ours: readonly TopEntry[],
    tol: number,
    where: string,
  ): void {
    const ourLogit = new Map(ours.map((e) => [e.id, e.logit]));
    const ourFloor = ours[ours.length - 1].logit;
    for (const [id, logit] of theirs) {
      const mine = ourLogit.get(id);
      if (mine === undefined) {
        if (logit > ourFloor + tol) {
          this.problems.push(
            `${where}: id ${id} (llama.cpp logit ${logit}) is missing from our top ${ours.length}, lowest ${ourFloor}`,
          );
        }
        continue;
      }
      const diff = Math.abs(mine - logit);
      this.report.maxLogitDiff = Math.max(this.report.maxLogitDiff, diff);
      this.report.maxBoundUsed = Math.max(this.report.maxBoundUsed, diff / tol);
      if (diff > tol) {
        this.problems.push(
          `${where}: id ${id} logit ${mine}, llama.cpp ${logit} (|diff| ${diff.toPrecision(3)} > ${
            tol.toPrecision(3)
          })`,
        );
      }
    }
    const theirIds = new Set(theirs.map(([id]) => id));
    const theirFloor = theirs[theirs.length - 1][1];
    for (const e of ours.slice(0, theirs.length)) {
      if (!theirIds.has(e.id) && e.logit > theirFloor + tol) {
        this.problems.push(
          `${where}: our id ${e.id} (logit ${e.logit}) is missing from llama.cpp's top ${theirs.length}, lowest ${theirFloor}`,
        );
      }
    }
    this.report.logitPositions++;
  }
}

function compareRun(
  ours: OurRun,
  cmp: Comparison,
  p: number,
  tally: Tally,
): void {
  const { run, tolerance, label } = cmp;
  ours.prefill.forEach((id, i) => {
    const tol = tolerance.prefill(i);
    tally.id(
      id,
      run.prefill.ids[i],
      run.prefill.gaps[i],
      tol,
      `${label}, prompt ${p} position ${i}`,
    );
  });
  ours.top.forEach((top, j) => {
    const where = `${label}, prompt ${p} generated token ${j}`;
    const theirs = run.top[j];
    const tol = tolerance.gen(j);
    tally.id(
      ours.gen[j],
      theirs[0][0],
      theirs[0][1] - theirs[1][1],
      tol,
      where,
    );
    tally.top(theirs, top, tol, where);
  });
}

/**
 * Runs every prompt of `fixture` through the chain that `open` builds on `model` and holds our
 * greedy ids (prefill and continuation) and top-8 logits against each llama.cpp run that `plan`
 * names. Throws listing the mismatches; returns the measured differences otherwise.
 */
export async function checkParity(
  fixture: ModelFixture,
  model: GgufModel,
  open: StageChainFactory,
  plan: ComparisonPlan,
): Promise<ParityReport> {
  const ctx = Math.max(
    ...fixture.prompts.map((r) => r.ids.length + r.gen.length),
  );
  const stages = await open(model, ctx);
  const tallies = new Map<string, Tally>();
  try {
    for (let p = 0; p < fixture.prompts.length; p++) {
      const ours = await runOurs(stages, fixture.prompts[p]);
      for (const cmp of plan(fixture.prompts[p], p)) {
        let tally = tallies.get(cmp.label);
        if (tally === undefined) tallies.set(cmp.label, tally = new Tally());
        compareRun(ours, cmp, p, tally);
      }
    }
  } finally {
    for (const s of stages) s.close();
  }
  const problems = [...tallies.values()].flatMap((t) => t.problems);
  const report = Object.fromEntries(
    [...tallies].map(([label, t]) => [label, t.report]),
  );
  if (problems.length > 0) {
    throw new Error(
      `Parity with llama.cpp failed on "${model.path}": ${problems.length} mismatches ` +
        `(measured: ${JSON.stringify(report)}):\n  ${problems.slice(0, SHOW).join("\n  ")}`,
    );
  }
  return report;
}

/**
 * Exact math on F32 weights: llama.cpp multiplies F32 weights by F32 activations, so what remains
 * is summation order and its F16 KV cache. The reference engine measured ≤ 5.9e-4
 * (tools/fixtures/README.md). The GPU engine is held to it too, its prompt rows on tensor cores
 * included (their f16 operand pairs keep f32's accuracy: docs/PERFORMANCE-NOTES.md "Tensor cores").
 */
export const F32_TOLERANCE = 1e-3;

/** Label of the comparison with llama.cpp on a quantized model's F32 twin. */
export const TWIN_LABEL = "llama.cpp on the F32 twin";

/** Bound per position: `base` plus the given per-position measurements. */
function bound(base: number, ...terms: readonly PerPosition[]): PositionTolerance {
  const at = (key: keyof PerPosition, i: number) => terms.reduce((sum, t) => sum + t[key][i], base);
  return { prefill: (i) => at("prefill", i), gen: (j) => at("gen", j) };
}

/**
 * The comparisons a model fixture asks for, with bounds derived from its measurements.
 *
 * Each recorded llama.cpp run carries its own noise per position (`noise`: the same tokens as one
 * batch vs one token per call). It is ~5e-4 almost everywhere, but where an MoE router sits near
 * a tie a rounding difference picks another expert and the logits jump (0.28 seen on an F32
 * twin); an engine may land on either side of such a tie, so a run's bound at a position is
 * `exact` (the engine's distance from exact math) plus that run's noise there.
 *
 * F32 models: one comparison with llama.cpp.
 *
 * Quantized models: the reference engine dequantizes exactly as llama.cpp does and keeps
 * activations exact, while llama.cpp's CPU backend rounds activations to Q8_0/Q8_K/F16 before each
 * dot product. Each prompt therefore carries a second llama.cpp run over the same tokens, `twin`,
 * on the model's F32 twin (the same dequantized weights, F32 activations: exact math again), and
 * `quantDiff`, the measured top-8 difference between the two runs at every position.
 * 1. Against the twin: `exact` + twin noise. This pins the whole forward pass on the quantized
 *    file (dequantization, layouts, shards) to exact math.
 * 2. Against the quantized run, by the triangle inequality
 *      |ours − quant| ≤ |ours − twin| + |twin − quant| ≤ exact + twin noise + quantDiff
 *    per position. quantDiff reaches 0.11–0.16 logits on qwen35 and 0.8–1.5 on the MoE archs
 *    (the fixture's `quantNoise`), so this is the looser check, as llama.cpp's own numbers allow.
 * In every comparison our greedy id must equal llama.cpp's wherever its top-2 gap exceeds twice
 * the bound: beyond that no two in-bound logits can swap order.
 */
export function llamaComparisons(
  fixture: ModelFixture,
  name: string,
  exact: number = F32_TOLERANCE,
): ComparisonPlan {
  if (fixture.spec.quant === "f32") {
    return (record) => [{ label: "llama.cpp", run: record, tolerance: bound(exact, record.noise) }];
  }
  return (record, p) => {
    const { twin, quantDiff } = record;
    if (twin === undefined || quantDiff === undefined) {
      throw new Error(`Cannot check "${name}": prompt ${p} has no twin run; ${RECORD_HINT}`);
    }
    return [
      { label: TWIN_LABEL, run: twin, tolerance: bound(exact, twin.noise) },
      { label: "llama.cpp", run: record, tolerance: bound(exact, twin.noise, quantDiff) },
    ];
  };
}

/** Names of the model fixtures in tests/fixtures/, sorted. */
export function modelFixtureNames(): string[] {
  return [...Deno.readDirSync(FIXTURE_DIR)]
    .map((e) => e.name)
    .filter((n) => n.endsWith(".json") && n !== TOKENIZER_FIXTURE)
    .sort();
}

/**
 * Everything for one fixture file: generates its model, checks the sha256, opens it, runs
 * checkParity with llamaComparisons, and returns the report. `exact` is the engine's bound on its
 * distance from exact math (F32_TOLERANCE for the f64 reference).
 */
export async function checkFixture(
  name: string,
  open: StageChainFactory,
  exact: number = F32_TOLERANCE,
): Promise<{ fixture: ModelFixture; report: ParityReport }> {
  const fixture = await readFixture<ModelFixture>(name);
  const path = await testModel(fixture.spec);
  await checkModelHash(fixture, path, name);
  const model = await openGguf(path);
  try {
    const report = await checkParity(fixture, model, open, llamaComparisons(fixture, name, exact));
    return { fixture, report };
  } finally {
    model.close();
  }
}

/**
 * Free-running greedy generation (no teacher forcing, no near-tie exemption) must reproduce
 * llama.cpp's continuation token for token on every prompt: the gate for F32 weights,
 * where both sides compute exact f32 math and only summation order differs.
 */
export async function checkFreeRunning(name: string, open: StageChainFactory): Promise<void> {
  const fixture = await readFixture<ModelFixture>(name);
  const path = await testModel(fixture.spec);
  await checkModelHash(fixture, path, name);
  const model = await openGguf(path);
  const ctx = Math.max(...fixture.prompts.map((r) => r.ids.length + r.gen.length));
  const stages = await open(model, ctx);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  try {
    if (stages.length !== 1) {
      throw new RangeError(
        `Cannot run free: ${stages.length} stages were opened, expected the whole model`,
      );
    }
    for (const [p, record] of fixture.prompts.entries()) {
      // The server's decode loop, ignoring end-of-generation ids as llama.cpp's recording did.
      const request = greedy(record.ids, { maxTokens: record.gen.length, stopIds: new Set() });
      const { ids } = await completeOnce({ local: stages[0], tokenizer }, request);
      const at = ids.findIndex((id, i) => id !== record.gen[i]);
      if (at >= 0) {
        throw new Error(
          `${name} prompt ${p}: free-running greedy id ${
            ids[at]
          } at generated position ${at}, llama.cpp ${record.gen[at]} (ours ${
            JSON.stringify(ids)
          }, llama.cpp ${JSON.stringify(record.gen)})`,
        );
      }
    }
  } finally {
    for (const s of stages) s.close();
    model.close();
  }
}
