// The bench's plot (bench/plot.ts): which figures become which points, and an SVG whose elements
// close, whose points sit where their values say, and whose text is escaped.

import assert from "node:assert/strict";
import { timingOf } from "./measure.ts";
import { benchPanels, type Panel, plotSvg } from "./plot.ts";
import type { TableInput } from "./report.ts";

const t = (...seconds: number[]) => timingOf(seconds);

const REPORT: TableInput = {
  date: "2026-12-06T10:00:00.000Z",
  commit: "abc",
  device: "GPU X",
  model: { path: "m.gguf", bytes: 1, source: "given" },
  engines: [{
    gpu: "dawn",
    figures: {
      pp2048: { tokens: 2048, timing: t(0.5) },
      pp512: { tokens: 512, timing: t(0.25) },
      pp8192: { tokens: 8192, error: "device lost" },
      "tg128-sampled": { tokens: 128, timing: t(1) },
      "tg128x4-sampled": { tokens: 512, timing: t(2) },
    },
  }],
  peers: [{
    name: "llama.cpp <Vulkan>",
    figures: { pp512: { tokens: 512, timing: t(0.1) } },
    load: [
      { clients: 16, aggregateTokPerS: 900, ttftP50Ms: 1, gapP99Ms: 1 },
      { clients: 1, aggregateTokPerS: 100, ttftP50Ms: 1, gapP99Ms: 1 },
    ],
  }],
  load: [{ clients: 1, aggregateTokPerS: 120, ttftP50Ms: 1, gapP99Ms: 1 }],
  loadSetup: {
    backend: "gpu",
    gpu: "dawn",
    promptTokens: 510,
    maxTokens: 128,
    temperature: 0.7,
    heads: [{ layers: "0:40" }],
    notes: [],
  },
};

Deno.test("benchPanels: engine and server throughput against sequences, prefill against length, timed figures only", () => {
  const [throughput, prefill] = benchPanels(REPORT);
  const points = (p: Panel) => Object.fromEntries(p.series.map((s) => [s.name, s.points]));
  assert.deepEqual(points(throughput), {
    "tandem dawn, engine": [[1, 128], [4, 256]],
    "tandem dawn, server 0:40": [[1, 120]],
    "llama.cpp <Vulkan>, under load": [[1, 100], [16, 900]],
  });
  assert.deepEqual(throughput.series.map((s) => [s.peer, s.server]), [
    [false, false],
    [false, true],
    [true, true],
  ]);
  // pp8192 failed: no point; the others in order of length.
  assert.deepEqual(points(prefill), {
    "tandem dawn": [[512, 2048], [2048, 4096]],
    "llama.cpp <Vulkan>": [[512, 5120]],
  });
});

/** Every element opened is closed, in order (the SVG is well-formed as far as its tags go). */
function checkTags(svg: string): void {
  const open: string[] = [];
  for (const [, close, name, selfClosing] of svg.matchAll(/<(\/?)([a-z]+)[^>]*?(\/?)>/g)) {
    if (close) assert.equal(open.pop(), name);
    else if (!selfClosing) open.push(name);
  }
  assert.deepEqual(open, []);
}

Deno.test("plotSvg: closed elements, escaped text, points on a log2 x and a linear y from 0", () => {
  const svg = plotSvg(benchPanels(REPORT), "2026-12-06, GPU X & co, commit abc");
  checkTags(svg);
  assert.ok(
    svg.startsWith(
      '<!-- deno-fmt-ignore-file -->\n<svg xmlns="http://www.w3.org/2000/svg" width="1040"',
    ),
  );
  assert.ok(!/NaN|undefined|Infinity/.test(svg), "every coordinate is a number");
  assert.match(svg, />llama\.cpp &lt;Vulkan&gt;, under load</);
  assert.match(svg, />2026-12-06, GPU X &amp; co, commit abc</);
  // The peer's line under load: x 1 and 16 at the ends of the throughput panel's x scale
  // (1..16, log2), y 100 and 900 of a 0..1000 scale 280 px high from y 44.
  const dashed = [...svg.matchAll(/<polyline points="([^"]+)"[^>]*stroke-dasharray/g)]
    .map((m) => m[1].split(" ").map((p) => p.split(",").map(Number)));
  assert.deepEqual(dashed.at(-1), [[70, 296], [500, 72]]);
  assert.equal((svg.match(/<circle /g) ?? []).length, 2 + 1 + 2 + 2 + 1);
});

Deno.test("plotSvg: a panel without figures says so, one with a single x centres it", () => {
  const empty: Panel = { title: "t", x: "x", y: "y", series: [] };
  const single: Panel = {
    title: "one",
    x: "x",
    y: "y",
    series: [{ name: "s", points: [[64, 10]], peer: false, server: false }],
  };
  const svg = plotSvg([empty, single], "c");
  checkTags(svg);
  assert.match(svg, />no figures</);
  // The second panel starts at 520; its plot area spans 70..500, so its centre is 285.
  assert.match(svg, /<g transform="translate\(520 0\)">[^]*<circle cx="285\.0" cy="44\.0"/);
});
