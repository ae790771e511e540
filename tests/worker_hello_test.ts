// Connect-time failures against real worker.ts processes: wrong layers, wrong model, too small a
// context or too few snapshot places, bad keys (each with its own message), a broken chain behind a middle worker, and flags.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { freePort, runWorkerToExit, startWorker } from "./_workers.ts";
import { ErrorCode } from "../lib/wire/frame.ts";
import { importKey } from "../lib/wire/hello.ts";
import { StageUnavailableError } from "../lib/wire/peer.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import { defaultSnapshots } from "../lib/scheduler/prefix_cache.ts";
import { testModel } from "./_models.ts";

const path = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
const otherPath = await testModel({ arch: "qwen35moe", quant: "q4_k_m", seed: 2 });

async function refusal(work: Promise<unknown>): Promise<StageUnavailableError> {
  const e = await work.then(() => undefined, (e) => e);
  assert.ok(e instanceof StageUnavailableError, `expected a StageUnavailableError, got ${e}`);
  return e;
}

Deno.test("hello mismatches fail at connect, each naming both values", async () => {
  const model = await openGguf(path);
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: 32 });
  const caching = await openReferenceStage(model, {
    first: 0,
    end: 2,
    slots: 1,
    ctx: 32,
    snapshots: 2,
  });
  const workers = await Promise.all([
    startWorker({ model: path, layers: "3:4", ctx: 32 }),
    startWorker({ model: otherPath, layers: "2:4", ctx: 32 }),
    startWorker({ model: path, layers: "2:4", ctx: 16 }),
    startWorker({ model: path, layers: "2:4", ctx: 32, snapshots: 1 }),
    startWorker({ model: path, layers: "2:4", ctx: 32, snapshots: null }),
  ]);
  const [wrongLayers, wrongModel, smallCtx, fewSnapshots, defaults] = workers.map((w) => w.address);
  try {
    const layers = await refusal(connectRemoteStage(wrongLayers, { local: head, model }));
    assert.match(layers.message, new RegExp(`^Cannot use the stage at ${wrongLayers}: `));
    assert.match(layers.reason, /it serves layers 3\.\.4 but this stage ends at layer 2/);
    const other = await refusal(connectRemoteStage(wrongModel, { local: head, model }));
    assert.match(
      other.reason,
      /^its model fingerprint is [0-9a-f]{16}…, this stage's is [0-9a-f]{16}…; both must load/,
    );
    const ctx = await refusal(connectRemoteStage(smallCtx, { local: head, model }));
    assert.match(
      ctx.reason,
      /its context is 16 tokens, this stage's is 32; start it with --ctx 32/,
    );
    const snapshots = await refusal(
      connectRemoteStage(fewSnapshots, { local: caching, model }),
    );
    assert.match(
      snapshots.reason,
      /it has 1 snapshot places, this stage uses 2; start it with --snapshots 2 or more/,
    );
    // Without --snapshots a worker sizes its prefix cache as the head does by default.
    const sized = await connectRemoteStage(defaults, { local: caching, model });
    assert.equal((await sized.connect()).snapshots, defaultSnapshots(32, 1));
    assert.equal(defaultSnapshots(32, 1), 4);
    sized.close();
    // The same worker fits a stage that saves into no more places than it has.
    (await connectRemoteStage(fewSnapshots, { local: head, model })).close();
  } finally {
    caching.close();
    head.close();
    model.close();
    await Promise.all(workers.map((w) => w.stop()));
  }
});

Deno.test("a bad key is refused by the worker; key files are checked at start-up", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tandem-key-" });
  const keyFile = `${dir}/key`;
  await Deno.writeTextFile(keyFile, "9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c\n");
  await Deno.writeTextFile(`${dir}/short`, "abc\n");
  const model = await openGguf(path);
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: 32 });
  const worker = await startWorker({ model: path, layers: "2:4", ctx: 32, keyFile });
  try {
    const wrong = await importKey(
      new TextEncoder().encode("another key of 32 bytes, exactly"),
      "x",
    );
    const bad = await refusal(
      connectRemoteStage(worker.address, { local: head, model, key: wrong }),
    );
    assert.equal(bad.code, ErrorCode.Auth);
    assert.match(bad.reason, /its key proof does not match this worker's key/);
    const none = await refusal(connectRemoteStage(worker.address, { local: head, model }));
    assert.match(none.reason, /it requires a shared key; pass --key-file/);
    // Whitespace around the key does not matter, so `echo key > file` works on both sides.
    const key = await importKey(new TextEncoder().encode("9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c"), "y");
    const remote = await connectRemoteStage(worker.address, { local: head, model, key });
    remote.close();
    const short = await runWorkerToExit({ model: path, layers: "2:4", keyFile: `${dir}/short` });
    assert.equal(short.code, 1);
    assert.match(short.stderr, /Cannot use key file ".*short": it holds 3 bytes after trimming/);
  } finally {
    head.close();
    model.close();
    await worker.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a middle worker whose next stage does not fit fails the head's hello", async () => {
  const model = await openGguf(path);
  const head = await openReferenceStage(model, { first: 0, end: 1, slots: 1, ctx: 32 });
  const last = await startWorker({ model: path, layers: "3:4", ctx: 16 });
  const middle = await startWorker({ model: path, layers: "1:3", ctx: 32, next: last.address });
  try {
    const e = await refusal(connectRemoteStage(middle.address, { local: head, model }));
    assert.equal(e.code, ErrorCode.Downstream);
    assert.match(
      e.reason,
      new RegExp(
        `^Cannot use the stage at ${last.address}: its context is 16 tokens, this stage's is 32`,
      ),
    );
  } finally {
    head.close();
    model.close();
    await middle.stop();
    await last.stop();
  }
});

Deno.test("worker flags: layer 0, a short chain, and an open address without a key or --insecure", async () => {
  const zero = await runWorkerToExit({ model: path, layers: "0:4" });
  assert.equal(zero.code, 2);
  assert.match(zero.stderr, /layer 0 embeds token ids, which the head does/);
  const short = await runWorkerToExit({ model: path, layers: "1:3" });
  assert.equal(short.code, 1);
  assert.match(short.stderr, /the model has 4 layers and no next stage is given; pass --next/);
  const open = await runWorkerToExit({ model: path, layers: "2:4", host: "0.0.0.0" });
  assert.equal(open.code, 2);
  assert.match(open.stderr, /Cannot listen on 0\.0\.0\.0 without a key: pass --key-file F/);
  const insecure = await startWorker({
    model: path,
    layers: "2:4",
    host: "0.0.0.0",
    extra: ["--insecure"],
  });
  await insecure.stop();
  assert.match(insecure.log(), /listening on 0\.0\.0\.0:\d+: layers 2\.\.4 of 4.*no key/);
});

Deno.test("a worker says the grant its role runs under: its address, its model, no FFI", async () => {
  const port = freePort();
  const worker = await startWorker({ model: path, layers: "2:4", port });
  await worker.stop();
  assert.match(
    worker.log(),
    new RegExp(
      `\\[launch\\] the worker runs with: net 127\\.0\\.0\\.1:${port}; read ` +
        `${path.replaceAll(".", "\\.")}; env TANDEM_\\*; ffi none; no write, run or sys`,
    ),
  );
});
