// How long a grammar's next-token mask takes on the head's CPU, lib/grammar beside xgrammar in one
// run, on a vocabulary of the bench model's size: per mask, per request (cold and warm), per step.
//
// Usage: deno run -A bench/grammar_mask.ts --help. Each grammar decodes documents under both engines
// at once, a seeded token both allow each step, every mask timed (event-loop slices off: pure CPU).
// Cold: a schema or grammar neither engine has seen (compile, then the first document); warm: the
// same one again. lib/grammar keeps to the token budget as the server does; xgrammar has none.

import {
  type Command,
  type Flag,
  flag,
  type FlagValues,
  listOf,
  oneOf,
  runCommand,
  switchFlag,
  whole,
} from "../lib/cli.ts";
import { bigTokenizer } from "../tests/_big_vocab.ts";
import { rng } from "../tests/_fuzz.ts";
import {
  type EngineConstraint,
  type Engines,
  quantile,
  runDocument,
  timeBatch,
  UNBUDGETED,
} from "./grammar_engines.ts";
import { BENCH_SPECS, fresh, type GrammarSpec } from "./grammar_specs.ts";
import { buildEngines } from "./xgrammar.ts";

const NAMES = Object.keys(BENCH_SPECS);

const GRAMMAR_MASK = {
  name: "Grammar mask bench",
  usage: "deno run -A bench/grammar_mask.ts",
  about: "Times lib/grammar's and xgrammar's token masks on a 248,320-token vocabulary (the " +
    "qwen35moe-35b preset's, its unused fillers made text tokens): per mask, the compile of a " +
    "new and of a repeated request, and with --batch N the steps of N sequences at once.",
  flags: {
    grammars: flag(listOf(oneOf(NAMES)), "the grammars to time", NAMES),
    steps: flag(whole(1, 100_000), "masks timed per grammar", 300),
    "max-tokens": flag(whole(8, 4096), "the token limit of each document", 64),
    batch: flag(whole(0, 1024), "also time steps of this many sequences decoding at once", 0),
    "batch-steps": flag(whole(1, 100_000), "steps timed per engine with --batch", 200),
    unbudgeted: switchFlag(
      "no token budget on lib/grammar's masks, as for a request with over 4,096 tokens left " +
        "(agents send max_tokens 32,000) and as xgrammar always",
    ),
    seed: flag(whole(0, 2 ** 32 - 1), "the seed of the vocabulary's fillers and of the choices", 1),
  },
} satisfies Command<Record<string, Flag<unknown>>>;

type Values = FlagValues<typeof GRAMMAR_MASK.flags>;

/** One engine's figures on one grammar (ms). */
interface Figures {
  readonly ms: number[];
  /** Compile (and a new constraint) of a new request, and of the same request again. */
  readonly coldCompile: number;
  readonly warmCompile: number;
  /** The first mask of the first document, and of the request again. */
  readonly coldFirst: number;
  readonly warmFirst: number;
  /** Every mask of the first document, and the mean document's after it. */
  readonly coldDoc: number;
  readonly warmDoc: number;
}

/** Compiles `spec` under each engine and starts a constraint; the ms each took. */
async function start(
  engines: Engines,
  spec: GrammarSpec,
): Promise<{ constraints: EngineConstraint[]; ms: number[] }> {
  const constraints: EngineConstraint[] = [];
  const ms: number[] = [];
  for (const engine of engines.list) {
    const t = performance.now();
    constraints.push(await engine.constraint(await engine.compile(spec)));
    ms.push(performance.now() - t);
  }
  return { constraints, ms };
}

const sum = (list: readonly number[]) => list.reduce((a, b) => a + b, 0);

/**
 * A new request (`spec` made fresh), decoded under both engines until `steps` masks are timed,
 * then the same request once more.
 */
async function timeGrammar(
  engines: Engines,
  spec: GrammarSpec,
  n: number,
  values: Values,
): Promise<Figures[]> {
  const random = rng(values.seed);
  const request = fresh(spec, n);
  const cold = await start(engines, request);
  const ms: number[][] = engines.list.map(() => []);
  const docs: number[][] = engines.list.map(() => []);
  let constraints = cold.constraints;
  while (ms[0].length < values.steps) {
    const run = await runDocument(engines, constraints, {
      maxTokens: values["max-tokens"],
      budget: !values.unbudgeted,
      random,
      stepsLeft: values.steps - ms[0].length,
    });
    for (const c of constraints) c.dispose?.();
    run.ms.forEach((list, e) => {
      ms[e].push(...list);
      docs[e].push(sum(list));
    });
    constraints = (await start(engines, request)).constraints;
  }
  for (const c of constraints) c.dispose?.();
  const warm = await start(engines, request);
  const warmFirst: number[] = [];
  for (const c of warm.constraints) {
    const t = performance.now();
    await c.mask(values.unbudgeted ? UNBUDGETED : values["max-tokens"]);
    warmFirst.push(performance.now() - t);
    c.dispose?.();
  }
  return engines.list.map((_, e) => ({
    ms: ms[e],
    coldCompile: cold.ms[e],
    warmCompile: warm.ms[e],
    coldFirst: ms[e][0],
    warmFirst: warmFirst[e],
    coldDoc: docs[e][0],
    warmDoc: docs[e].length > 1 ? sum(docs[e].slice(1)) / (docs[e].length - 1) : docs[e][0],
  }));
}

const f = (x: number, width: number, digits = 2) => x.toFixed(digits).padStart(width);

async function main(values: Values): Promise<void> {
  const t = performance.now();
  const tokenizer = bigTokenizer(values.seed);
  console.log(
    `vocabulary: ${tokenizer.vocabSize} tokens, made in ${
      (performance.now() - t).toFixed(0)
    } ms; ` +
      `load average ${Deno.loadavg().join(" ")}`,
  );
  const engines = await buildEngines(tokenizer);
  engines.list.forEach((e, i) => {
    console.log(`${e.name}: vocabulary index built in ${engines.setupMs[i].toFixed(0)} ms`);
  });
  console.log(
    "\nms; cold: a new request (compile, first mask, first document's masks); warm: the same " +
      "request again (compile, first mask, a later document's masks)\n",
  );
  console.log(
    "grammar          engine       steps  median     p90     p99     max    mean  " +
      "cold compile  first     doc  warm compile  first     doc",
  );
  let n = 0;
  for (const name of values.grammars) {
    const figures = await timeGrammar(engines, BENCH_SPECS[name], n++, values);
    figures.forEach((fig, e) => {
      const ms = [...fig.ms].sort((a, b) => a - b);
      console.log(
        `${(e === 0 ? name : "").padEnd(16)} ${engines.list[e].name.padEnd(11)} ` +
          `${String(ms.length).padStart(6)} ${f(quantile(ms, 0.5), 7)} ${
            f(quantile(ms, 0.9), 7)
          } ` +
          `${f(quantile(ms, 0.99), 7)} ${f(ms.at(-1)!, 7)} ${f(sum(ms) / ms.length, 7)} ` +
          `${f(fig.coldCompile, 13, 1)} ${f(fig.coldFirst, 6)} ${f(fig.coldDoc, 7, 1)} ` +
          `${f(fig.warmCompile, 13, 1)} ${f(fig.warmFirst, 6)} ${f(fig.warmDoc, 7, 1)}`,
      );
    });
  }
  console.log(`load average ${Deno.loadavg().join(" ")}`);
  if (values.batch === 0) return;
  console.log(
    `\n${values.batch} sequences at once, sequence i under grammar i mod ` +
      `${values.grammars.length} (${values.grammars.join(", ")}), each on its own document; ` +
      `ms per step, all sequences' masks (and accepts) together\n`,
  );
  console.log(
    "engine       steps  mask median     p90     p99     max  accept median     max  documents",
  );
  const specs = values.grammars.map((g) => BENCH_SPECS[g]);
  for (const engine of engines.list) {
    const timing = await timeBatch(engine, tokenizer, specs, {
      sequences: values.batch,
      steps: values["batch-steps"],
      maxTokens: values["max-tokens"],
      budget: !values.unbudgeted,
      seed: values.seed,
    });
    const mask = [...timing.maskMs].sort((a, b) => a - b);
    const accept = [...timing.acceptMs].sort((a, b) => a - b);
    console.log(
      `${engine.name.padEnd(11)} ${String(mask.length).padStart(6)} ` +
        `${f(quantile(mask, 0.5), 12)} ${f(quantile(mask, 0.9), 7)} ${
          f(quantile(mask, 0.99), 7)
        } ` +
        `${f(mask.at(-1)!, 7)} ${f(quantile(accept, 0.5), 14)} ${f(accept.at(-1)!, 7)} ` +
        `${String(timing.documents).padStart(10)}`,
    );
  }
}

await runCommand(GRAMMAR_MASK, main);
