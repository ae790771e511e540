// Whether lib/grammar and xgrammar give the same masks on the structured-output tests' grammars:
// seeded documents decoded under both at once, every step's masks compared, differences listed.
//
// Usage: deno run -A bench/grammar_compare.ts --help. No token budget (xgrammar has none), so each
// mask is the grammar's alone; a token both allow is picked each step, so the documents are shared.

import {
  type Command,
  type Flag,
  flag,
  type FlagValues,
  listOf,
  oneOf,
  runCommand,
  whole,
} from "../lib/cli.ts";
import type { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { bigTokenizer } from "../tests/_big_vocab.ts";
import { rng } from "../tests/_fuzz.ts";
import { tinyTokenizer } from "../tests/_tiny_tokenizer.ts";
import { type MaskDiff, runDocument } from "./grammar_engines.ts";
import { BENCH_SPECS, TEST_SPECS } from "./grammar_specs.ts";
import { buildEngines } from "./xgrammar.ts";

const SPECS = { ...TEST_SPECS, ...BENCH_SPECS };
const NAMES = Object.keys(SPECS);
const VOCABS = ["tiny", "big"] as const;

const GRAMMAR_COMPARE = {
  name: "Grammar mask comparison",
  usage: "deno run -A bench/grammar_compare.ts",
  about: "Decodes seeded documents under lib/grammar and xgrammar at once and lists the steps " +
    "where their masks differ, on the structured-output tests' grammars and the bench's.",
  flags: {
    grammars: flag(listOf(oneOf(NAMES)), "the grammars to compare", NAMES),
    vocab: flag(
      oneOf(VOCABS),
      "tiny: the test model's vocabulary; big: the bench's 248,320 tokens",
      "tiny",
    ),
    documents: flag(whole(1, 10_000), "documents per grammar", 16),
    "max-tokens": flag(whole(1, 4096), "the token limit of each document", 96),
    shown: flag(whole(0, 1000), "differences printed per grammar", 4),
    seed: flag(whole(0, 2 ** 32 - 1), "the seed of the choices", 1),
  },
} satisfies Command<Record<string, Flag<unknown>>>;

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Up to five of `ids` as their text, or their bytes where they are not UTF-8. */
function sample(tokenizer: TextTokenizer, ids: readonly number[]): string {
  const shown = ids.slice(0, 5).map((id) => {
    if (tokenizer.eosIds.has(id)) return "<eos>";
    const bytes = tokenizer.tokenBytes(id, { specials: false });
    try {
      return JSON.stringify(utf8.decode(bytes));
    } catch {
      return `<${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join(" ")}>`;
    }
  });
  return `${ids.length}${ids.length ? ` (${shown.join(" ")}${ids.length > 5 ? " …" : ""})` : ""}`;
}

async function main(values: FlagValues<typeof GRAMMAR_COMPARE.flags>): Promise<void> {
  const tokenizer = values.vocab === "tiny" ? tinyTokenizer("qwen35").tokenizer : bigTokenizer(1);
  const engines = await buildEngines(tokenizer);
  console.log(`vocabulary: ${values.vocab}, ${tokenizer.vocabSize} tokens`);
  let differing = 0;
  for (const name of values.grammars) {
    const spec = SPECS[name];
    const random = rng(values.seed);
    let compiled: unknown[];
    try {
      compiled = await Promise.all(engines.list.map((e) => e.compile(spec)));
    } catch (e) {
      console.log(`\n${name}: xgrammar refuses it: ${e instanceof Error ? e.message : e}`);
      differing++;
      continue;
    }
    let steps = 0;
    const diffs: MaskDiff[] = [];
    const ends: Record<string, number> = {};
    const texts: string[] = [];
    for (let d = 0; d < values.documents; d++) {
      const constraints = await Promise.all(engines.list.map((e, i) => e.constraint(compiled[i])));
      const run = await runDocument(engines, constraints, {
        maxTokens: values["max-tokens"],
        budget: false,
        random,
      });
      for (const c of constraints) c.dispose?.();
      steps += run.ms[0].length;
      diffs.push(...run.diffs);
      ends[run.end] = (ends[run.end] ?? 0) + 1;
      if (texts.length < 2) texts.push(run.text);
    }
    if (diffs.length) differing++;
    console.log(
      `\n${name}: ${steps} steps, ${diffs.length} with different masks; documents end ` +
        Object.entries(ends).map(([k, v]) => `${k} ${v}`).join(", "),
    );
    for (const t of texts) console.log(`  e.g. ${JSON.stringify(t.slice(0, 120))}`);
    for (const diff of diffs.slice(0, values.shown)) {
      console.log(
        `  step ${diff.step} after ${JSON.stringify(diff.text.slice(-50))}: only lib/grammar ` +
          `${sample(tokenizer, diff.only[0])}; only xgrammar ${sample(tokenizer, diff.only[1])}`,
      );
    }
  }
  console.log(`\n${differing} of ${values.grammars.length} grammars differ`);
}

await runCommand(GRAMMAR_COMPARE, main);
