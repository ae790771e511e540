// The bench's closing tables (engines, peers, many sequences, the server, load, the long prompt,
// grammar masks) and their notes. Printed last by bench/decode.ts; the rows go into
// docs/PERFORMANCE.md.

import type { GrammarReport } from "./grammar_batch.ts";
import { type Figure, type LoadFailure, type LoadFigure, measuredLoad } from "./measure.ts";

/** What a table row of figures through the server reads (ServerReport in bench/server_bench.ts). */
export interface ServerTableInput {
  readonly gpu: string;
  readonly backend: string;
  readonly promptTokens: number;
  readonly maxTokens: number;
  readonly modes: readonly {
    readonly layers: string;
    readonly startSeconds?: number;
    readonly routes?: readonly {
      readonly route: string;
      readonly greedy: { readonly ttft: Figure; readonly decode: Figure };
      readonly sampled: { readonly ttft: Figure; readonly decode: Figure };
    }[];
    readonly error?: string;
  }[];
}

/** The parts of a bench result the tables and the plot read (BenchReport in bench/results.ts). */
export interface TableInput {
  readonly date: string;
  readonly commit: string;
  readonly device: string;
  readonly model: {
    readonly path: string;
    readonly bytes: number;
    readonly source: string;
    readonly makeSeconds?: number;
  };
  readonly engines: readonly {
    readonly backend?: string;
    readonly gpu: string;
    readonly error?: string;
    readonly openSeconds?: number;
    readonly figures?: Readonly<Record<string, Figure>>;
    readonly split?: {
      readonly layers: string;
      readonly decode: Figure;
      readonly concurrent?: Figure;
    };
  }[];
  readonly servers?: readonly ServerTableInput[];
  readonly peers: readonly {
    readonly name: string;
    readonly error?: string;
    readonly loadSeconds?: number;
    readonly figures?: Readonly<Record<string, Figure>>;
    readonly load?: readonly (LoadFigure | LoadFailure)[];
  }[];
  readonly load?: readonly LoadFigure[];
  readonly loadSplit?: readonly LoadFigure[];
  readonly loadDraft?: readonly LoadFigure[];
  readonly loadSetup?: {
    readonly backend: string;
    readonly gpu: string;
    readonly promptTokens: number;
    readonly maxTokens: number;
    readonly temperature: number;
    readonly heads: readonly { readonly layers: string; readonly draft?: string | number }[];
    readonly notes: readonly string[];
  };
  readonly longPrompt?: {
    readonly layers: string;
    readonly streams: number;
    readonly longTokens: number;
    readonly ttftAloneMs?: number;
    readonly ttftBesideMs?: number;
    readonly gapP99WithoutMs?: number;
    readonly gapP99WithMs?: number;
    readonly error?: string;
  };
  readonly grammar?: GrammarReport | { readonly error: string };
}

/** Tokens per second of a figure's median run. */
export function tokensPerSecond(f: Figure): number | undefined {
  return f.timing ? f.tokens / f.timing.median : undefined;
}

/**
 * Which figures a report has, read from their names (bench/stage_bench.ts): prompt lengths
 * (ppN), decode steps (tgN), greedy slots (tgNxS), sampled sequences (tgNxS-sampled) and the
 * prefix of the decode after one (tgN@P); of every engine and peer, sorted.
 */
export interface ReportShape {
  readonly pp: readonly number[];
  readonly tg: number;
  /** Greedy slots at once (1: none). */
  readonly slots: number;
  readonly concurrency: readonly number[];
  /** 0: none. */
  readonly at: number;
}

export function reportShape(report: TableInput): ReportShape {
  const names = [...report.engines, ...report.peers].flatMap((e) => Object.keys(e.figures ?? {}));
  const numbers = (pattern: RegExp) =>
    [...new Set(names.flatMap((n) => pattern.exec(n)?.slice(1).map(Number) ?? []))]
      .sort((a, b) => a - b);
  return {
    pp: numbers(/^pp(\d+)$/),
    tg: numbers(/^tg(\d+)$/)[0] ?? numbers(/^tg(\d+)/)[0] ?? 0,
    slots: numbers(/^tg\d+x(\d+)$/)[0] ?? 1,
    concurrency: numbers(/^tg\d+x(\d+)-sampled$/),
    at: numbers(/^tg\d+@(\d+)$/)[0] ?? 0,
  };
}

function rate(x: number): string {
  return x >= 100 ? x.toFixed(0) : x.toFixed(1);
}

/** A figure's value per run: tok/s, ms per token, or ms per run. */
type Unit = "tok/s" | "ms/tok" | "ms";

function valueOf(f: Figure, seconds: number, unit: Unit): number {
  if (unit === "tok/s") return f.tokens / seconds;
  if (unit === "ms/tok") return (seconds * 1000) / f.tokens;
  return seconds * 1000;
}

/** Rows of a markdown table. */
function table(head: readonly string[], rows: readonly (readonly string[])[]): string[] {
  return [
    `| ${head.join(" | ")} |`,
    `|${head.map(() => "---").join("|")}|`,
    ...rows.map((row) => `| ${row.join(" | ")} |`),
  ];
}

/** "×r" of a over b, or nothing when either is missing. */
function times(a: number | undefined, b: number | undefined): string {
  return a !== undefined && b !== undefined && b > 0 ? `; ×${(a / b).toFixed(2)}` : "";
}

/**
 * Builds the tables, reading which figures there are from the report (reportShape). A cell is the
 * median run's value, then in brackets the values of the best and the worst run and the slowest
 * run's time over the median's; a figure that failed or was skipped shows a note number, and the
 * notes below say why.
 */
export function formatTable(report: TableInput): string {
  const { pp, tg, slots, concurrency, at } = reportShape(report);
  const notes: string[] = [];
  // One number for each distinct reason, however many cells give it.
  const note = (why: string) => {
    if (!notes.includes(why)) notes.push(why);
    return `(${notes.indexOf(why) + 1})`;
  };
  let worst: { ratio: number; what: string } | undefined;
  function cell(f: Figure | undefined, unit: Unit, what: string): string {
    if (!f) return "—";
    if (!f.timing) return note(f.error ?? "no timing");
    const t = f.timing;
    const show = unit === "tok/s" ? rate : (x: number) => x.toFixed(unit === "ms" ? 0 : 1);
    const ratio = t.max / t.median;
    if (!worst || ratio > worst.ratio) worst = { ratio, what };
    const range = `${show(valueOf(f, t.min, unit))}–${show(valueOf(f, t.max, unit))}`;
    return `${show(valueOf(f, t.median, unit))} (${range}, ×${ratio.toFixed(2)})`;
  }
  const load = (s: number | undefined) => s === undefined ? "—" : s.toFixed(1);
  const head = [
    "engine",
    "load s",
    ...pp.map((n) => `pp${n} tok/s`),
    `tg${tg} tok/s`,
    `tg${tg} fused tok/s`,
    `tg${tg} sampled tok/s`,
    `tg${tg} sampled, a step tok/s`,
    ...(slots > 1 ? [`tg${tg} ×${slots} slots tok/s`] : []),
    "split layers",
    `split tg${tg} ms/tok`,
    ...(slots > 1 ? [`split ×${slots} slots tok/s`] : []),
  ];
  const rows: string[][] = [];
  const rowName = (e: TableInput["engines"][number]) => `tandem ${e.backend ?? "gpu"} ${e.gpu}`;
  for (const e of report.engines) {
    const name = rowName(e);
    if (!e.figures) {
      rows.push([name, note(e.error ?? "no result"), ...head.slice(2).map(() => "—")]);
      continue;
    }
    const f = e.figures;
    const c = (key: string, unit: Unit = "tok/s") => cell(f[key], unit, `${name} ${key}`);
    rows.push([
      name,
      load(e.openSeconds),
      ...pp.map((n) => c(`pp${n}`)),
      c(`tg${tg}`),
      c(`tg${tg}-fused`),
      c(`tg${tg}-sampled`),
      c(`tg${tg}-sampled-step`),
      ...(slots > 1 ? [c(`tg${tg}x${slots}`)] : []),
      e.split?.layers ?? "—",
      cell(e.split?.decode, "ms/tok", `${name} split`),
      ...(slots > 1 ? [cell(e.split?.concurrent, "tok/s", `${name} split ×${slots}`)] : []),
    ]);
  }
  for (const p of report.peers) {
    if (!p.figures) {
      rows.push([p.name, note(p.error ?? "no result"), ...head.slice(2).map(() => "—")]);
      continue;
    }
    const f = p.figures;
    const plain = f[`tg${tg}-nologits`];
    const plainRate = plain && tokensPerSecond(plain);
    rows.push([
      p.name,
      load(p.loadSeconds),
      ...pp.map((n) => cell(f[`pp${n}`], "tok/s", `${p.name} pp${n}`)),
      cell(f[`tg${tg}`], "tok/s", `${p.name} tg${tg}`) +
      (plainRate ? `; ${rate(plainRate)} without sampling` : ""),
      ...head.slice(pp.length + 3).map(() => "—"),
    ]);
  }
  const made = report.model.makeSeconds === undefined
    ? report.model.source
    : `made in ${report.model.makeSeconds.toFixed(0)} s`;
  const lines = [
    `${report.date.slice(0, 10)}, ${report.device}, commit ${report.commit}`,
    `model ${report.model.path} (${(report.model.bytes / 1e9).toFixed(2)} GB, ${made})`,
    // A run of other parts alone (--only grammar) has no engine or peer to show.
    ...(rows.length ? ["", ...table(head, rows)] : []),
  ];
  // Many sequences at once and decode after a long prefix, each against its one-sequence figure.
  if (concurrency.length > 0 || at > 0) {
    const h = [
      "engine",
      `tg${tg} sampled tok/s`,
      ...concurrency.map((s) => `tg${tg} ×${s} sampled tok/s; × of one`),
      ...(at > 0 ? [`tg${tg} after ${at} tok/s; × of tg${tg}`] : []),
    ];
    const r = [...report.engines.map((e) => ({ ...e, name: rowName(e) })), ...report.peers]
      .filter((e) =>
        e.figures &&
        (concurrency.some((s) => e.figures![`tg${tg}x${s}-sampled`]) || e.figures[`tg${tg}@${at}`])
      )
      .map(({ name, figures }) => {
        const f = figures!;
        const one = f[`tg${tg}-sampled`] && tokensPerSecond(f[`tg${tg}-sampled`]);
        const rateOf = (key: string) => f[key] && tokensPerSecond(f[key]);
        return [
          name,
          cell(f[`tg${tg}-sampled`], "tok/s", `${name} tg${tg} sampled`),
          ...concurrency.map((s) => {
            const key = `tg${tg}x${s}-sampled`;
            return cell(f[key], "tok/s", `${name} ${key}`) + times(rateOf(key), one);
          }),
          ...(at > 0
            ? [
              cell(f[`tg${tg}@${at}`], "tok/s", `${name} tg${tg}@${at}`) +
              times(rateOf(`tg${tg}@${at}`), rateOf(`tg${tg}`)),
            ]
            : []),
        ];
      });
    if (r.length) lines.push("", ...table(h, r));
  }
  for (const s of report.servers ?? []) {
    const h = [
      `through the server, ${s.promptTokens}-token prompt, ${s.maxTokens} out`,
      "start s",
      "first token ms, greedy",
      "tok/s after it, greedy",
      "first token ms, temperature 0.7",
      "tok/s after it, temperature 0.7",
    ];
    const r = s.modes.flatMap((m) => {
      const mode = `tandem ${s.backend} ${s.gpu}, layers ${m.layers}`;
      if (m.error || !m.routes) {
        return [[mode, note(m.error ?? "no routes were timed"), "—", "—", "—", "—"]];
      }
      return m.routes.map(({ route, greedy, sampled }) => {
        const name = `${mode}, ${route}`;
        return [
          name,
          load(m.startSeconds),
          cell(greedy.ttft, "ms", `${name} first token`),
          cell(greedy.decode, "tok/s", `${name} greedy`),
          cell(sampled.ttft, "ms", `${name} first token, sampled`),
          cell(sampled.decode, "tok/s", `${name} sampled`),
        ];
      });
    });
    lines.push("", ...table(h, r));
  }
  lines.push(...loadLines(report, note));
  lines.push(...grammarLines(report, note));
  lines.push(
    "",
    "Cells: median (best–worst run, slowest run's time / median's)." +
      (worst ? ` Largest slowest/median: ×${worst.ratio.toFixed(2)} (${worst.what}).` : ""),
  );
  if (notes.length > 0) lines.push("", ...notes.map((n, i) => `(${i + 1}) ${n}`));
  return lines.join("\n");
}

/** The table under load (ours unsplit and split, each peer's) and the long prompt's line. */
function loadLines(report: TableInput, note: (why: string) => string): string[] {
  const lines: string[] = [];
  const setup = report.loadSetup;
  const ours = (figures: readonly LoadFigure[] | undefined, i: number) =>
    setup && figures
      ? figures.map((f) => ({
        f,
        name: `tandem ${setup.backend} ${setup.gpu}, layers ${setup.heads[i].layers}`,
      }))
      : [];
  const all = [
    ...ours(report.load, 0),
    ...ours(report.loadSplit, 1),
    ...ours(report.loadDraft, setup?.heads.findIndex((h) => h.draft !== undefined) ?? -1),
    ...report.peers.flatMap((p) => measuredLoad(p.load).map((f) => ({ f, name: p.name }))),
  ];
  const missing = [
    ...(setup?.notes ?? []).map(note),
    ...report.peers.flatMap((p) =>
      (p.load ?? []).flatMap((f) => "error" in f ? [`${p.name} ×${f.clients}: ${f.error}`] : [])
    ),
  ];
  if (all.length) {
    const what = setup
      ? `${setup.promptTokens}-token prompt, ${setup.maxTokens} out, temperature ${setup.temperature}`
      : "";
    lines.push(
      "",
      ...table(
        [
          `under load${what ? `, ${what}` : ""}`,
          "clients",
          "aggregate tok/s",
          "first token p50 ms",
          "gap p99 ms",
        ],
        all.map(({ f, name }) => [
          name,
          String(f.clients),
          rate(f.aggregateTokPerS),
          f.ttftP50Ms.toFixed(0),
          f.gapP99Ms.toFixed(1),
        ]),
      ),
    );
  }
  if (missing.length) lines.push("", `Not measured under load: ${missing.join(", ")}.`);
  const long = report.longPrompt;
  if (long) {
    const ms = (x: number | undefined, digits = 0) =>
      x === undefined ? "—" : `${x.toFixed(digits)} ms`;
    const ratio = (a?: number, b?: number) =>
      a !== undefined && b !== undefined ? ` (×${(a / b).toFixed(2)})` : "";
    lines.push(
      "",
      `A ${long.longTokens}-token prompt beside ${long.streams} streams (layers ${long.layers}): ` +
        `its first token ${ms(long.ttftBesideMs)} against ${ms(long.ttftAloneMs)} alone` +
        `${ratio(long.ttftBesideMs, long.ttftAloneMs)}; the streams' p99 gap ` +
        `${ms(long.gapP99WithMs, 1)} with it, ${ms(long.gapP99WithoutMs, 1)} without` +
        `${ratio(long.gapP99WithMs, long.gapP99WithoutMs)}.` +
        (long.error ? ` ${note(long.error)}` : ""),
    );
  }
  return lines;
}

/** The grammar part's table: per case, ms of head CPU a step for all the sequences' masks. */
function grammarLines(report: TableInput, note: (why: string) => string): string[] {
  const g = report.grammar;
  if (!g) return [];
  if ("error" in g) return ["", `Grammar masks: not measured ${note(g.error)}.`];
  const ms = (x: number) => x < 10 ? x.toFixed(2) : x.toFixed(1);
  const budget = g.budget ? `a budget of ${g.replyTokens} tokens` : "no budget";
  return [
    "",
    ...table(
      [
        `masks of ${g.sequences} constrained sequences at once, ms a step (${budget}, ` +
        `${g.replyTokens}-token replies)`,
        "grammars",
        "p50",
        "p90",
        "p99",
        "max",
        "process CPU p99",
        "process CPU max",
        "cold p99",
        "cold max",
      ],
      g.cases.map((c) => [
        c.name,
        c.grammars.join(", "),
        ...[c.stepMsP50, c.stepMsP90, c.stepMsP99, c.stepMsMax].map(ms),
        ms(c.processCpu.stepMsP99),
        ms(c.processCpu.stepMsMax),
        ms(c.cold.stepMsP99),
        ms(c.cold.stepMsMax),
      ]),
    ),
    `lib/grammar on ${g.cpu}, a ${g.vocabulary.tokens}-token vocabulary ` +
    `(${g.vocabulary.source}; index built in ${(g.indexMs / 1000).toFixed(1)} s); load average ` +
    `${g.loadAverage.map((l) => l.toFixed(1)).join(" → ")}. Wall time from asking the masks to ` +
    "having them all; process CPU: every thread's in the same steps (far below the wall: the " +
    "thread was preempted). Cold: the same workload's first run, before any of its masks was cached.",
  ];
}
