// `deno task bench`: makes the bench model, runs our engine per GPU provider, the server and the
// llama.cpp peer, and times constrained sequences' token masks on the head's CPU. The project's one
// performance measurement (docs/PERFORMANCE.md): tables, JSON, SVG.
//
// Each engine and the peer run in a child process (bench/stage_bench.ts, bench/peers/llama.ts),
// the server's figures against head processes, one after another, so only one of them holds the
// GPU at a time and a crash costs one row. --only picks parts, so that each fits a device command;
// --merge makes one report of those parts' JSON files.

import { DRAFT_MODE } from "../lib/scheduler/draft.ts";
import { openGguf } from "../engine/gguf/read.ts";
import {
  generateModel,
  modelFileStem,
  type ModelSpec,
  QUANTS,
} from "../tools/synth/generate_model.ts";
import { ARCHS, readHParams } from "../engine/hparams.ts";
import { BACKENDS } from "../engine/open_stage.ts";
import { type PresetName, PRESETS } from "../tools/synth/presets.ts";
import { Deadline, DEFAULT_RUNS } from "./measure.ts";
import type { PeerReport } from "./peers/llama.ts";
import { formatTable } from "./report.ts";
import type { StageReport } from "./stage_bench.ts";
import { benchServer, type ServerReport } from "./server_bench.ts";
import { benchLoad, type LoadBenchResult } from "./load_bench.ts";
import { benchLongPrompt } from "./long_prompt.ts";
import { benchGrammar, benchVocabulary, GRAMMAR_VOCABS } from "./grammar_batch.ts";
import { benchPanels, plotSvg } from "./plot.ts";
import {
  type BenchReport,
  type EngineEntry,
  type GrammarEntry,
  mergeReports,
  type ModelReport,
  type Part,
  PARTS,
  type PeerEntry,
} from "./results.ts";
import {
  type Command,
  decimal,
  flag,
  type FlagTable,
  type FlagValues,
  listOf,
  oneOf,
  runCommand,
  switchFlag,
  text,
  UsageError,
  whole,
} from "../lib/cli.ts";

const BENCH = {
  name: "Bench",
  usage: "deno task bench",
  about: "Makes the bench model, runs our engine per GPU provider, the server (single requests, " +
    "under load, a long prompt beside live streams) and the llama.cpp peer, each in a child " +
    "process, times constrained sequences' token masks on the head's CPU, and prints tables; " +
    "writes the JSON and an SVG plot (docs/PERFORMANCE.md).",
  flags: {
    model: flag(text("PATH"), "bench this file instead of making one"),
    preset: flag(oneOf(Object.keys(PRESETS) as PresetName[]), "the model to make", "qwen35moe-35b"),
    arch: flag(oneOf(ARCHS), "its architecture", "qwen35moe"),
    quant: flag(oneOf(QUANTS), "its weight types", "iq4_xs"),
    "model-dir": flag(
      text("DIR"),
      "where it is made; an existing one is reused",
      "/tmp/tandem-bench",
    ),
    only: flag(
      listOf(oneOf(PARTS)),
      "the parts to run: peer (llama.cpp), engine (per provider), server (single requests), " +
        "load (clients at once), long (a long prompt beside live streams), grammar (token masks " +
        "of constrained sequences decoding at once)",
      [...PARTS],
    ),
    backend: flag(oneOf(BACKENDS), "our engine", "gpu"),
    gpu: flag(listOf(oneOf(["builtin", "dawn"])), "GPU providers, one child each", [
      "dawn",
      "builtin",
    ]),
    server: flag(
      listOf(oneOf(["builtin", "dawn"])),
      "providers also measured through the server (main.ts); load and long run on the first",
      ["dawn"],
    ),
    "no-server": switchFlag("leave out every figure through the server (server, load, long)"),
    "server-prompt": flag(whole(1), "prompt tokens of each request through the server", 512),
    pp: flag(listOf(whole(1)), "prefill lengths", [512, 2048, 8192, 32768]),
    tg: flag(whole(1), "decode steps (and tokens of each reply through the server)", 128),
    slots: flag(whole(1), "slots decoding greedily at once for the aggregate figure (1: none)", 2),
    concurrency: flag(
      listOf(whole(0)),
      "sequences sampled at once, each its own seed, for tgNxS-sampled (0: none)",
      [4, 16, 64],
    ),
    "tg-at": flag(whole(0), "also decode tg steps after a prefix of N positions (0: none)", 32768),
    drafts: flag(
      listOf(whole(0)),
      "drafts a speculative step verifies, for tgN-verifyK-kept and -refused: decode with every " +
        "draft kept or every one refused (0: none)",
      [1, 2, 3],
    ),
    split: flag(whole(1), "also decode through layers 0:K here + K:n in a worker (default n/2)"),
    "no-split": switchFlag("leave out the split"),
    "no-peers": switchFlag("leave out the llama.cpp peer"),
    "load-clients": flag(listOf(whole(1)), "clients at once under load, unsplit", [1, 16, 64]),
    "load-split-clients": flag(
      listOf(whole(0)),
      "clients at once under load through the split (0: none)",
      [16],
    ),
    "load-requests": flag(whole(1), "requests each client sends one after another", 2),
    "load-draft": flag(
      DRAFT_MODE,
      "also under load with the head drafting (--draft) at --load-draft-clients",
      "auto",
    ),
    "load-draft-clients": flag(
      listOf(whole(0)),
      "clients at once under load with the head drafting (0: none)",
      [1],
    ),
    "long-prompt": flag(whole(1), "tokens of the long prompt beside live streams", 32768),
    "long-streams": flag(whole(1), "streams decoding when it arrives", 8),
    "long-window": flag(whole(1), "tokens of each stream timed before it arrives", 64),
    "prefill-chunk": flag(whole(1), "the heads' --prefill-chunk (default theirs)"),
    "prefill-step-ms": flag(decimal(0, 60_000), "the heads' --prefill-step-ms (default theirs)"),
    "grammar-sequences": flag(whole(1), "constrained sequences decoding at once", 16),
    "grammar-steps": flag(whole(1), "steps timed per grammar case (after a cold run as long)", 300),
    "grammar-tokens": flag(whole(2), "tokens of a constrained reply before it starts again", 64),
    "grammar-vocab": flag(
      oneOf(GRAMMAR_VOCABS),
      "the masks' vocabulary: the model's (model), tests/_big_vocab.ts's 248,320 tokens (big), " +
        "or the model's unless it is a generated one of that size, mostly unused fillers (auto)",
      "auto",
    ),
    "grammar-budget": switchFlag(
      "hold constrained replies to a budget of --grammar-tokens, as the server does for " +
        "max_tokens up to 4096 (default: no budget, as for agents' max_tokens 32000)",
    ),
    runs: flag(
      whole(1),
      "timed runs per figure after one warm-up; median, fastest and slowest are kept",
      DEFAULT_RUNS,
    ),
    seed: flag(whole(0), "seed of the prompt ids", 1),
    "deadline-s": flag(whole(1), "stop starting measurements after S seconds (default none)"),
    json: flag(text("PATH"), "results file (default $OUT/bench.json when $OUT is set)"),
    plot: flag(text("PATH"), "the SVG plot (default $OUT/bench.svg when $OUT is set)"),
    merge: flag(
      listOf(text("PATH")),
      "measure nothing: make one report of these part runs' JSON files (--json, --plot, table)",
    ),
    commit: flag(text("SHA"), "recorded commit where git is absent (the GPU box)"),
  },
} satisfies Command<FlagTable>;

function log(line: string): void {
  console.error(`[bench] ${line}`);
}

function parseFlags(values: FlagValues<typeof BENCH.flags>) {
  const backend = values.backend;
  const out = Deno.env.get("OUT");
  const leftOut: Part[] = [
    ...(values["no-peers"] ? ["peer" as const] : []),
    ...(values["no-server"] ? ["server" as const, "load" as const, "long" as const] : []),
  ];
  const parts = new Set(values.only.filter((p) => !leftOut.includes(p)));
  // The reference backend has no providers: its figures are taken once, named "cpu".
  const providers = backend === "gpu" ? values.gpu : ["cpu"];
  const servers = backend === "gpu" ? values.server.filter((p) => values.gpu.includes(p)) : ["cpu"];
  return {
    model: values.model,
    spec: { preset: values.preset, arch: values.arch, quant: values.quant } satisfies ModelSpec,
    modelDir: values["model-dir"],
    parts,
    backend,
    providers: parts.has("engine") ? providers : [],
    servers: parts.has("server") ? servers : [],
    /** The provider the load and the long prompt run on. */
    serving: servers[0] ?? providers[0],
    serverPrompt: values["server-prompt"],
    pp: values.pp,
    tg: values.tg,
    slots: values.slots,
    concurrency: values.concurrency.filter((s) => s > 0),
    drafts: values.drafts.filter((k) => k > 0),
    at: values["tg-at"],
    split: values["no-split"] ? null : values.split,
    loadClients: values["load-clients"],
    loadSplitClients: values["load-split-clients"].filter((c) => c > 0),
    loadDraft: values["load-draft"],
    loadDraftClients: values["load-draft-clients"].filter((c) => c > 0),
    loadRequests: values["load-requests"],
    longPrompt: values["long-prompt"],
    longStreams: values["long-streams"],
    longWindow: values["long-window"],
    prefillChunk: values["prefill-chunk"],
    prefillStepMs: values["prefill-step-ms"],
    grammarSequences: values["grammar-sequences"],
    grammarSteps: values["grammar-steps"],
    grammarTokens: values["grammar-tokens"],
    grammarBudget: values["grammar-budget"],
    grammarVocab: values["grammar-vocab"],
    runs: values.runs,
    seed: values.seed,
    deadlineS: values["deadline-s"] ?? 1e9,
    json: values.json ?? (out ? `${out}/bench.json` : undefined),
    plot: values.plot ?? (out ? `${out}/bench.svg` : undefined),
    merge: values.merge,
    commit: values.commit,
  };
}

type Flags = ReturnType<typeof parseFlags>;

async function size(path: string): Promise<number | undefined> {
  try {
    return (await Deno.stat(path)).size;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw e;
  }
}

/** The given model, or the spec's model in modelDir: reused when present, else made and timed. */
async function benchModel(flags: Flags): Promise<ModelReport> {
  if (flags.model) {
    const bytes = await size(flags.model);
    if (bytes === undefined) throw new UsageError(`Cannot find --model "${flags.model}"`);
    return { path: flags.model, bytes, source: "given" };
  }
  const stem = modelFileStem(flags.spec);
  const path = `${flags.modelDir}/${stem}.gguf`;
  const existing = await size(path);
  if (existing !== undefined) {
    log(`reusing ${path} (${(existing / 1e9).toFixed(2)} GB)`);
    return { path, bytes: existing, spec: flags.spec, source: "reused" };
  }
  await Deno.mkdir(flags.modelDir, { recursive: true });
  // Written under a temporary name and renamed, so a run cut short leaves nothing to reuse.
  const partial = `${flags.modelDir}/.partial-${stem}.gguf`;
  log(`making ${path}`);
  const start = performance.now();
  await generateModel(partial, flags.spec);
  const makeSeconds = (performance.now() - start) / 1000;
  await Deno.rename(partial, path);
  const bytes = (await size(path))!;
  log(`made ${(bytes / 1e9).toFixed(2)} GB in ${makeSeconds.toFixed(1)} s`);
  return { path, bytes, spec: flags.spec, source: "made", makeSeconds };
}

/** Runs a Deno child that prints one JSON object on stdout; its stderr goes to ours. */
async function child<T>(args: string[], what: string): Promise<T | { error: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (out.code !== 0 || !text) {
    return { error: `${what} exited with code ${out.code}; its log is above` };
  }
  try {
    return JSON.parse(text.slice(text.lastIndexOf("\n") + 1)) as T;
  } catch (e) {
    return { error: `${what} printed no JSON result (${(e as Error).message})` };
  }
}

const PEERS = new URL("./peers/", import.meta.url);

/** Unpacks .gpu/peers.tar.xz (bench/peers/pack.sh) where node-llama-cpp is not installed. */
async function ensurePeerModules(): Promise<void> {
  if (await size(new URL("node_modules/node-llama-cpp/package.json", PEERS).pathname)) return;
  const tarball = new URL("../.gpu/peers.tar.xz", import.meta.url).pathname;
  if (!await size(tarball)) return;
  log(`unpacking ${tarball}`);
  const out = await new Deno.Command("tar", { args: ["-xJf", tarball, "-C", PEERS.pathname] })
    .output();
  if (out.code !== 0) {
    throw new Error(
      `Cannot unpack ${tarball}: tar exited with ${out.code}: ${
        new TextDecoder().decode(out.stderr)
      }`,
    );
  }
}

function run(cmd: string, args: string[]): string | undefined {
  try {
    const out = new Deno.Command(cmd, { args, stderr: "null" }).outputSync();
    return out.code === 0 ? new TextDecoder().decode(out.stdout).trim() : undefined;
  } catch {
    return undefined;
  }
}

/** HEAD, marked when the working tree (which is what runs) differs from it. */
function gitCommit(): string {
  const head = run("git", ["rev-parse", "--short=12", "HEAD"]);
  if (!head) return "unknown";
  return run("git", ["status", "--porcelain", "--untracked-files=no"])
    ? `${head}+uncommitted`
    : head;
}

/** Writes the report's JSON and plot where asked, and prints its tables. */
async function writeOut(report: BenchReport, flags: Flags): Promise<void> {
  if (flags.json) {
    await Deno.writeTextFile(flags.json, JSON.stringify(report, null, 2) + "\n");
    log(`wrote ${flags.json}`);
  }
  if (flags.plot) {
    const caption = `${report.date.slice(0, 10)}, ${report.device}, commit ${report.commit}`;
    await Deno.writeTextFile(flags.plot, plotSvg(benchPanels(report), caption));
    log(`wrote ${flags.plot}`);
  }
  console.log(formatTable(report));
}

/** --merge: one report of the part runs' files, measuring nothing. */
async function merge(flags: Flags, files: readonly string[]): Promise<void> {
  const reports = await Promise.all(
    files.map(async (f) => JSON.parse(await Deno.readTextFile(f)) as BenchReport),
  );
  await writeOut(mergeReports(reports, files.map((f) => f.slice(f.lastIndexOf("/") + 1))), flags);
}

async function main(values: FlagValues<typeof BENCH.flags>): Promise<void> {
  const flags = parseFlags(values);
  if (flags.merge) return await merge(flags, flags.merge);
  const deadline = new Deadline(flags.deadlineS);
  const command = `deno task bench ${Deno.args.join(" ")}`.trim();
  const commit = flags.commit ?? gitCommit();
  const model = await benchModel(flags);
  const gguf = await openGguf(model.path);
  const hp = readHParams(gguf.metadata);
  gguf.close();
  const split = flags.split === null ? undefined : flags.split ?? Math.floor(hp.nLayer / 2);
  if (split !== undefined && (split < 1 || split >= hp.nLayer)) {
    throw new UsageError(
      `Cannot split at layer ${split}: the model has ${hp.nLayer} layers; use 1..${hp.nLayer - 1}`,
    );
  }
  const { parts } = flags;
  // First, while nothing else runs: a figure of the head's CPU alone. No deadline cuts it; the
  // parts after it share what it leaves of one.
  const grammar: GrammarEntry | undefined = parts.has("grammar")
    ? await benchVocabulary(model.path, flags.grammarVocab, flags.seed).then((vocab) =>
      benchGrammar({
        ...vocab,
        sequences: flags.grammarSequences,
        steps: flags.grammarSteps,
        replyTokens: flags.grammarTokens,
        budget: flags.grammarBudget,
        seed: flags.seed,
        log,
      })
    ).catch((e: Error) => ({ error: `the grammar part failed: ${e.message}` }))
    : undefined;
  const common = [
    "--pp",
    flags.pp.join(","),
    "--tg",
    String(flags.tg),
    "--runs",
    String(flags.runs),
    "--seed",
    String(flags.seed),
  ];
  // Parts still to run share what is left of the deadline equally; a fast one leaves its unused
  // share to the ones after it.
  let pending = flags.providers.length + flags.servers.length +
    ["peer", "load", "long"].filter((p) => parts.has(p as Part)).length;
  const share = () => Math.max(1, Math.floor(deadline.left / pending--));
  const logLine = (line: string) => console.error(line);
  const peers: PeerEntry[] = [];
  if (parts.has("peer")) {
    const name = "llama.cpp Vulkan";
    await ensurePeerModules();
    const report = await child<PeerReport>([
      "run",
      "-A",
      "--node-modules-dir=manual",
      new URL("llama.ts", PEERS).pathname,
      "--model",
      model.path,
      "--vocab",
      String(hp.V),
      "--deadline-s",
      String(share()),
      ...common,
      // The same decode after a long prefix and the same load as ours (its prompts of random ids
      // as long as ours after the chat template, its sequences in one batch a step).
      ...(flags.at > 0 ? ["--tg-depth", String(flags.at)] : []),
      ...(flags.loadClients.length
        ? [
          "--load",
          flags.loadClients.join(","),
          "--load-prompt",
          String(flags.serverPrompt),
          "--load-tokens",
          String(flags.tg),
        ]
        : []),
    ], "the llama.cpp peer");
    peers.push("error" in report ? { name, error: report.error } : report);
  }
  const engines: EngineEntry[] = [];
  const servers: ServerReport[] = [];
  for (const gpu of new Set([...flags.providers, ...flags.servers])) {
    if (flags.providers.includes(gpu)) {
      const report = await child<StageReport>([
        "run",
        "-A",
        new URL("./stage_bench.ts", import.meta.url).pathname,
        "--model",
        model.path,
        "--backend",
        flags.backend,
        ...(flags.backend === "gpu" ? ["--gpu", gpu] : []),
        "--slots",
        String(flags.slots),
        "--concurrency",
        flags.concurrency.length ? flags.concurrency.join(",") : "0",
        "--at",
        String(flags.at),
        "--drafts",
        flags.drafts.length ? flags.drafts.join(",") : "0",
        "--deadline-s",
        String(share()),
        ...(split === undefined ? [] : ["--split", String(split)]),
        ...common,
      ], `the ${gpu} engine`);
      engines.push(
        "error" in report && !("figures" in report) ? { gpu, error: report.error } : report,
      );
    }
    if (flags.servers.includes(gpu)) {
      servers.push(
        await benchServer({
          model: model.path,
          backend: flags.backend,
          gpu,
          promptTokens: flags.serverPrompt,
          maxTokens: flags.tg,
          split,
          runs: flags.runs,
          deadline: new Deadline(share()),
          log: logLine,
        }),
      );
    }
  }
  const serving = {
    model: model.path,
    backend: flags.backend,
    gpu: flags.serving,
    promptTokens: flags.serverPrompt,
    prefillChunk: flags.prefillChunk,
    prefillStepMs: flags.prefillStepMs,
    seed: flags.seed,
    log: logLine,
  };
  let load: LoadBenchResult | undefined;
  if (parts.has("load")) {
    load = await benchLoad({
      ...serving,
      maxTokens: flags.tg,
      clients: flags.loadClients,
      splitClients: flags.loadSplitClients,
      draft: flags.loadDraft,
      draftClients: flags.loadDraftClients,
      split,
      requests: flags.loadRequests,
      deadline: new Deadline(share()),
    });
  }
  const longPrompt = parts.has("long")
    ? await benchLongPrompt({
      ...serving,
      longTokens: flags.longPrompt,
      streams: flags.longStreams,
      window: flags.longWindow,
      deadline: new Deadline(share()),
    })
    : undefined;
  const smi = run("nvidia-smi", ["--query-gpu=name,driver_version", "--format=csv,noheader"]);
  const firstAdapter = engines.find((e): e is StageReport => "adapter" in e && !!e.adapter)
    ?.adapter;
  await writeOut({
    date: new Date().toISOString(),
    commit,
    command,
    device: smi
      ? `${smi.split("\n")[0]} (nvidia-smi)`
      : firstAdapter ?? (flags.backend === "reference" ? "CPU" : "unknown"),
    model,
    parts: PARTS.filter((p) => parts.has(p)),
    engines,
    servers,
    peers,
    ...load,
    longPrompt,
    grammar,
  }, flags);
}

if (import.meta.main) await runCommand(BENCH, main);
