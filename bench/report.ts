// The bench's closing table: one markdown row per engine/provider and per peer, notes below.
// Printed last by bench/decode.ts; the same rows go into docs/PERFORMANCE.md.

import type { Figure } from "./measure.ts";

/** The parts of a bench result the table reads (BenchReport in bench/decode.ts). */
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
    readonly figures?: Readonly<Record<string, Figure>>;
    readonly split?: { readonly layers: string; readonly decode: Figure };
  }[];
  readonly peers: readonly {
    readonly name: string;
    readonly error?: string;
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

/**
 * Builds the table. Cells are tok/s (the split column ms/token); a figure that failed or was
 * skipped shows a note number, and the notes below the table say why.
 */
export function formatTable(
  report: TableInput,
  pp: readonly number[],
  tg: number,
  slots: number,
): string {
  const notes: string[] = [];
  function cell(f: Figure | undefined, value: (f: Figure) => number | undefined, show = rate) {
    if (!f) return "—";
    const v = value(f);
    if (v !== undefined) return show(v);
    notes.push(f.error ?? "no timing");
    return `(${notes.length})`;
  }
  const tps = (f: Figure | undefined) => cell(f, tokensPerSecond);
  const head = [
    "engine",
    ...pp.map((n) => `pp${n} tok/s`),
    `tg${tg} tok/s`,
    ...(slots > 1 ? [`tg${tg} ×${slots} slots tok/s`] : []),
    "split decode ms/tok",
  ];
  const rows: string[][] = [];
  for (const e of report.engines) {
    const name = `tandem ${e.backend ?? "gpu"} ${e.gpu}`;
    if (!e.figures) {
      notes.push(e.error ?? "no result");
      rows.push([name, `(${notes.length})`, ...head.slice(2).map(() => "—")]);
      continue;
    }
    const f = e.figures;
    const fused = f[`tg${tg}-fused`];
    const fusedRate = fused && tokensPerSecond(fused);
    rows.push([
      name,
      ...pp.map((n) => tps(f[`pp${n}`])),
      tps(f[`tg${tg}`]) + (fusedRate ? ` (${rate(fusedRate)} fused)` : ""),
      ...(slots > 1 ? [tps(f[`tg${tg}x${slots}`])] : []),
      e.split
        ? `${cell(e.split.decode, msPerToken, (x) => x.toFixed(2))} (${e.split.layers})`
        : "—",
    ]);
  }
  for (const p of report.peers) {
    if (!p.figures) {
      notes.push(p.error ?? "no result");
      rows.push([p.name, `(${notes.length})`, ...head.slice(2).map(() => "—")]);
      continue;
    }
    const f = p.figures;
    const plain = f[`tg${tg}-nologits`];
    const plainRate = plain && tokensPerSecond(plain);
    rows.push([
      p.name,
      ...pp.map((n) => tps(f[`pp${n}`])),
      tps(f[`tg${tg}`]) + (plainRate ? ` (${rate(plainRate)} without sampling)` : ""),
      ...(slots > 1 ? ["—"] : []),
      "—",
    ]);
  }
  const made = report.model.makeSeconds === undefined
    ? report.model.source
    : `made in ${report.model.makeSeconds.toFixed(0)} s`;
  const lines = [
    `${report.date.slice(0, 10)}, ${report.device}, commit ${report.commit}`,
    `model ${report.model.path} (${(report.model.bytes / 1e9).toFixed(2)} GB, ${made})`,
    "",
    `| ${head.join(" | ")} |`,
    `|${head.map(() => "---").join("|")}|`,
    ...rows.map((r) => `| ${r.join(" | ")} |`),
  ];
  if (notes.length > 0) lines.push("", ...notes.map((n, i) => `(${i + 1}) ${n}`));
  return lines.join("\n");
}
