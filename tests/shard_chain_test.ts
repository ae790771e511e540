// Stage shards in a real chain: worker processes that may read only their own shard, behind a head
// on the first shard, answer /v1/messages byte for byte as the unsplit model does.

import assert from "node:assert/strict";
import { layerRange, listOf } from "../lib/cli.ts";
import { writeStageShards } from "../tools/shard.ts";
import { post, startTestHead, tinyModel, withoutIds } from "./_head.ts";
import { startWorker } from "./_workers.ts";

/** `--stages` as the shard command parses it. */
const STAGES = listOf(layerRange);

Deno.test("a head and two workers on three shards equal the whole model over HTTP", async () => {
  const out = await Deno.makeTempDir({ prefix: "tandem-shard-chain-" });
  const model = await tinyModel();
  const [first, middle, last] = await writeStageShards(model, STAGES.parse("0:1,1:3,3:4"), out);
  const common = { ctx: 256, slots: 1, snapshots: 2 };
  const tail = await startWorker({ model: last, layers: "3:4", ...common });
  const mid = await startWorker({ model: middle, layers: "1:3", next: tail.address, ...common });
  const split = await startTestHead({
    model: first,
    layers: { first: 0, end: 1 },
    next: mid.address,
    ...common,
  });
  const whole = await startTestHead({ model, ...common });
  try {
    for (const content of ["Hello there", "Name three colors"]) {
      const req = {
        model: "m",
        max_tokens: 12,
        temperature: 0,
        messages: [{ role: "user", content }],
      };
      const a = await post(`${split.url}/v1/messages`, req);
      const b = await post(`${whole.url}/v1/messages`, req);
      assert.equal(a.status, 200);
      assert.equal(b.status, 200);
      assert.equal(withoutIds(await a.text()), withoutIds(await b.text()));
    }
  } finally {
    await split.close();
    await whole.close();
    await mid.stop();
    await tail.stop();
    await Deno.remove(out, { recursive: true });
  }
});
