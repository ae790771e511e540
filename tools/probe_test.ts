// Tests of `deno task probe` (probe.ts) against a stage server in this process: a free worker
// answers its hello and a PING, a busy one is up, a wrong key and a closed port are failures.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { importKey } from "../lib/wire/hello.ts";
import { StageUnavailableError } from "../lib/wire/peer.ts";
import { connectRemoteStage } from "../lib/wire/remote_stage.ts";
import { testModel } from "../tests/_models.ts";
import { serveLocal } from "../tests/_workers.ts";
import { probeWorker } from "./probe.ts";

Deno.test("probe: a free worker's hello and PING; one serving its head is up; failures throw", async () => {
  const model = await openGguf(await testModel({ arch: "qwen35moe" }));
  const key = await importKey(new TextEncoder().encode("a wire key of enough bytes"), "test");
  const worker = await serveLocal(model, { first: 2, end: 4, slots: 1, ctx: 64 }, { key });
  const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: 64 });
  try {
    const free = await probeWorker(worker.address, key);
    assert.match(
      free,
      new RegExp(
        `^${worker.address}: layers 2\\.\\.4 of 4, .* slots 1, ctx 64, .*PING [\\d.]+ ms$`,
      ),
    );
    const remote = await connectRemoteStage(worker.address, { local: head, model, key });
    try {
      const busy = await probeWorker(worker.address, key);
      assert.match(busy, new RegExp(`^${worker.address}: up, serving another client \\(.*\\)`));
    } finally {
      remote.close();
    }
    const wrong = await importKey(
      new TextEncoder().encode("another key, also long enough"),
      "test",
    );
    await assert.rejects(probeWorker(worker.address, wrong), StageUnavailableError);
  } finally {
    head.close();
    await worker.stop();
    model.close();
  }
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const address = `127.0.0.1:${closed.addr.port}`;
  closed.close();
  await assert.rejects(probeWorker(address), /cannot connect/);
});
