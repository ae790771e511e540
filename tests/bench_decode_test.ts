// `deno task bench` (bench/decode.ts) as a process on a tiny model and the CPU reference: --only runs
// the parts asked for and writes their JSON and plot; --merge makes one report of two part runs.

import assert from "node:assert/strict";
import type { BenchReport } from "../bench/results.ts";
import { testModel } from "./_models.ts";
import { PROJECT_ROOT } from "./_workers.ts";

/** Runs bench/decode.ts with `args`; its stdout (the tables), failing with its stderr. */
async function bench(args: string[]): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "bench/decode.ts", ...args],
    cwd: PROJECT_ROOT,
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  assert.equal(out.code, 0, decoder.decode(out.stderr).slice(-3000));
  return decoder.decode(out.stdout);
}

const read = async (path: string): Promise<BenchReport> =>
  JSON.parse(await Deno.readTextFile(path));

Deno.test("deno task bench: --only parts each write their figures; --merge joins the runs", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tandem-bench-" });
  try {
    const common = ["--model", await testModel({ arch: "qwen35moe" }), "--backend", "reference"];
    const small = ["--server-prompt", "30", "--tg", "4", "--runs", "1", "--no-split"];
    await bench([
      ...common,
      ...small,
      "--only",
      "engine,load,grammar",
      "--grammar-sequences",
      "4",
      "--grammar-steps",
      "20",
      "--pp",
      "16",
      "--slots",
      "1",
      "--concurrency",
      "2",
      "--tg-at",
      "20",
      "--drafts",
      "2",
      "--load-clients",
      "2",
      "--json",
      `${dir}/a.json`,
      "--plot",
      `${dir}/a.svg`,
    ]);
    const a = await read(`${dir}/a.json`);
    assert.deepEqual(a.parts, ["engine", "load", "grammar"]);
    assert.deepEqual(a.servers, []);
    assert.deepEqual(a.peers, []);
    assert.equal(a.longPrompt, undefined);
    const engine = a.engines[0];
    assert.ok("figures" in engine);
    assert.deepEqual(Object.keys(engine.figures).sort(), [
      "pp16",
      "tg4",
      "tg4-sampled",
      "tg4-verify2-kept",
      "tg4-verify2-refused",
      "tg4@20",
      "tg4x2-sampled",
    ]);
    assert.deepEqual(a.load?.map((f) => f.clients), [2]);
    // The tiny model's own vocabulary (auto: it is no generated model of the preset's size).
    assert.ok(a.grammar && "cases" in a.grammar, JSON.stringify(a.grammar));
    assert.deepEqual(a.grammar.vocabulary.source, "model");
    assert.deepEqual(a.grammar.cases.map((c) => [c.name, c.grammars.length]), [
      ["agentic", 1],
      ["mix", 7],
    ]);
    assert.match(
      await Deno.readTextFile(`${dir}/a.svg`),
      /^<!-- deno-fmt-ignore-file -->\n<svg [^]*tandem cpu, engine[^]*<\/svg>\n$/,
    );
    await bench([
      ...common,
      ...small,
      "--only",
      "long",
      "--long-prompt",
      "60",
      "--long-streams",
      "2",
      "--long-window",
      "4",
      "--json",
      `${dir}/b.json`,
    ]);
    const b = await read(`${dir}/b.json`);
    assert.deepEqual(b.parts, ["long"]);
    assert.deepEqual(b.engines, []);
    assert.equal(b.longPrompt?.error, undefined, b.longPrompt?.error);
    const tables = await bench([
      "--merge",
      `${dir}/a.json,${dir}/b.json`,
      "--json",
      `${dir}/m.json`,
      "--plot",
      `${dir}/m.svg`,
    ]);
    const m = await read(`${dir}/m.json`);
    assert.deepEqual(m.parts, ["engine", "load", "grammar", "long"]);
    assert.deepEqual(m.merged, ["a.json", "b.json"]);
    assert.deepEqual(m.engines, a.engines);
    assert.deepEqual(m.load, a.load);
    assert.deepEqual(m.longPrompt, b.longPrompt);
    assert.deepEqual(m.grammar, a.grammar);
    assert.match(
      tables,
      /^\| tandem reference cpu, layers 0:4 \| 2 \| [\d.]+ \| \d+ \| [\d.]+ \|$/m,
    );
    assert.match(tables, /^\| agentic \| tool-call \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|/m);
    assert.match(
      tables,
      /^A 60-token prompt beside 2 streams \(layers 0:4\): its first token \d+ ms/m,
    );
    assert.ok((await Deno.stat(`${dir}/m.svg`)).size > 1000);
    // Copied into docs/bench/, the plot passes `deno task check` as written.
    const fmt = await new Deno.Command(Deno.execPath(), {
      args: ["fmt", "--check", `${dir}/m.svg`],
      stderr: "piped",
    }).output();
    assert.equal(fmt.code, 0, new TextDecoder().decode(fmt.stderr));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
