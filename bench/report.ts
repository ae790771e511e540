// The bench's closing tables: one markdown row per engine/provider and per peer, then the figures
// through the server, notes below. Printed last by bench/decode.ts; the rows go into
// docs/PERFORMANCE.md.

import type { Figure } from "./measure.ts";

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

/** The parts of a bench result the tables read (BenchReport in bench/decode.ts). */
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
  }[];
}

/** Tokens per second of a figure's median run. */
export function tokensPerSecond(f: Figure): number | undefined {
  return f.timing ? f.tokens / f.timing.median : undefined;
}

/** Milliseconds per token of a figure's median run. */
export function msPerToken(f: Figure): number | undefined {
  return f.timing ? (f.timing.median * 1000) / f.tokens : undefined;
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

/**
 * Builds the tables. A cell is the median run's value, then in brackets the values of the best
 * and the worst run and the slowest run's time over the median's; a figure that failed or was
 * skipped shows a note number, and the notes below say why.
 */
export function formatTable(
  report: TableInput,
  pp: readonly number[],
  tg: number,
  slots: number,
): string {
  const notes: string[] = [];
  let worst: { ratio: number; what: string } | undefined;
  function cell(f: Figure | undefined, unit: Unit, what: string): string {
    if (!f) return "—";
    if (!f.timing) {
      notes.push(f.error ?? "no timing");
      return `(${notes.length})`;
    }
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
    ...(slots > 1 ? [`tg${tg} ×${slots} slots tok/s`] : []),
    "split layers",
    `split tg${tg} ms/tok`,
    ...(slots > 1 ? [`split ×${slots} slots tok/s`] : []),
  ];
  const rows: string[][] = [];
  const missing = (name: string, error: string | undefined) => {
    notes.push(error ?? "no result");
    rows.push([name, `(${notes.length})`, ...head.slice(2).map(() => "—")]);
  };
  for (const e of report.engines) {
    const name = `tandem ${e.backend ?? "gpu"} ${e.gpu}`;
    if (!e.figures) {
      missing(name, e.error);
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
      ...(slots > 1 ? [c(`tg${tg}x${slots}`)] : []),
      e.split?.layers ?? "—",
      cell(e.split?.decode, "ms/tok", `${name} split`),
      ...(slots > 1 ? [cell(e.split?.concurrent, "tok/s", `${name} split ×${slots}`)] : []),
    ]);
  }
  for (const p of report.peers) {
    if (!p.figures) {
      missing(p.name, p.error);
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
  const table = (h: string[], r: string[][]) => [
    `| ${h.join(" | ")} |`,
    `|${h.map(() => "---").join("|")}|`,
    ...r.map((row) => `| ${row.join(" | ")} |`),
  ];
  const lines = [
    `${report.date.slice(0, 10)}, ${report.device}, commit ${report.commit}`,
    `model ${report.model.path} (${(report.model.bytes / 1e9).toFixed(2)} GB, ${made})`,
    "",
    ...table(head, rows),
  ];
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
        notes.push(m.error ?? "no routes were timed");
        return [[mode, `(${notes.length})`, "—", "—", "—", "—"]];
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
  lines.push(
    "",
    "Cells: median (best–worst run, slowest run's time / median's)." +
      (worst ? ` Largest slowest/median: ×${worst.ratio.toFixed(2)} (${worst.what}).` : ""),
  );
  if (notes.length > 0) lines.push("", ...notes.map((n, i) => `(${i + 1}) ${n}`));
  return lines.join("\n");
}
