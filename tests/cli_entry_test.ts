// The entry points as processes: --help on every task exits 0 and lists its flags, and the head
// and the worker bind their address before the model loads, naming a busy port in the error.

import assert from "node:assert/strict";
import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";
import { PROJECT_ROOT } from "./_workers.ts";

const ENTRIES = [
  "main.ts",
  "worker.ts",
  "tools/generate.ts",
  "tools/make_model.ts",
  "tools/demo.ts",
  "bench/decode.ts",
  "bench/profile.ts",
  "bench/stage_bench.ts",
  "bench/compile_times.ts",
];

/** Runs an entry point; the head and the worker with the grant their tasks give them. */
async function run(args: string[], env: Record<string, string> = {}) {
  const role = args[0] === "main.ts" || args[0] === "worker.ts";
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...(role ? LAUNCHER_FLAGS : ["-A"]), ...args],
    cwd: PROJECT_ROOT,
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
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
