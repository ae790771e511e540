// The pacing of Dawn's event polls (engine/gpu/dawn.ts): the pause schedule of one wait, a new
// wait after a quiet spell, and a setImmediate that stays whole for everything but Dawn's polls.

import assert from "node:assert/strict";
import {
  DAWN_TOGGLES,
  dawnOptions,
  paceDawnPolls,
  POLL_MAX_MS,
  POLL_MIN_MS,
  PollPacer,
} from "./dawn.ts";

Deno.test("PollPacer: a wait polls at once, then after pauses doubling up to the max", () => {
  const pacer = new PollPacer();
  let now = 100;
  const pauses: number[] = [];
  for (let i = 0; i < 8; i++) {
    const pause = pacer.next(now);
    pauses.push(pause);
    now += pause + 0.01;
    pacer.polled(now);
  }
  assert.equal(pauses[0], 0);
  assert.equal(pauses[1], POLL_MIN_MS);
  assert.equal(pauses[2], 2 * POLL_MIN_MS);
  for (let i = 2; i < pauses.length; i++) assert.ok(pauses[i] >= pauses[i - 1]);
  assert.equal(pauses.at(-1), POLL_MAX_MS);
  // The binding asks again only once the CPU has been busy elsewhere: a new wait starts fresh.
  assert.equal(pacer.next(now + 5 * POLL_MAX_MS), 0);
});

Deno.test("paceDawnPolls: other callbacks run as before, and off restores setImmediate", async () => {
  const before = globalThis.setImmediate;
  paceDawnPolls(true);
  try {
    assert.notEqual(globalThis.setImmediate, before);
    const got = await new Promise<number[]>((resolve) =>
      setImmediate((a, b) => resolve([a, b]), 1, 2)
    );
    assert.deepEqual(got, [1, 2]);
    const bound = await new Promise<string>((resolve) => setImmediate(resolve.bind(null, "bound")));
    assert.equal(bound, "bound");
  } finally {
    paceDawnPolls(false);
  }
  assert.equal(globalThis.setImmediate, before);
});

Deno.test("paced Dawn polls leave the event loop serving sockets", async () => {
  // Dawn's poll callbacks are unnamed native functions; a bound one with its name removed looks
  // the same to the pacer. While one re-arms itself (a GPU wait), loopback echoes must still
  // come back within a few ms, as they do on an idle loop.
  const native = (f: () => void) => Object.defineProperty(f.bind(null), "name", { value: "" });
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const echo = (async () => {
    const conn = await listener.accept();
    const buf = new Uint8Array(16);
    for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
      await conn.write(buf.subarray(0, n));
    }
    conn.close();
  })();
  const client = await Deno.connect({ hostname: "127.0.0.1", port: listener.addr.port });
  paceDawnPolls(true);
  let waiting = true;
  const poll = native(() => {
    if (waiting) setImmediate(poll);
  });
  try {
    setImmediate(poll);
    const trips: number[] = [];
    const buf = new Uint8Array(16);
    for (let i = 0; i < 20; i++) {
      const t = performance.now();
      await client.write(Uint8Array.of(i));
      await client.read(buf);
      trips.push(performance.now() - t);
    }
    trips.sort((a, b) => a - b);
    assert.ok(trips[10] < 5, `a loopback echo took ${trips[10].toFixed(1)} ms (median)`);
  } finally {
    waiting = false;
    paceDawnPolls(false);
    client.close();
    await echo;
    listener.close();
  }
});

Deno.test("dawnOptions: key=value pairs whose values may hold commas, plus the engine's toggles", () => {
  const toggles = `enable-dawn-features=${DAWN_TOGGLES.join(",")}`;
  assert.deepEqual(dawnOptions(undefined), [toggles]);
  assert.deepEqual(dawnOptions("backend=vulkan"), ["backend=vulkan", toggles]);
  // A toggle list of the caller's replaces the engine's, commas and all.
  assert.deepEqual(
    dawnOptions("backend=null,enable-dawn-features=dump_shaders,disable_symbol_renaming,,"),
    ["backend=null", "enable-dawn-features=dump_shaders,disable_symbol_renaming"],
  );
});
