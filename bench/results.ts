// The bench's result file (BenchReport): what one run of `deno task bench` writes, and one report
// made of several part runs (--only), which a device command each may need (--merge).

import type { GrammarReport } from "./grammar_batch.ts";
import type { LoadFigure } from "./measure.ts";
import type { LoadSetup } from "./load_bench.ts";
import type { LongPromptReport } from "./long_prompt.ts";
import type { PeerReport } from "./peers/llama.ts";
import type { ServerReport } from "./server_bench.ts";
import type { StageReport } from "./stage_bench.ts";
import type { ModelSpec } from "../tools/synth/generate_model.ts";

/**
 * The parts of a bench run, each selectable with --only so that a run fits one device command:
 * the llama.cpp peer, our engine per provider, single requests through the server, the server
 * under load, a long prompt beside live streams, and the token masks of constrained sequences.
 */
export const PARTS = ["peer", "engine", "server", "load", "long", "grammar"] as const;
export type Part = typeof PARTS[number];

/** How the bench model came to be: made now (timed), reused from an earlier run, or given. */
export interface ModelReport {
  readonly path: string;
  readonly bytes: number;
  readonly spec?: ModelSpec;
  readonly source: "made" | "reused" | "given";
  readonly makeSeconds?: number;
}

/** A peer's report as the bench keeps it: its figures (and `load` where it measures it), or why not. */
export type PeerEntry = PeerReport | { readonly name: string; readonly error: string };

export type EngineEntry = StageReport | { readonly gpu: string; readonly error: string };

/** The grammar part's report, or why it has none. */
export type GrammarEntry = GrammarReport | { readonly error: string };

/** The whole result file; docs/PERFORMANCE.md is written from it. */
export interface BenchReport {
  readonly date: string;
  readonly commit: string;
  readonly command: string;
  /** nvidia-smi's name and driver where it exists; else the first adapter's description. */
  readonly device: string;
  readonly model: ModelReport;
  /** The parts measured (--only); a merged report's are all its runs'. */
  readonly parts?: readonly Part[];
  /** The part reports a merged report was made of (--merge). */
  readonly merged?: readonly string[];
  readonly engines: readonly EngineEntry[];
  /** Single requests through the server, per provider in --server. */
  readonly servers: readonly ServerReport[];
  readonly peers: readonly PeerEntry[];
  /** Through the server under load, unsplit: a figure per count of clients (issue 23's `load`). */
  readonly load?: readonly LoadFigure[];
  /** The same through the split. */
  readonly loadSplit?: readonly LoadFigure[];
  /** The same through the whole model with the head drafting (loadSetup says how). */
  readonly loadDraft?: readonly LoadFigure[];
  readonly loadSetup?: LoadSetup;
  readonly longPrompt?: LongPromptReport;
  /** Constrained sequences' token masks per step, on the head's CPU (issue 26 point 4). */
  readonly grammar?: GrammarEntry;
}

/** Distinct values in first-seen order. */
function distinct(values: readonly string[]): string[] {
  return [...new Set(values)];
}

/**
 * Entries of the same key (an engine's provider, a peer's name) made one: later fields over
 * earlier ones, figures joined by name (a later run's figure of a name over an earlier one's).
 */
function joinBy<T extends object>(
  lists: readonly (readonly T[])[],
  key: (entry: T) => string,
): T[] {
  const figures = (e: T) => "figures" in e ? e.figures as Readonly<Record<string, unknown>> : {};
  const joined = new Map<string, T>();
  for (const entry of lists.flat()) {
    const had = joined.get(key(entry));
    // An entry with figures stays one when joined with an error-only one (its error kept too).
    const both = had && { ...had, ...entry, figures: { ...figures(had), ...figures(entry) } } as T;
    joined.set(key(entry), both ?? entry);
  }
  return [...joined.values()];
}

/**
 * One report of several runs' (parts measured in separate device commands, on one model): each
 * engine and peer with every run's figures, and each of the other sections from the last run that
 * has it. `names` (the files) are kept under `merged`.
 */
export function mergeReports(
  reports: readonly BenchReport[],
  names: readonly string[],
): BenchReport {
  if (reports.length === 0) throw new RangeError("Cannot merge no bench reports");
  const last = <K extends keyof BenchReport>(k: K): BenchReport[K] | undefined =>
    reports.findLast((r) => r[k] !== undefined)?.[k];
  const servers = new Map(reports.flatMap((r) => r.servers).map((s) => [s.gpu, s]));
  return {
    date: reports.map((r) => r.date).sort().at(-1)!,
    commit: distinct(reports.map((r) => r.commit)).join(", "),
    command: reports.map((r) => r.command).join(" ; "),
    device: distinct(reports.map((r) => r.device)).join(" / "),
    model: reports[0].model,
    parts: distinct(reports.flatMap((r) => r.parts ?? [])) as Part[],
    merged: names,
    engines: joinBy<EngineEntry>(reports.map((r) => r.engines), (e) => e.gpu),
    servers: [...servers.values()],
    peers: joinBy<PeerEntry>(reports.map((r) => r.peers), (p) => p.name),
    load: last("load"),
    loadSplit: last("loadSplit"),
    loadDraft: last("loadDraft"),
    loadSetup: last("loadSetup"),
    longPrompt: last("longPrompt"),
    grammar: last("grammar"),
  };
}
