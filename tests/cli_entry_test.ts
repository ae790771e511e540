// The entry points as processes: --help on every task exits 0 and lists its flags, every task reads
// TANDEM_*, and the head and the worker bind their address before the model loads, naming a busy
// port in the error, and stop on a corrupt model naming its file, key and value.

import assert from "node:assert/strict";
import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";
import { testModel } from "./_models.ts";
import { withTempDir } from "../engine/gguf/_gguf_bytes.ts";
import { writeGguf } from "../tools/gguf/gguf_write.ts";
import { planModel } from "../tools/synth/generate_model.ts";
import { PROJECT_ROOT } from "./_workers.ts";

/**
 * The roles, as their tasks' launcher runs them, and the scripts run by hand: the benches
 * docs/PERFORMANCE.md runs, the GGUF dump and the fixtures' recorder.
 */
const ENTRIES = [
  "main.ts",
  "worker.ts",
  "bench/profile.ts",
  "bench/stage_bench.ts",
  "bench/compile_times.ts",
  "bench/host_cost.ts",
  "tools/gguf/gguf_dump.ts",
  "tools/fixtures/record.ts",
];

/** Every task of deno.json that runs one of ours (not deno's own test, fmt or lint). */
const TASKS: [string, string][] = Object.entries(
  JSON.parse(await Deno.readTextFile(`${PROJECT_ROOT}/deno.json`)).tasks as Record<string, string>,
).filter(([, command]) => command.startsWith("deno run "));

/** What `deno ARGS` prints and exits with, run in the project's root. */
async function deno(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: PROJECT_ROOT,
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** Runs an entry point; the head and the worker with the grant their tasks give them. */
function run(args: string[], env: Record<string, string> = {}) {
  const role = args[0] === "main.ts" || args[0] === "worker.ts";
  return deno(["run", ...(role ? LAUNCHER_FLAGS : ["-A"]), ...args], env);
}

/** Runs a task as a user starts it: deno task NAME ARGS. */
function task(name: string, args: string[], env: Record<string, string> = {}) {
  return deno(["task", "-q", name, ...args], env);
}

Deno.test("--help on every entry point prints its flags with defaults and exits 0", async () => {
  const helps = await Promise.all(ENTRIES.map((entry) => run([entry, "--help"])));
  for (const [i, help] of helps.entries()) {
    assert.equal(help.code, 0, `${ENTRIES[i]} --help: ${help.stderr}`);
    assert.match(help.stdout, /^Usage: /, ENTRIES[i]);
    assert.match(help.stdout, /TANDEM_<FLAG>/, ENTRIES[i]);
    assert.match(help.stdout, /-h, --help +print this help and exit/, ENTRIES[i]);
  }
  assert.match(helps[0].stdout, /--port N +the HTTP port; 0 picks a free one \(default 8080\)/);
  assert.match(helps[1].stdout, /--layers a:b +required: /);
});

Deno.test("--help on every task of deno.json: its flags, each with a meaning, and exit 0", async () => {
  assert.deepEqual(
    ["head", "worker", "generate", "make-model", "bench", "demo", "shard", "plan", "probe"]
      .concat(["compile", "loadtest", "drill"])
      .filter((t) => !TASKS.some(([name]) => name === t)),
    [],
  );
  const helps = await Promise.all(TASKS.map(([name]) => task(name, ["--help"])));
  for (const [i, help] of helps.entries()) {
    const [name] = TASKS[i];
    assert.equal(help.code, 0, `deno task ${name} --help: ${help.stderr}`);
    assert.match(help.stdout, new RegExp(`^Usage: deno task ${name} \\[flags\\]\n\\S`), name);
    const flags = help.stdout.split("\n").filter((l) => /^ {2}-/.test(l));
    assert.ok(flags.length >= 2, `${name}: ${help.stdout}`);
    // Each flag line has its meaning beside it, or on the next line when the flag is long.
    const lines = help.stdout.split("\n");
    for (const line of flags) {
      const meaning = /^ {2}-\S*(?: \S+)? {2,}\S/.test(line) ||
        /^ {4,}\S/.test(lines[lines.indexOf(line) + 1] ?? "");
      assert.ok(meaning, `${name}: ${line}`);
    }
  }
});

Deno.test("every task may read TANDEM_* and does: plan and probe take their flags from it", async () => {
  for (const [name, command] of TASKS) {
    const words = command.split(" ").map((w) => w.replaceAll("'", ""));
    assert.ok(
      words.some((w) =>
        w === "-A" || w === "--allow-all" || w === "--allow-env" ||
        /^--allow-env=(.*,)?TANDEM_\*(,|$)/.test(w)
      ),
      `deno task ${name} cannot read TANDEM_* variables: ${command}`,
    );
  }
  const model = await testModel({ arch: "qwen35moe" });
  const plan = await task("plan", [], {
    TANDEM_MODEL: model,
    TANDEM_STAGES: "0:2,2:4",
    TANDEM_CTX: "64",
    TANDEM_SLOTS: "1",
  });
  assert.equal(plan.code, 0, plan.stderr);
  assert.match(plan.stdout, /^stage 0:2\n[^]*\nstage 2:4\n[^]*\nall stages +\d/);
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = closed.addr.port;
  closed.close();
  const probe = await task("probe", [], { TANDEM_WORKER: `127.0.0.1:${port}` });
  assert.equal(probe.code, 1);
  assert.match(probe.stderr, new RegExp(`^Probe stopped: .*127\\.0\\.0\\.1:${port}`));
});

Deno.test("head and worker name a busy port before loading the model, and read TANDEM_*", async () => {
  const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = String(busy.addr.port);
  // The model does not exist: an error about it would mean the weights were opened first.
  const missing = `${PROJECT_ROOT}/no-such-model.gguf`;
  try {
    const head = await run(["main.ts", "--model", missing], { TANDEM_PORT: port });
    assert.equal(head.code, 1);
    assert.match(
      head.stderr,
      new RegExp(
        `^Head stopped: Cannot listen on 127\\.0\\.0\\.1:${port}: the port is in use`,
        "m",
      ),
    );
    const worker = await run(["worker.ts", "--model", missing, "--layers", "1:2", "--port", port]);
    assert.equal(worker.code, 1);
    assert.match(
      worker.stderr,
      new RegExp(`Worker stopped: Cannot listen on 127\\.0\\.0\\.1:${port}: the port is in use`),
    );
  } finally {
    busy.close();
  }
});

Deno.test("head and worker stop on corrupt metadata naming the file as given, the key and its value", () =>
  withTempDir(async (dir) => {
    // The rope sections of a file that stopped a worker deep in the reference engine's IMROPE.
    const meta = planModel({ preset: "tiny", arch: "qwen35moe" }).meta.map((e) =>
      e.key === "qwen35moe.rope.dimension_sections"
        ? { ...e, type: "array" as const, itemType: "i32" as const, value: [3, -901458906, 2, 0] }
        : e
    );
    await writeGguf(`${dir}/blob`, meta, [], () => new Uint8Array());
    const model = `${dir}/m.gguf`;
    await Deno.symlink("blob", model);
    const expected = new RegExp(
      `stopped: Cannot read model hyperparameters from "${model}": ` +
        `"qwen35moe.rope.dimension_sections" is \\[3,-901458906,2,0\\], expected 4 or fewer ` +
        `whole numbers 0\\.\\.16777216 with a sum above 0\n`,
    );
    const head = await run(["main.ts", "--model", model, "--port", "0", "--backend", "reference"]);
    assert.equal(head.code, 1);
    assert.match(head.stderr, expected);
    const worker = await run([
      ...["worker.ts", "--model", model, "--layers", "2:4", "--port", "0"],
      ...["--backend", "reference"],
    ]);
    assert.equal(worker.code, 1);
    assert.match(worker.stderr, expected);
  }));

Deno.test("the head refuses a non-loopback --host without --api-key-file unless --insecure", async () => {
  const missing = `${PROJECT_ROOT}/no-such-model.gguf`;
  const open = await run(["main.ts", "--model", missing, "--host", "0.0.0.0", "--port", "0"]);
  assert.equal(open.code, 2);
  assert.match(
    open.stderr,
    /^Cannot serve on 0\.0\.0\.0 without an API key: pass --api-key-file F/m,
  );
  // With --insecure the address is accepted: the run gets as far as the (missing) model.
  const insecure = await run([
    "main.ts",
    "--model",
    missing,
    "--host",
    "0.0.0.0",
    "--port",
    "0",
    "--insecure",
  ]);
  assert.equal(insecure.code, 1);
  assert.match(insecure.stderr, /no-such-model\.gguf/);
  const loopback = await run(["main.ts", "--model", missing, "--host", "127.0.0.2", "--port", "0"]);
  assert.equal(loopback.code, 1, loopback.stderr);
});
