// How long a grammar's next-token mask takes on the CPU per generated token (lib/grammar/token_mask.ts)
// on a vocabulary of the bench model's size: the head computes one before every constrained token.
//
// Usage: deno run -A bench/grammar_mask.ts --help. Each grammar decodes documents with seeded choices
// among the allowed tokens; mask() is timed per step (event-loop slices off: pure CPU). Masks are
// cached per grammar across documents, as across requests: the first document's mean is the cold one.

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
import type { Grammar } from "../lib/grammar/grammar.ts";
import { GrammarConstraint, VocabIndex } from "../lib/grammar/token_mask.ts";
import type { Json } from "../lib/server/fields.ts";
import { replyGrammar } from "../lib/server/tool_grammar.ts";
import type { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { bigTokenizer } from "../tests/_big_vocab.ts";
import { rng } from "../tests/_fuzz.ts";

const schema = (s: Json): Grammar =>
  replyGrammar({ format: { type: "json_schema", schema: s, path: "schema" }, reasoning: false })!;

/** An object of `properties`, all required and no others. */
const objectOf = (properties: Record<string, Json>): Grammar =>
  schema({
    type: "object",
    properties,
    required: Object.keys(properties),
    additionalProperties: false,
  });

/** The grammars timed: what structured-output requests commonly ask for. */
const GRAMMARS: Readonly<Record<string, () => Grammar>> = {
  "free-strings": () =>
    objectOf({ name: { type: "string" }, city: { type: "string" }, bio: { type: "string" } }),
  "bounded-strings": () =>
    objectOf({
      name: { type: "string", maxLength: 40 },
      bio: { type: "string", minLength: 10, maxLength: 300 },
    }),
  pattern: () =>
    objectOf({
      sku: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
      slug: { type: "string", pattern: "^[a-z0-9]+(-[a-z0-9]+)*$" },
      title: { type: "string", pattern: "^[A-Za-z ,.]{1,40}$" },
      when: { type: "string", format: "date" },
    }),
  "counted-pattern": () =>
    objectOf({
      title: { type: "string", pattern: "^[A-Za-z ,.]{1,40}$" },
      handle: { type: "string", pattern: "^[a-z0-9_]{3,16}$" },
      note: { type: "string", pattern: "^.{0,80}$", minLength: 5 },
    }),
  "loop-exit": () =>
    objectOf({
      sentence: { type: "string", pattern: "^[A-Za-z ]{1,40}\\.$" },
      name: { type: "string", pattern: "^[A-Z][a-z]{1,30}$" },
      user: { type: "string", pattern: "^[a-z0-9_]{3,16}(@[a-z]{2,8})?$" },
    }),
  enum: () =>
    objectOf({
      color: { enum: ["red", "green", "blue", "dark purple"] },
      size: { enum: ["small", "medium", "large"] },
      tags: { type: "array", items: { enum: ["new", "sale", "gift"] }, maxItems: 3 },
    }),
  numbers: () =>
    objectOf({
      qty: { type: "integer", minimum: 1, maximum: 99 },
      price: { type: "number", exclusiveMinimum: 0, maximum: 1000 },
      lat: { type: "number", minimum: -90, maximum: 90 },
      points: { type: "array", items: { type: "integer" }, maxItems: 4 },
    }),
  "tool-call": () =>
    replyGrammar({
      forced: [{
        name: "get_weather",
        schemaPath: "tools.0.input_schema",
        inputSchema: {
          type: "object",
          properties: {
            location: { type: "string", description: "City and country" },
            unit: { enum: ["celsius", "fahrenheit"] },
            days: { type: "integer", minimum: 1, maximum: 14 },
          },
          required: ["location", "unit"],
        },
      }],
      reasoning: false,
    })!,
};
const NAMES = Object.keys(GRAMMARS);

const GRAMMAR_MASK = {
  name: "Grammar mask bench",
  usage: "deno run -A bench/grammar_mask.ts",
  about: "Times the constrained-decoding token mask per step on a 248,320-token vocabulary (the " +
    "qwen35moe-35b preset's, its unused fillers made text tokens).",
  flags: {
    grammars: flag(listOf(oneOf(NAMES)), "the grammars to time", NAMES),
    steps: flag(whole(1, 100_000), "masks timed per grammar", 300),
    "max-tokens": flag(whole(8, 4096), "the token limit of each document", 64),
    seed: flag(whole(0, 2 ** 32 - 1), "the seed of the vocabulary's fillers and of the choices", 1),
  },
} satisfies Command<Record<string, Flag<unknown>>>;

const isSet = (mask: Uint32Array, id: number) => ((mask[id >>> 5] >>> (id & 31)) & 1) === 1;

/** The allowed ids of `mask`. */
function allowedIds(mask: Uint32Array, vocabSize: number): number[] {
  const ids: number[] = [];
  for (let id = 0; id < vocabSize; id++) if (isSet(mask, id)) ids.push(id);
  return ids;
}

interface Timing {
  readonly ms: number[];
  readonly allowed: number[];
  /** Steps of the first document, before the grammar's masks are cached. */
  cold: number;
  documents: number;
}

/**
 * Decodes documents under `grammar` until `steps` masks are timed. Each step picks a random
 * allowed token, one that is not plain string text a fifth of the time (so strings close).
 */
async function timeGrammar(
  grammar: Grammar,
  tokenizer: TextTokenizer,
  vocab: VocabIndex,
  values: FlagValues<typeof GRAMMAR_MASK.flags>,
): Promise<Timing> {
  const random = rng(values.seed);
  const out: Timing = { ms: [], allowed: [], cold: 0, documents: 0 };
  while (out.ms.length < values.steps) {
    out.documents++;
    const c = new GrammarConstraint(grammar, vocab, { sliceMs: Infinity });
    for (let n = 0; n < values["max-tokens"] && !c.done && out.ms.length < values.steps; n++) {
      const start = performance.now();
      const mask = await c.mask(values["max-tokens"] - n);
      out.ms.push(performance.now() - start);
      const ids = allowedIds(mask, tokenizer.vocabSize);
      out.allowed.push(ids.length);
      const special = ids.filter((id) => !isSet(vocab.plain, id));
      const from = special.length && random() < 0.2 ? special : ids;
      const id = from[Math.floor(random() * from.length)];
      if (tokenizer.eosIds.has(id)) break;
      c.accept(id);
    }
    if (out.documents === 1) out.cold = out.ms.length;
  }
  return out;
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

async function main(values: FlagValues<typeof GRAMMAR_MASK.flags>): Promise<void> {
  const start = performance.now();
  const tokenizer = bigTokenizer(values.seed);
  const vocab = VocabIndex.of(tokenizer);
  console.log(
    `vocabulary: ${tokenizer.vocabSize} tokens, ${vocab.all.ids.length} with bytes, ` +
      `${vocab.plainIds.length} plain string text; tokenizer and index built in ` +
      `${(performance.now() - start).toFixed(0)} ms`,
  );
  console.log(
    "grammar          steps  docs  median ms  p90 ms  mean ms  max ms  first doc mean ms  " +
      "allowed (median)",
  );
  for (const name of values.grammars) {
    const t = await timeGrammar(GRAMMARS[name](), tokenizer, vocab, values);
    const ms = [...t.ms].sort((a, b) => a - b);
    const allowed = [...t.allowed].sort((a, b) => a - b);
    const mean = (list: readonly number[]) => list.reduce((a, b) => a + b, 0) / list.length;
    console.log(
      `${name.padEnd(15)} ${String(ms.length).padStart(6)} ${String(t.documents).padStart(5)} ` +
        `${quantile(ms, 0.5).toFixed(2).padStart(10)} ${
          quantile(ms, 0.9).toFixed(2).padStart(7)
        } ` +
        `${mean(ms).toFixed(2).padStart(8)} ${ms.at(-1)!.toFixed(1).padStart(7)} ` +
        `${mean(t.ms.slice(0, t.cold)).toFixed(2).padStart(18)} ` +
        `${String(quantile(allowed, 0.5)).padStart(17)}`,
    );
  }
}

await runCommand(GRAMMAR_MASK, main);
