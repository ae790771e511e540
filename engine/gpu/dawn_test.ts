// The pacing of Dawn's event polls (engine/gpu/dawn.ts): the pause schedule of one wait, a new
// wait after a quiet spell, and a setImmediate that stays whole for everything but Dawn's polls.

import assert from "node:assert/strict";
import {
  DAWN_MMA_TOGGLES,
  DAWN_OFF_TOGGLES,
  DAWN_TOGGLES,
  dawnOptions,
  FINE_AFTER_MS,
  FINE_BEFORE_MS,
  paceDawnPolls,
  POLL_FAR_MS,
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

/** The times of the polls a pacer asks for from `start` until `until` (each poll takes 1 µs). */
function pollTimes(pacer: PollPacer, start: number, until: number): number[] {
  const times: number[] = [];
  let now = start;
  while (now < until) {
    now += pacer.next(now);
    times.push(now);
    now += 0.001;
    pacer.polled(now);
  }
  return times;
}

Deno.test("PollPacer: polls far apart before an expected end, finely around it, then as before", () => {
  const pacer = new PollPacer();
  const start = 1000;
  const end = start + 4.5;
  pacer.expect(end, start);
  const times = pollTimes(pacer, start, end + 1);
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  // No pause exceeds POLL_FAR_MS, the end is seen within POLL_MIN_MS, the window is polled
  // every POLL_MIN_MS, and the whole wait takes no more polls than the plain schedule's.
  assert.equal(times[0], start);
  assert.ok(gaps.every((g) => g <= POLL_FAR_MS + 0.002));
  assert.ok(times.some((t) => t >= end && t <= end + POLL_MIN_MS + 0.002));
  const fine = times.filter((t) => t >= end - FINE_BEFORE_MS && t <= end + FINE_AFTER_MS);
  assert.ok(fine.length >= (FINE_BEFORE_MS + FINE_AFTER_MS) / POLL_MIN_MS - 2);
  const plain = pollTimes(new PollPacer(), start, end);
  const upToEnd = times.filter((t) => t <= end + POLL_MIN_MS);
  assert.ok(upToEnd.length <= plain.length, `${upToEnd.length} polls, plain ${plain.length}`);
  // After the window the pauses double again up to POLL_MAX_MS.
  const after = gaps.slice(times.findIndex((t) => t > end + FINE_AFTER_MS));
  assert.ok(after.every((g) => g <= POLL_MAX_MS + 0.002) && after.at(-1)! > POLL_MIN_MS);
});

Deno.test("PollPacer: of two expected ends the earlier counts; a past one is replaced", () => {
  const pacer = new PollPacer();
  pacer.expect(10, 0);
  pacer.expect(5, 0);
  pacer.polled(4.95);
  assert.equal(pacer.next(4.95), POLL_MIN_MS);
  // Long after both, a new expectation replaces them.
  pacer.expect(30, 20);
  pacer.polled(20);
  assert.ok(pacer.next(20.01) > POLL_MIN_MS || pacer.next(20.02) > POLL_MIN_MS);
  pacer.polled(29.95);
  assert.equal(pacer.next(29.95), POLL_MIN_MS);
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
  const toggles = `enable-dawn-features=${[...DAWN_TOGGLES, ...DAWN_MMA_TOGGLES].join(",")}`;
  const off = `disable-dawn-features=${DAWN_OFF_TOGGLES.join(",")}`;
  assert.deepEqual(dawnOptions(undefined), [toggles, off]);
  assert.deepEqual(dawnOptions("backend=vulkan"), ["backend=vulkan", toggles, off]);
  // Without the tensor cores (TANDEM_MMA=1 unset), the toggles they need stay off.
  assert.deepEqual(dawnOptions(undefined, false), [
    `enable-dawn-features=${DAWN_TOGGLES.join(",")}`,
    off,
  ]);
  // A toggle list of the caller's replaces the engine's, commas and all.
  assert.deepEqual(
    dawnOptions("backend=null,enable-dawn-features=dump_shaders,disable_symbol_renaming,,"),
    ["backend=null", "enable-dawn-features=dump_shaders,disable_symbol_renaming", off],
  );
  assert.deepEqual(dawnOptions("disable-dawn-features=lazy_clear_resource_on_first_use"), [
    "disable-dawn-features=lazy_clear_resource_on_first_use",
    toggles,
  ]);
});
