// Model, shard and key paths behind symbolic links, as the tasks are started: a gguf-split in the
// Hugging Face cache layout (each shard its own link into blobs/), a linked folder, relative links.
// The head and the worker serve a split under grants naming only the resolved files; shard, plan
// and probe read the same paths.

import assert from "node:assert/strict";
import { relative } from "node:path";
import { post } from "./_head.ts";
import { testModel } from "./_models.ts";
import { freePort, PROJECT_ROOT, startLogged } from "./_workers.ts";

const COMMON = ["--backend", "reference", "--ctx", "64", "--slots", "1", "--snapshots", "2"];
const WIRE_KEY = "9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c\n";
const API_KEY = "sk-linked\n";
const ASK = {
  model: "t",
  max_tokens: 4,
  temperature: 0,
  messages: [{ role: "user", content: "Hello" }],
};

/** What `deno task NAME ARGS` prints and exits with, run in the project's root. */
async function task(name: string, args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", name, ...args],
    cwd: PROJECT_ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** The start-up line's read list of a role whose log is `log`. */
function readList(log: string): string {
  const m = /\[launch\] the \w+ runs with: net [^;]*; read ([^;]*); env/.exec(log);
  assert.ok(m, log);
  return m[1];
}

Deno.test("the head, a split head, a worker, shard, plan and probe take model, shard and key paths through links", async () => {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "tandem-links-" }));
  try {
    // A three-shard gguf-split cached as the Hugging Face hub caches it: content-named blobs (here
    // links to the generated files, so a path may take two hops) and one link per shard.
    const split = await testModel({ arch: "qwen3next", layout: "legacy", quant: "q8_0", split: 3 });
    const originals = [1, 2, 3].map((i) => split.replace("-00001-of-00003", `-0000${i}-of-00003`));
    const repo = `${dir}/hub/models--org--tiny`;
    await Deno.mkdir(`${repo}/blobs`, { recursive: true });
    await Deno.mkdir(`${repo}/snapshots/rev`, { recursive: true });
    for (const [i, original] of originals.entries()) {
      await Deno.symlink(original, `${repo}/blobs/${"cba"[i]}`);
      await Deno.symlink(
        `../../blobs/${"cba"[i]}`,
        `${repo}/snapshots/rev/t-0000${i + 1}-of-00003.gguf`,
      );
    }
    const cached = `${repo}/snapshots/rev/t-00001-of-00003.gguf`;
    // The same snapshot through a linked folder, named relative to the tasks' working directory.
    await Deno.symlink(`${repo}/snapshots/rev`, `${dir}/models`);
    const linkedFolder = relative(PROJECT_ROOT, `${dir}/models/t-00001-of-00003.gguf`);
    // Keys: one behind a relative link, one in a linked folder.
    await Deno.mkdir(`${dir}/secrets`);
    await Deno.writeTextFile(`${dir}/secrets/wire`, WIRE_KEY);
    await Deno.writeTextFile(`${dir}/secrets/api`, API_KEY);
    await Deno.symlink("secrets/wire", `${dir}/wire-key`);
    await Deno.symlink("secrets", `${dir}/keys`);

    // shard and plan read the cached split; shard writes into a linked folder.
    await Deno.mkdir(`${dir}/out`);
    await Deno.symlink("out", `${dir}/shards`);
    const shard = await task("shard", [
      ...["--model", cached, "--stages", "0:2,2:4", "--out", `${dir}/shards`],
    ]);
    assert.equal(shard.code, 0, shard.stderr);
    const shards = shard.stdout.trim().split("\n");
    assert.deepEqual(shards, [0, 2].map((a) => `${dir}/shards/t.layers-${a}-${a + 2}.gguf`));
    const plan = await task("plan", [
      ...["--model", linkedFolder, "--stages", "0:2,2:4", "--ctx", "64", "--slots", "1"],
    ]);
    assert.equal(plan.code, 0, plan.stderr);
    assert.match(plan.stdout, /^stage 0:2\n[^]*\nstage 2:4\n[^]*\nall stages /);

    // A worker on its shard through the linked folder, with its key behind a relative link.
    const [wp, hp] = [freePort(), freePort()];
    const workerShard = `${dir}/shards/t.layers-2-4.gguf`;
    const worker = await startLogged([
      "task",
      "worker",
      ...["--model", workerShard, "--layers", "2:4", "--port", `${wp}`],
      ...["--key-file", relative(PROJECT_ROOT, `${dir}/wire-key`), ...COMMON],
    ], /listening on/);
    let head;
    try {
      assert.equal(
        readList(worker.log()),
        `${workerShard} -> ${dir}/out/t.layers-2-4.gguf, ` +
          `${relative(PROJECT_ROOT, `${dir}/wire-key`)} -> ${dir}/secrets/wire`,
      );
      // probe reads the key through the linked folder, before the head holds the worker.
      const probe = await task("probe", [
        "--worker",
        `127.0.0.1:${wp}`,
        "--key-file",
        `${dir}/keys/wire`,
      ]);
      assert.equal(probe.code, 0, probe.stderr);
      assert.match(probe.stdout, /layers 2\.\.4 of 4/);

      // The split head on the cached whole model: each shard is granted as the file it reaches.
      head = await startLogged([
        "task",
        "head",
        ...["--model", cached, "--layers", "0:2", "--next", `127.0.0.1:${wp}`],
        ...["--key-file", `${dir}/keys/wire`, "--api-key-file", `${dir}/keys/api`],
        ...["--port", `${hp}`, ...COMMON],
      ], /serving/);
      const files = [1, 2, 3].map((i) =>
        `${repo}/snapshots/rev/t-0000${i}-of-00003.gguf -> ${originals[i - 1]}`
      );
      assert.match(
        readList(head.log()),
        new RegExp(
          "^" + escape(
            `${files.join(", ")}, ${dir}/keys/wire -> ${dir}/secrets/wire, ` +
              `${dir}/keys/api -> ${dir}/secrets/api, ${PROJECT_ROOT}/lib/`,
          ),
        ),
      );
      // Its model id comes from the given name, not the blob's.
      assert.match(head.log(), /serving t at /);
      const res = await post(`http://127.0.0.1:${hp}/v1/messages`, ASK, {
        "x-api-key": API_KEY.trim(),
      });
      assert.equal(res.status, 200, await res.clone().text());
      assert.equal((await res.json()).usage.output_tokens, 4);
    } finally {
      if (head) assert.equal((await head.stop()).code, 0, head.log());
      assert.equal((await worker.stop()).code, 0, worker.log());
    }

    // The head alone on the whole split, through the linked folder.
    const alone = await startLogged(
      ["task", "head", "--model", linkedFolder, "--port", `${hp}`, ...COMMON],
      /serving/,
    );
    try {
      assert.equal(
        readList(alone.log()).split(", ").slice(0, 3).join(", "),
        [1, 2, 3].map((i) => `${linkedFolder.replace("00001", `0000${i}`)} -> ${originals[i - 1]}`)
          .join(", "),
      );
      const res = await post(`http://127.0.0.1:${hp}/v1/messages`, ASK);
      assert.equal(res.status, 200, await res.clone().text());
    } finally {
      assert.equal((await alone.stop()).code, 0, alone.log());
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
