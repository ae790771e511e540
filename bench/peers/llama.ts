// The llama.cpp peer: pp/tg and concurrent load on the bench's GGUF through node-llama-cpp's
// prebuilt Vulkan build. Spawned by bench/decode.ts under Deno with --node-modules-dir=manual;
// answers JSON on stdout.
//
// node-llama-cpp lives in bench/peers/node_modules (npm install here, or unpacked from
// .gpu/peers.tar.xz on the GPU box) and is imported by a computed URL, so that `deno check` and
// CI never resolve it. Only the few calls used below are typed. Where Vulkan shows no GPU (Mesa's
// CPU adapter is not one to llama.cpp) the same build runs on llama.cpp's CPU backend, so the
// install above is all a CPU run needs; on a shared machine give it --threads 1.

import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  type Kind,
  listOf,
  requiredFlag,
  runCommand,
  text,
  whole,
} from "../../lib/cli.ts";
import {
  BENCH_SAMPLING,
  Deadline,
  DEFAULT_RUNS,
  type Figure,
  measure,
  OutOfTime,
  repeat,
  seededIds,
} from "../measure.ts";
import type { SamplingParams } from "../../lib/sampling/sample.ts";
import {
  type Evaluate,
  type LoadFailure,
  type LoadFigure,
  loadFigure,
  type LoadRun,
  runLoad,
} from "./load.ts";

export type { LoadFailure, LoadFigure };

/** A token to evaluate; with generateNext, the token sampled after it is returned. */
type Input = number | [number, {
  generateNext: {
    token: true;
    /** Without options llama.cpp samples greedily. */
    options?: { temperature: number; topK: number; topP: number; seed: number };
  };
}];

interface Sequence {
  /** Tokens the sequence holds; node-llama-cpp erases and re-evaluates some past contextSize − 1. */
  readonly nextTokenIndex: number;
  clearHistory(): Promise<void>;
  /** Erases [start, end); on a hybrid model it restores the recurrent state from a checkpoint. */
  eraseContextTokenRanges(ranges: { start: number; end: number }[]): Promise<void>;
  /** Copies the recurrent state at the last token held, for eraseContextTokenRanges to restore. */
  takeCheckpoint(): Promise<void>;
  evaluateWithoutGeneratingNewTokens(tokens: number[]): Promise<void>;
  controlledEvaluate(
    input: Input[],
  ): Promise<(undefined | { next: { token?: number | null } })[]>;
}

interface Context {
  readonly contextSize: number;
  readonly batchSize: number;
  readonly flashAttention: boolean | string;
  readonly idealThreads: number;
  getSequence(options: { checkpoints: { interval: false } }): Sequence;
  dispose(): Promise<void>;
}

interface Model {
  createContext(options: {
    contextSize: number;
    batchSize: number;
    sequences: number;
    flashAttention: "auto";
    threads: number | undefined;
  }): Promise<Context>;
  dispose(): Promise<void>;
}

interface Llama {
  readonly gpu: string | false;
  readonly buildType: string;
  readonly llamaCppRelease: { readonly repo: string; readonly release: string };
  getGpuDeviceNames(): Promise<string[]>;
  loadModel(
    options: { modelPath: string; gpuLayers: "max" | number },
  ): Promise<Model>;
  dispose(): Promise<void>;
}

interface NodeLlamaCpp {
  getLlama(options: {
    gpu: "vulkan" | false;
    build: "never";
    logLevel: string;
    logger: (level: string, message: string) => void;
  }): Promise<Llama>;
  readonly LlamaLogLevel: { readonly warn: string };
}

/** What this script prints: which llama.cpp ran, how, and its figures by name (pp512, tg128…). */
export interface PeerReport {
  readonly name: string;
  readonly nodeLlamaCpp: string;
  readonly llamaCpp: string;
  readonly gpu: string | false;
  readonly devices: readonly string[];
  readonly settings: {
    readonly contextSize: number;
    readonly batchSize: number;
    readonly flashAttention: boolean | string;
    readonly gpuLayers: string;
    readonly threads: number;
  };
  /** Seconds to load the model. */
  readonly loadSeconds: number;
  readonly figures: Readonly<Record<string, Figure>>;
  /** With --load: per client count, in its order, the figure or why it is missing. */
  readonly load?: readonly (LoadFigure | LoadFailure)[];
  /** With --load: what each of the load's sequences does. */
  readonly loadWorkload?: {
    readonly promptTokens: number;
    readonly generatedTokens: number;
    readonly sampling: SamplingParams;
  };
}

/** Throws unless `sequence` holds `tokens`: node-llama-cpp shifts a full context silently. */
function holds(sequence: Sequence, tokens: number): void {
  if (sequence.nextTokenIndex !== tokens) {
    throw new Error(
      `node-llama-cpp holds ${sequence.nextTokenIndex} tokens where ${tokens} were fed: it ` +
        "shifted the context, so the run did other work than the figure says",
    );
  }
}

const PACKAGE = new URL("./node_modules/node-llama-cpp/", import.meta.url);

async function load(): Promise<{ nlc: NodeLlamaCpp; version: string }> {
  let version: string;
  try {
    version = JSON.parse(await Deno.readTextFile(new URL("package.json", PACKAGE)))
      .version;
  } catch (e) {
    throw new Error(
      `Cannot find node-llama-cpp in ${PACKAGE.pathname} (${(e as Error).message}): run ` +
        "`npm install --ignore-scripts --omit=optional` in bench/peers, or unpack .gpu/peers.tar.xz",
    );
  }
  const entry = new URL("dist/index.js", PACKAGE).href;
  return { nlc: await import(entry) as NodeLlamaCpp, version };
}

/** Layers llama.cpp offloads: all of them, or a count. */
const offload: Kind<"max" | number> = {
  value: "max|N",
  parse: (t) => t === "max" ? "max" : whole(0).parse(t),
};

const PEER = {
  name: "llama.cpp peer",
  usage: "deno run -A --node-modules-dir=manual bench/peers/llama.ts",
  about: "The bench's pp/tg and load figures of llama.cpp (node-llama-cpp's Vulkan build) on " +
    "one GGUF, as JSON on stdout (started by bench/decode.ts).",
  flags: {
    model: requiredFlag(text("PATH"), "the GGUF file"),
    vocab: requiredFlag(
      whole(1),
      "the model's vocabulary size, for the seeded prompt ids",
    ),
    pp: flag(listOf(whole(1)), "prefill lengths", [512, 2048]),
    tg: flag(whole(1), "decode steps", 128),
    "tg-depth": flag(
      listOf(whole(1)),
      "also decode after a prefix of D tokens, figure tgN@D (llama-bench's -d)",
    ),
    runs: flag(whole(1), "timed runs per figure", DEFAULT_RUNS),
    seed: flag(whole(0), "seed of the prompt ids", 1),
    batch: flag(whole(1), "positions per llama_decode", 512),
    "deadline-s": flag(
      whole(1),
      "stop starting measurements after S seconds",
      600,
    ),
    "gpu-layers": flag(offload, "layers offloaded to the GPU", "max"),
    threads: flag(whole(1), "llama.cpp's CPU threads (default node-llama-cpp's: every math core)"),
    load: flag(
      listOf(whole(1)),
      "also run N sequences at once, per N, each prefilling and generating (the load figures)",
    ),
    "load-prompt": flag(whole(1), "prompt tokens of each load sequence", 512),
    "load-tokens": flag(whole(2), "tokens each load sequence generates", 128),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof PEER.flags>): Promise<void> {
  const { vocab, tg, runs, seed } = values;
  const pps = values.pp;
  const depths = values["tg-depth"] ?? [];
  const threads = values.threads;
  const deadline = new Deadline(values["deadline-s"]);
  const gpuLayers = values["gpu-layers"];
  const { nlc, version } = await load();
  const llama = await nlc.getLlama({
    gpu: "vulkan",
    build: "never",
    logLevel: nlc.LlamaLogLevel.warn,
    logger: (_level, message) => console.error(message.trimEnd()),
  });
  const loadStart = performance.now();
  const model = await llama.loadModel({ modelPath: values.model, gpuLayers });
  const loadSeconds = (performance.now() - loadStart) / 1000;
  // One 512-token ubatch per llama_decode (node-llama-cpp sets n_ubatch = n_batch), as
  // llama-bench's default n_ubatch: pp2048 is four of them. A sequence holds contextSize − 1
  // tokens: at the last one node-llama-cpp shifts the context, which on this hybrid model means
  // erasing the first 100 tokens and evaluating the rest again (a context of exactly 2048 made
  // pp2048 about 4000 tokens of work), hence the + 1 and the check after each run.
  const context = await model.createContext({
    contextSize: Math.max(...pps, tg, ...depths.map((d) => d + tg)) + 1,
    batchSize: values.batch,
    sequences: 1,
    flashAttention: "auto",
    threads,
  });
  // No checkpoints of the recurrent state every 8192 tokens (node-llama-cpp's default for hybrid
  // models, so that it can erase the tail of a sequence): pp8192 and longer would time them.
  const sequence = context.getSequence({ checkpoints: { interval: false } });
  const figures: Record<string, Figure> = {};
  const log = (line: string) => console.error(`[llama.cpp] ${line}`);
  async function figure(
    name: string,
    tokens: number,
    once: () => Promise<number>,
  ) {
    figures[name] = await measure(name, tokens, runs, once, deadline, log);
  }
  for (const n of pps) {
    const ids = Array.from(seededIds(n, vocab, seed));
    await figure(`pp${n}`, n, async () => {
      await sequence.clearHistory();
      const start = performance.now();
      await sequence.evaluateWithoutGeneratingNewTokens(ids);
      const seconds = (performance.now() - start) / 1000;
      holds(sequence, n);
      return seconds;
    });
  }
  // tg as in bench/measure.ts timeDecode: tg one-token steps, each sampling a greedy token
  // (llama.cpp's CPU sampler) that the next step feeds; after whatever the sequence holds.
  async function decodeGreedy(): Promise<{ seconds: number; fed: number[] }> {
    const fed = [seededIds(1, vocab, seed)[0]];
    const start = performance.now();
    for (let step = 0; step < tg; step++) {
      const [out] = await sequence.controlledEvaluate([[fed[step], {
        generateNext: { token: true },
      }]]);
      const token = out?.next.token;
      if (token === undefined || token === null) {
        throw new Error(`llama.cpp returned no token at step ${step}`);
      }
      if (step + 1 < tg) fed.push(token);
    }
    return { seconds: (performance.now() - start) / 1000, fed };
  }
  // From an empty context, as llama-bench's tg.
  let fed: number[] = [];
  await figure(`tg${tg}`, tg, async () => {
    await sequence.clearHistory();
    const run = await decodeGreedy();
    fed = run.fed;
    holds(sequence, tg);
    return run.seconds;
  });
  // The same token stream without sampling: llama_decode alone, no logits copied out.
  await figure(`tg${tg}-nologits`, tg, async () => {
    await sequence.clearHistory();
    const start = performance.now();
    for (const token of fed) {
      await sequence.evaluateWithoutGeneratingNewTokens([token]);
    }
    const seconds = (performance.now() - start) / 1000;
    holds(sequence, tg);
    return seconds;
  });
  // After a prefix of `depth` seeded ids, prefilled once (untimed, in the warm-up) and
  // checkpointed: each run decodes, then erases its tokens, which on this hybrid model restores
  // the checkpoint instead of evaluating the prefix again. Every run must decode what the
  // warm-up decoded, or the state it started from was not the prefix's.
  for (const depth of depths) {
    let first: number[] | undefined;
    await figure(`tg${tg}@${depth}`, tg, async () => {
      if (!first) {
        await sequence.clearHistory();
        await sequence.evaluateWithoutGeneratingNewTokens(
          Array.from(seededIds(depth, vocab, seed)),
        );
        holds(sequence, depth);
        await sequence.takeCheckpoint();
      }
      const run = await decodeGreedy();
      holds(sequence, depth + tg);
      await sequence.eraseContextTokenRanges([{ start: depth, end: depth + tg }]);
      holds(sequence, depth);
      const expected = first ??= run.fed;
      if (run.fed.some((token, step) => token !== expected[step])) {
        throw new Error(
          `tg${tg}@${depth} decoded ${run.fed.join(",")} after ${
            expected.join(",")
          } from the same prefix`,
        );
      }
      return run.seconds;
    });
  }
  const settings: PeerReport["settings"] = {
    contextSize: context.contextSize,
    batchSize: context.batchSize,
    flashAttention: context.flashAttention,
    gpuLayers: String(gpuLayers),
    threads: context.idealThreads,
  };
  await context.dispose();
  const loadWorkload = {
    promptTokens: values["load-prompt"],
    generatedTokens: values["load-tokens"],
    sampling: BENCH_SAMPLING,
  };
  const loadFigures: (LoadFigure | LoadFailure)[] = [];
  for (const clients of values.load ?? []) {
    loadFigures.push(
      await measureLoad(model, clients, {
        ...loadWorkload,
        batch: values.batch,
        threads,
        vocab,
        seed,
        runs,
        deadline,
        log,
      }),
    );
  }
  const report: PeerReport = {
    name: "llama.cpp Vulkan (node-llama-cpp prebuilt, under Deno)",
    nodeLlamaCpp: version,
    llamaCpp: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`,
    gpu: llama.gpu,
    devices: await llama.getGpuDeviceNames(),
    settings,
    loadSeconds,
    figures,
    ...(values.load ? { load: loadFigures, loadWorkload } : {}),
  };
  await model.dispose();
  await llama.dispose();
  console.log(JSON.stringify(report));
}

/**
 * The load of `clients` clients as one context of as many sequences, each with room for its
 * prompt and generated tokens (node-llama-cpp gives every sequence contextSize cells), the
 * figures' batch size, and `sampling` seeded per sequence and step; sequence i's prompt is
 * seededIds with seed + i. A failure, or no time for a timed run, is the entry's error.
 */
async function measureLoad(
  model: Model,
  clients: number,
  o: {
    readonly promptTokens: number;
    readonly generatedTokens: number;
    readonly sampling: SamplingParams;
    readonly batch: number;
    readonly threads: number | undefined;
    readonly vocab: number;
    readonly seed: number;
    readonly runs: number;
    readonly deadline: Deadline;
    readonly log: (line: string) => void;
  },
): Promise<LoadFigure | LoadFailure> {
  const name = `load ×${clients}`;
  let context: Context | undefined;
  try {
    context = await model.createContext({
      contextSize: o.promptTokens + o.generatedTokens + 1,
      batchSize: o.batch,
      sequences: clients,
      flashAttention: "auto",
      threads: o.threads,
    });
    const sequences: Sequence[] = [];
    for (let i = 0; i < clients; i++) {
      sequences.push(context.getSequence({ checkpoints: { interval: false } }));
    }
    const prompts = sequences.map((_, i) =>
      Array.from(seededIds(o.promptTokens, o.vocab, o.seed + i))
    );
    const { temperature, topK, topP } = o.sampling;
    const evaluate: Evaluate = async (i, ids, step) => {
      const last = ids.length - 1;
      const options = { temperature, topK, topP, seed: o.seed + step * clients + i };
      const out = await sequences[i].controlledEvaluate(
        ids.map((id, k): Input => k < last ? id : [id, { generateNext: { token: true, options } }]),
      );
      const token = out[last]?.next.token;
      if (token === undefined || token === null) {
        throw new Error(`llama.cpp returned no token for sequence ${i} at step ${step}`);
      }
      return token;
    };
    const runs: LoadRun[] = [];
    await repeat(o.runs, async () => {
      await Promise.all(sequences.map((s) => s.clearHistory()));
      const run = await runLoad(prompts, o.generatedTokens, evaluate);
      for (const s of sequences) holds(s, o.promptTokens + o.generatedTokens - 1);
      runs.push(run);
      return run.seconds;
    }, o.deadline);
    // repeat's first call is its untimed warm-up.
    const figure = loadFigure(clients, runs.slice(1));
    o.log(
      `${name}: ${figure.aggregateTokPerS.toFixed(1)} tok/s in all, first token p50 ` +
        `${figure.ttftP50Ms.toFixed(0)} ms, gap p99 ${figure.gapP99Ms.toFixed(1)} ms ` +
        `(${runs.length - 1} runs)`,
    );
    return figure;
  } catch (e) {
    const error = e instanceof OutOfTime ? `skipped: ${e.message}` : (e as Error).message;
    o.log(`${name}: ${e instanceof OutOfTime ? error : (e as Error).stack}`);
    return { clients, error };
  } finally {
    await context?.dispose();
  }
}

if (import.meta.main) await runCommand(PEER, main);
