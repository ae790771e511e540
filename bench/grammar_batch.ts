// The bench's grammar part (`--only grammar`): the head CPU that one step's token masks take when N
// constrained sequences decode at once under lib/grammar, the server's engine (issue 26 point 4).
//
// The scheduler awaits each sequence's mask before that sequence's run (Sequence.adjust), and a
// walk is synchronous work on the head's thread, so a step's masks run one after another: their
// sum, which timeBatch measures, is what the step waits for. Each case runs twice in this process:
// first cold (no mask of its grammars cached, as after a start), then warm (the same grammars again,
// as an agent's next turns meet them), the figures that the target reads.

import { openGguf } from "../engine/gguf/read.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { bigTokenizer } from "../tests/_big_vocab.ts";
import { PRESETS } from "../tools/synth/presets.ts";
import { OurEngine, timeBatch } from "./grammar_engines.ts";
import { BENCH_SPECS } from "./grammar_specs.ts";
import { percentile } from "./measure.ts";

/**
 * The workloads: the typical agentic request (the same forced tool call every turn, as the server
 * masks tool calls) and a mix of response_format schemas (every bench schema but the GBNF, whose
 * character-class rule chains are a known weak spot: docs/PERFORMANCE-NOTES.md, "Grammar masks").
 */
export const GRAMMAR_CASES: Readonly<Record<string, readonly string[]>> = {
  agentic: ["tool-call"],
  mix: [
    "free-strings",
    "bounded-strings",
    "pattern",
    "counted-pattern",
    "loop-exit",
    "enum",
    "numbers",
  ],
};

/** ms per step, all the sequences' masks together, over the steps timed. */
export interface StepFigures {
  readonly stepMsP50: number;
  readonly stepMsP90: number;
  readonly stepMsP99: number;
  readonly stepMsMax: number;
}

export interface GrammarCase extends StepFigures {
  readonly name: string;
  /** BENCH_SPECS names; sequence i decodes under grammars[i mod length]. */
  readonly grammars: readonly string[];
  /**
   * The process's CPU time in the same steps (every thread): where it is far below the wall
   * figures, the head's thread was preempted (a shared box), and those are not the masks' cost.
   */
  readonly processCpu: StepFigures;
  /** The median step's accepts (every sequence's token fed to its grammar), ms. */
  readonly acceptMsP50: number;
  /** Replies begun over the timed steps, the first N included. */
  readonly documents: number;
  /** The same workload's first run in this process, before any of its masks was cached. */
  readonly cold: StepFigures;
}

export interface GrammarReport {
  /** Sequences decoding at once. */
  readonly sequences: number;
  /** Steps timed per run of a case. */
  readonly steps: number;
  /** Tokens of a reply before its sequence starts another. */
  readonly replyTokens: number;
  /** Whether masks keep to a budget of replyTokens (max_tokens ≤ 4096) or check none. */
  readonly budget: boolean;
  readonly vocabulary: {
    readonly tokens: number;
    /** Tokens with bytes: the ones a mask walks. */
    readonly textTokens: number;
    /** The model's own, or the bench model's preset with its unused fillers made text. */
    readonly source: "model" | "tests/_big_vocab.ts";
  };
  /** Building lib/grammar's index of the vocabulary (the head does it at start-up), ms. */
  readonly indexMs: number;
  /** The CPU's model name and its cores, and the load average before and after. */
  readonly cpu: string;
  readonly loadAverage: readonly [number, number];
  readonly cases: readonly GrammarCase[];
}

/** Where the vocabulary comes from: the model's, tests/_big_vocab.ts's, or chosen by benchVocabulary. */
export const GRAMMAR_VOCABS = ["auto", "model", "big"] as const;
export type GrammarVocab = typeof GRAMMAR_VOCABS[number];

export interface GrammarOptions {
  readonly tokenizer: TextTokenizer;
  readonly source: GrammarReport["vocabulary"]["source"];
  readonly sequences: number;
  readonly steps: number;
  readonly replyTokens: number;
  readonly budget: boolean;
  readonly seed: number;
  readonly log: (line: string) => void;
}

/** The bench model's preset: its vocabulary has this size, most of it unused fillers. */
const BIG_VOCAB = PRESETS["qwen35moe-35b"].vocab.padTo!;

/** Whether `tokenizer` is a generated model's of the bench preset's size: mostly fillers. */
export function isPresetFiller(
  tokenizer: Pick<TextTokenizer, "vocabSize" | "tokenBytes">,
): boolean {
  if (tokenizer.vocabSize !== BIG_VOCAB) return false;
  let empty = 0;
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    if (tokenizer.tokenBytes(id, { specials: false }).length === 0) empty++;
  }
  return empty > tokenizer.vocabSize / 2;
}

/**
 * The vocabulary to mask over. "auto": the model's own, unless it is a generated model of the
 * bench preset's vocabulary, whose unused fillers (no bytes, never walked) would make masks look
 * cheap: then "big", tests/_big_vocab.ts's, the preset's ids with the fillers made text tokens of a
 * real vocabulary's kinds (its size on any model, so that a small one measures it too).
 */
export async function benchVocabulary(
  model: string,
  choice: GrammarVocab,
  seed: number,
): Promise<Pick<GrammarOptions, "tokenizer" | "source">> {
  const big = () => ({ tokenizer: bigTokenizer(seed), source: "tests/_big_vocab.ts" } as const);
  if (choice === "big") return big();
  const gguf = await openGguf(model);
  const own = TextTokenizer.fromGguf(gguf.metadata);
  gguf.close();
  if (choice === "auto" && isPresetFiller(own)) return big();
  return { tokenizer: own, source: "model" };
}

function cpuName(): string {
  let name = "unknown CPU";
  try {
    name = /^model name\s*:\s*(.+)$/m.exec(Deno.readTextFileSync("/proc/cpuinfo"))?.[1] ?? name;
  } catch {
    // No /proc (not Linux): the name stays unknown; the cores are still counted.
  }
  return `${name} (${navigator.hardwareConcurrency} cores)`;
}

function figures(ms: readonly number[]): StepFigures {
  return {
    stepMsP50: percentile(ms, 0.5),
    stepMsP90: percentile(ms, 0.9),
    stepMsP99: percentile(ms, 0.99),
    stepMsMax: Math.max(...ms),
  };
}

/** Times every case of GRAMMAR_CASES, cold then warm, on one vocabulary index. */
export async function benchGrammar(options: GrammarOptions): Promise<GrammarReport> {
  const { tokenizer, source, sequences, steps, replyTokens, budget, seed, log } = options;
  const loadBefore = Deno.loadavg()[0];
  const start = performance.now();
  const engine = new OurEngine(tokenizer);
  const indexMs = performance.now() - start;
  log(
    `grammar: ${tokenizer.vocabSize}-token vocabulary (${source}), index built in ` +
      `${indexMs.toFixed(0)} ms; ${sequences} sequences, ${steps} steps a run`,
  );
  const cases: GrammarCase[] = [];
  for (const [name, grammars] of Object.entries(GRAMMAR_CASES)) {
    const specs = grammars.map((g) => BENCH_SPECS[g]);
    const run = (runSeed: number) =>
      timeBatch(engine, tokenizer, specs, {
        sequences,
        steps,
        maxTokens: replyTokens,
        budget,
        seed: runSeed,
      });
    const cold = await run(seed);
    const warm = await run(seed + 1);
    const c: GrammarCase = {
      name,
      grammars,
      ...figures(warm.maskMs),
      processCpu: figures(warm.maskCpuMs),
      acceptMsP50: percentile(warm.acceptMs, 0.5),
      documents: warm.documents,
      cold: figures(cold.maskMs),
    };
    log(
      `grammar ${name}: ms a step p50 ${c.stepMsP50.toFixed(3)}, p99 ${c.stepMsP99.toFixed(2)}, ` +
        `max ${c.stepMsMax.toFixed(2)} (cold max ${c.cold.stepMsMax.toFixed(1)})`,
    );
    cases.push(c);
  }
  return {
    sequences,
    steps,
    replyTokens,
    budget,
    vocabulary: {
      tokens: tokenizer.vocabSize,
      textTokens: engine.vocab.all.ids.length,
      source,
    },
    indexMs,
    cpu: cpuName(),
    loadAverage: [loadBefore, Deno.loadavg()[0]],
    cases,
  };
}
