// The bench's plot, SVG written here (no network on the GPU box): decode throughput against
// concurrency and prefill against prompt length, ours beside llama.cpp's. Written by bench/decode.ts.

import { type Figure, type LoadFigure, measuredLoad } from "./measure.ts";
import { reportShape, type TableInput, tokensPerSecond } from "./report.ts";

/** One line of a panel: (x, y) points in x order. */
export interface Series {
  readonly name: string;
  readonly points: readonly (readonly [number, number])[];
  /** A peer's (drawn in the peers' colours). */
  readonly peer: boolean;
  /** Through the server rather than the engine's own calls (drawn dashed). */
  readonly server: boolean;
}

/** One chart: x on a log2 scale, y linear from 0. */
export interface Panel {
  readonly title: string;
  readonly x: string;
  readonly y: string;
  readonly series: readonly Series[];
}

/** (x, tok/s) for each named figure that was timed, in x order. */
function ratePoints(
  figures: Readonly<Record<string, Figure>> | undefined,
  named: readonly (readonly [number, string])[],
): [number, number][] {
  return named.flatMap(([x, key]): [number, number][] => {
    const rate = figures?.[key] && tokensPerSecond(figures[key]);
    return rate === undefined ? [] : [[x, rate]];
  }).sort((a, b) => a[0] - b[0]);
}

function loadPoints(figures: readonly LoadFigure[] | undefined): [number, number][] {
  return (figures ?? []).map((f): [number, number] => [f.clients, f.aggregateTokPerS])
    .sort((a, b) => a[0] - b[0]);
}

/**
 * The two panels of a report: aggregate decode tok/s against sequences at once (each engine's tg
 * sampled on 1 and on each count of sequences, and through the server under load, ours and each
 * peer's), and prefill tok/s against prompt tokens (ppN of each engine and peer).
 */
export function benchPanels(report: TableInput): [Panel, Panel] {
  const { pp, tg, concurrency } = reportShape(report);
  const engines = [
    ...report.engines.map((e) => ({ name: `tandem ${e.gpu}`, figures: e.figures, peer: false })),
    ...report.peers.map((p) => ({ name: p.name, figures: p.figures, peer: true })),
  ];
  const sequences: [number, string][] = [
    [1, `tg${tg}-sampled`],
    ...concurrency.map((s): [number, string] => [s, `tg${tg}x${s}-sampled`]),
  ];
  const setup = report.loadSetup;
  const server = (name: string, figures: readonly LoadFigure[] | undefined, peer: boolean) => ({
    name,
    points: loadPoints(figures),
    peer,
    server: true,
  });
  const throughput: Series[] = [
    ...engines.map((e) => ({
      name: `${e.name}, engine`,
      points: ratePoints(e.figures, sequences),
      peer: e.peer,
      server: false,
    })),
    server(`tandem ${setup?.gpu}, server ${setup?.heads[0]?.layers}`, report.load, false),
    server(`tandem ${setup?.gpu}, server ${setup?.heads[1]?.layers}`, report.loadSplit, false),
    ...report.peers.map((p) => server(`${p.name}, under load`, measuredLoad(p.load), true)),
  ];
  const prefill: Series[] = engines.map((e) => ({
    name: e.name,
    points: ratePoints(e.figures, pp.map((n) => [n, `pp${n}`])),
    peer: e.peer,
    server: false,
  }));
  const kept = (series: Series[]) => series.filter((s) => s.points.length > 0);
  return [
    {
      title: `Decode throughput, tg${tg} at temperature 0.7`,
      x: "sequences at once",
      y: "aggregate output tok/s",
      series: kept(throughput),
    },
    {
      title: "Prefill against prompt length",
      x: "prompt tokens",
      y: "prompt tok/s",
      series: kept(prefill),
    },
  ];
}

const OURS = ["#1f5fa8", "#2a9d4b", "#6a3fb0", "#138d90"];
const PEERS = ["#d2452b", "#e08a00", "#8c564b"];

const WIDTH = 520;
const PLOT = { left: 70, right: 20, top: 44, height: 280 };
const LEGEND_LINE = 18;

function escape(text: string): string {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;");
}

/** The smallest 1, 2 or 5 × 10^k at least x. */
function niceStep(x: number): number {
  const power = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= x)!;
}

/** A number as a tick label: whole above 10, else one decimal. */
function label(x: number): string {
  return x >= 10 || Number.isInteger(x) ? String(Math.round(x)) : x.toFixed(1);
}

/** One panel's SVG elements, its top-left corner at (0, 0); and its height. */
function panelSvg(panel: Panel): { body: string[]; height: number } {
  const w = WIDTH - PLOT.left - PLOT.right;
  const h = PLOT.height;
  const xs = [...new Set(panel.series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) =>
    a - b
  );
  const top = Math.max(0, ...panel.series.flatMap((s) => s.points.map((p) => p[1])));
  const step = niceStep(Math.max(top, 1e-9) / 5);
  const yMax = Math.max(step, Math.ceil(top / step) * step);
  // A single x is centred: the scale spans a factor of 2 either side.
  const lo = Math.log2(xs[0] ?? 1) - (xs.length > 1 ? 0 : 1);
  const hi = Math.log2(xs.at(-1) ?? 1) + (xs.length > 1 ? 0 : 1);
  const px = (x: number) => PLOT.left + ((Math.log2(x) - lo) / (hi - lo)) * w;
  const py = (y: number) => PLOT.top + h - (y / yMax) * h;
  const f = (v: number) => v.toFixed(1);
  const body: string[] = [
    `<text x="${WIDTH / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">${
      escape(panel.title)
    }</text>`,
  ];
  for (let y = 0; y <= yMax + step / 2; y += step) {
    body.push(
      `<line x1="${PLOT.left}" y1="${f(py(y))}" x2="${PLOT.left + w}" y2="${
        f(py(y))
      }" stroke="#ddd"/>`,
      `<text x="${PLOT.left - 6}" y="${f(py(y) + 4)}" text-anchor="end">${label(y)}</text>`,
    );
  }
  for (const x of xs) {
    body.push(
      `<line x1="${f(px(x))}" y1="${PLOT.top + h}" x2="${f(px(x))}" y2="${
        PLOT.top + h + 5
      }" stroke="#333"/>`,
      `<text x="${f(px(x))}" y="${PLOT.top + h + 18}" text-anchor="middle">${label(x)}</text>`,
    );
  }
  body.push(
    `<rect x="${PLOT.left}" y="${PLOT.top}" width="${w}" height="${h}" fill="none" stroke="#333"/>`,
    `<text x="${PLOT.left + w / 2}" y="${PLOT.top + h + 38}" text-anchor="middle">${
      escape(panel.x)
    }</text>`,
    `<text transform="translate(16 ${PLOT.top + h / 2}) rotate(-90)" text-anchor="middle">${
      escape(panel.y)
    }</text>`,
  );
  let ours = 0;
  let peers = 0;
  panel.series.forEach((s, i) => {
    const colour = s.peer ? PEERS[peers++ % PEERS.length] : OURS[ours++ % OURS.length];
    const dash = s.server ? ` stroke-dasharray="6 4"` : "";
    const points = s.points.map(([x, y]) => `${f(px(x))},${f(py(y))}`).join(" ");
    body.push(
      `<polyline points="${points}" fill="none" stroke="${colour}" stroke-width="2"${dash}/>`,
      ...s.points.map(([x, y]) =>
        `<circle cx="${f(px(x))}" cy="${f(py(y))}" r="3.5" fill="${colour}"/>`
      ),
    );
    const ly = PLOT.top + h + 62 + i * LEGEND_LINE;
    body.push(
      `<line x1="${PLOT.left}" y1="${ly - 4}" x2="${PLOT.left + 28}" y2="${
        ly - 4
      }" stroke="${colour}" stroke-width="2"${dash}/>`,
      `<text x="${PLOT.left + 36}" y="${ly}">${escape(s.name)}</text>`,
    );
  });
  if (panel.series.length === 0) {
    body.push(
      `<text x="${PLOT.left + w / 2}" y="${
        PLOT.top + h / 2
      }" text-anchor="middle">no figures</text>`,
    );
  }
  return { body, height: PLOT.top + h + 62 + panel.series.length * LEGEND_LINE };
}

/** The panels side by side as one SVG document; `caption` (date, device, commit) under them. */
export function plotSvg(panels: readonly Panel[], caption: string): string {
  const drawn = panels.map(panelSvg);
  const height = Math.max(...drawn.map((d) => d.height)) + 24;
  const width = WIDTH * panels.length;
  return [
    // Kept as written: deno fmt would rewrap it (docs/bench/ is checked by `deno task check`).
    "<!-- deno-fmt-ignore-file -->",
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
    ...drawn.flatMap((d, i) => [
      `<g transform="translate(${i * WIDTH} 0)">`,
      ...d.body,
      "</g>",
    ]),
    `<text x="${width / 2}" y="${height - 8}" text-anchor="middle" fill="#555">${
      escape(caption)
    }</text>`,
    "</svg>",
    "",
  ].join("\n");
}
