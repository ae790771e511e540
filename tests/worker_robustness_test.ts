// Malformed input against a real worker.ts process: each kind gets its ERROR code and a clean
// close, then seeded random and mutated frames (2,000 in CI, 10,000 in `deno task fuzz`);
// afterwards the worker still serves correctly.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import type { LogitPositions } from "../engine/stage.ts";
import { type RawClient, rawClient, startWorker } from "./_workers.ts";
import { deadline } from "../lib/wire/deadline.ts";
import {
  encodeFrame,
  encodeGreeting,
  ErrorCode,
  type Frame,
  HEADER_BYTES,
  MAGIC,
  Op,
} from "../lib/wire/frame.ts";
import { FrameReader, writeAll } from "../lib/wire/frame_stream.ts";
import { freshNonce, NO_PROOF } from "../lib/wire/hello.ts";
import { testModel } from "./_models.ts";
import { fuzzRuns, fuzzSeed, Random } from "./_fuzz.ts";

const path = await testModel({ arch: "qwen35moe", quant: "q4_k_m" });
const D = 256;
const SLOTS = 2;
const CTX = 16;
const MAX_BATCH = 4;

function words(...w: number[]): Uint8Array {
  const out = new Uint8Array(w.length * 4);
  w.forEach((x, i) => new DataView(out.buffer).setUint32(i * 4, x, true));
  return out;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  parts.reduce((at, p) => (out.set(p, at), at + p.length), 0);
  return out;
}

function run(
  slot: number,
  base: number,
  n: number,
  topk = 0,
  logits?: LogitPositions,
): Uint8Array {
  const rows = Float32Array.from({ length: n * D }, (_, i) => Math.sin(i) * 0.5);
  return encodeFrame({ op: Op.Run, slot, base, n, topk, rows, logits }, D);
}

/**
 * Sends `bytes` after the hello; expects `answers` replies that are not errors, then ERROR `code`
 * with a message matching `message`, then the close.
 */
async function expectRefusal(
  client: RawClient,
  bytes: Uint8Array,
  refusal: { code: ErrorCode; message: RegExp; answers?: number },
): Promise<void> {
  await client.send(bytes);
  for (let i = 0; i < (refusal.answers ?? 0); i++) assert.equal((await client.next())?.op, Op.Ids);
  const reply = await client.next();
  assert.ok(reply?.op === Op.Error, `expected an error, got ${JSON.stringify(reply)}`);
  assert.equal(reply.code, refusal.code, reply.message);
  assert.match(reply.message, refusal.message);
  assert.equal(await client.next(), null, "the worker closes after an error");
  client.close();
}

/**
 * Connects, sends greeting + AUTH + `bytes`, half-closes, and returns every frame until EOF but
 * the worker's ALIVEs (signs of life, which may come between any two).
 */
async function fuzzOne(address: string, bytes: Uint8Array): Promise<Frame[]> {
  const [hostname, port] = address.split(":");
  const conn = await Deno.connect({ hostname, port: Number(port) });
  try {
    const greeting = encodeGreeting(freshNonce(), MAGIC);
    await writeAll(conn, concat(greeting, encodeFrame({ op: Op.Auth, proof: NO_PROOF }), bytes));
    await conn.closeWrite();
    const reader = new FrameReader(conn);
    const frames: Frame[] = [];
    const limits = { nEmbd: D, maxBatch: MAX_BATCH };
    for (let f = await reader.readFrame(limits); f !== null; f = await reader.readFrame(limits)) {
      if (f.op !== Op.Alive) frames.push(f);
    }
    return frames;
  } finally {
    conn.close();
  }
}

/** A deterministic generator of random, mutated, truncated and field-fuzzed frames. */
function fuzzInputs(count: number, seed: number): Uint8Array[] {
  const r = new Random(seed);
  const next = () => r.int(0x1_0000_0000);
  const pick = <T>(xs: readonly T[]) => xs[next() % xs.length];
  const templates = [
    run(0, 0, 1, 2, "last"),
    run(1, 0, 2, 0, "none"),
    encodeFrame({ op: Op.Save, slot: 0, idx: 0 }),
    encodeFrame({ op: Op.Restore, slot: 1, idx: 0 }),
    encodeFrame({ op: Op.Close }),
    encodeFrame({ op: Op.Ping }),
    encodeFrame({ op: Op.Auth, proof: NO_PROOF }),
    encodeFrame({ op: Op.Ids, slot: 0, base: 0, ids: Uint32Array.of(1), top: [], lse: NaN }),
    encodeFrame({ op: Op.Error, code: 1, message: "x" }),
  ];
  const ops = [0, 1, 2, 3, 4, 5, 6, 7, 8, 0x81, 0x83, 0x84, 0x85, 0x86, 0x87, 0xff, 0xffff_ffff];
  const inputs: Uint8Array[] = [];
  for (let i = 0; i < count; i++) {
    const kind = next() % 10;
    if (kind < 3) {
      inputs.push(Uint8Array.from({ length: next() % 64 }, () => next() & 0xff));
    } else if (kind < 7) {
      const bytes = pick(templates).slice();
      for (let m = 1 + (next() % 3); m > 0; m--) {
        // Mostly header bytes: mutated payloads of valid frames only cost the worker a forward.
        const at = next() % 4 === 0 ? next() % bytes.length : next() % HEADER_BYTES;
        bytes[at] = next() & 0xff;
      }
      inputs.push(bytes);
    } else if (kind < 9) {
      const n = next() % 6;
      const header = words(pick(ops), next() % 4, n, next() % 20, next() % 4, 0, 0, 0);
      inputs.push(concat(header, Uint8Array.from({ length: next() % (n * D * 4 + 40) }, () => 0)));
    } else {
      const whole = pick(templates);
      inputs.push(whole.subarray(0, next() % whole.length));
    }
  }
  return inputs;
}

Deno.test("the worker refuses each malformed input with its code, then fuzzing leaves it serving", async (t) => {
  const worker = await startWorker({
    model: path,
    layers: "2:4",
    slots: SLOTS,
    ctx: CTX,
    maxBatch: MAX_BATCH,
    snapshots: 1,
  });
  const address = worker.address;
  try {
    await t.step("each kind of malformed input", async () => {
      const { Malformed, Range } = ErrorCode;
      const cases: [Uint8Array, { code: ErrorCode; message: RegExp; answers?: number }][] = [
        [words(10, 0, 0, 0, 0, 0, 0, 0), { code: Malformed, message: /unknown op 0xa/ }],
        [
          concat(words(Op.Draft, 0, 0, 0, 0, 0, 0, 0), new Uint8Array(4)),
          { code: Range, message: /Draft frame: n is 0, expected 1\.\.4/ },
        ],
        [
          encodeFrame({ op: Op.Drafted, slot: 0, ids: Uint32Array.of(1) }),
          { code: Malformed, message: /op 138: it is not a request/ },
        ],
        [
          encodeFrame({
            op: Op.Run,
            slot: 0,
            base: 0,
            n: 1,
            topk: 0,
            rows: new Float32Array(D),
            ids: Uint32Array.of(0xffff_fff0),
          }, D),
          { code: Range, message: /Cannot embed token id 4294967280/ },
        ],
        [
          encodeFrame({ op: Op.Rewind, slot: 0, position: 1 }),
          { code: Range, message: /Cannot rewind slot 0: its last run kept no trail/ },
        ],
        [words(Op.Ping, 0, 0, 0, 1, 0, 0, 0), {
          code: Malformed,
          message: /field topk is 1, expected 0/,
        }],
        [
          encodeFrame({ op: Op.Pong }),
          { code: Malformed, message: /op 135: it is not a request/ },
        ],
        [run(0, 0, MAX_BATCH + 1), { code: Range, message: /n is 5, expected 1\.\.4/ }],
        [run(SLOTS, 0, 1), {
          code: Range,
          message: /Cannot use slot 2: this worker has slots 0\.\.1/,
        }],
        [run(0, CTX - 1, 2), { code: Range, message: /positions 15\.\.17 of slot 0: the context/ }],
        [run(0, 3, 1), { code: Range, message: /it has seen 0 positions on this connection/ }],
        [words(Op.Save, 0, 1, 0, 0, 0, 0, 0), {
          code: Malformed,
          message: /field n is 1, expected 0/,
        }],
        [encodeFrame({ op: Op.Save, slot: 0, idx: 1 }), { code: Range, message: /snapshot 1/ }],
        [
          encodeFrame({ op: Op.Restore, slot: 0, idx: 0 }),
          { code: Range, message: /snapshot 0: it was not saved on this connection/ },
        ],
        [
          encodeFrame({ op: Op.Ids, slot: 0, base: 0, ids: Uint32Array.of(1), top: [], lse: NaN }),
          { code: Malformed, message: /op 129: it is not a request/ },
        ],
        [
          concat(words(Op.Run, 0, 1, 0, 0, 0, 0, 0), new Uint8Array(4 * D).fill(0xff)),
          { code: Malformed, message: /hidden value 0 of row 0 is NaN/ },
        ],
        [
          concat(words(Op.Run, 0, 1, 0, 0, 0, 0, 3), new Uint8Array(4 * D)),
          { code: Malformed, message: /logits is 3, expected 0 \(all\), 1 \(last\), 2 \(none\)/ },
        ],
        [
          concat(words(Op.Run, 0, 1, 0, 2, 0, 0, 2), new Uint8Array(4 * D)),
          { code: Range, message: /top-k candidates .* logits "none": it computes no logits/ },
        ],
        // Trailing bytes after a good frame that do not form the next one: answered, then refused.
        [
          concat(run(0, 0, 1), words(0x99, 0, 0, 0, 0, 0, 0, 0)),
          { code: Malformed, message: /unknown op 0x99/, answers: 1 },
        ],
      ];
      for (const [bytes, refusal] of cases) {
        await expectRefusal(await rawClient(address), bytes, refusal);
      }
      // PING is answered in request order, between RUNs, and leaves the slot where it was.
      const pinging = await rawClient(address);
      const ping = encodeFrame({ op: Op.Ping });
      await pinging.send(concat(ping, run(0, 0, 2), ping, run(0, 2, 1), ping));
      const replies = [];
      for (let i = 0; i < 5; i++) replies.push((await pinging.next())?.op);
      assert.deepEqual(replies, [Op.Pong, Op.Ids, Op.Pong, Op.Ids, Op.Pong]);
      pinging.close();
      // Gaps are checked against what the slot has seen on this connection.
      const client = await rawClient(address);
      await expectRefusal(client, concat(run(1, 0, 2), run(1, 3, 1)), {
        code: Range,
        message: /Cannot run slot 1 from position 3: it has seen 2 positions/,
        answers: 1,
      });
    });

    await t.step("a wrong magic, a missing AUTH and a half-sent frame", async () => {
      const [hostname, port] = address.split(":");
      const old = await Deno.connect({ hostname, port: Number(port) });
      // The seed's qkp3 greeting: 4 bytes, then it waits for the answer.
      await writeAll(old, words(0x716b7033));
      const answer = await new FrameReader(old).readFrame({ nEmbd: 0, maxBatch: 0 });
      assert.equal(answer?.op, Op.Error);
      if (answer?.op === Op.Error) {
        assert.equal(answer.code, ErrorCode.Version);
        assert.match(
          answer.message,
          /greeting starts with 0x716b7033 \("3pkq"\), expected 0x384d4454 \("TDM8"\)/,
        );
      }
      old.close();
      // The wire before RUN's logits word (TDM4, a 7-word header) is refused by its magic.
      const tdm4 = await Deno.connect({ hostname, port: Number(port) });
      await writeAll(tdm4, encodeGreeting(freshNonce(), 0x344d4454));
      const version = await new FrameReader(tdm4).readFrame({ nEmbd: 0, maxBatch: 0 });
      assert.ok(version?.op === Op.Error && version.code === ErrorCode.Version, `${version}`);
      assert.match(version.message, /0x344d4454 \("TDM4"\), expected 0x384d4454 \("TDM8"\)/);
      tdm4.close();
      const noAuth = await Deno.connect({ hostname, port: Number(port) });
      await writeAll(noAuth, concat(encodeGreeting(freshNonce()), run(0, 0, 1)));
      const reader = new FrameReader(noAuth);
      assert.equal((await reader.readFrame({ nEmbd: 0, maxBatch: 0 }))?.op, Op.Challenge);
      const refusal = await reader.readFrame({ nEmbd: 0, maxBatch: 0 });
      assert.ok(refusal?.op === Op.Error && refusal.code === ErrorCode.Malformed, `${refusal}`);
      noAuth.close();
      // Half a RUN, then the client vanishes: the worker drops it and takes the next client.
      const half = await rawClient(address);
      await half.send(run(0, 0, 2).subarray(0, HEADER_BYTES + 1000));
      half.close();
    });

    await t.step("random and mutated frames, each answered or refused cleanly", async () => {
      const counts = new Map<string, number>();
      let pongs = 0;
      const seed = fuzzSeed(0x5eed);
      const inputs = fuzzInputs(fuzzRuns(2000), seed);
      const check = (i: number, frames: Frame[]) => {
        assert.equal(frames[0]?.op, Op.Challenge, `seed ${seed} input ${i}`);
        assert.equal(frames[1]?.op, Op.Hello, `seed ${seed} input ${i}`);
        const rest = frames.slice(2);
        for (const [j, f] of rest.entries()) {
          const ok = f.op === Op.Ids || f.op === Op.Saved || f.op === Op.Restored ||
            f.op === Op.Pong ||
            (f.op === Op.Error && j === rest.length - 1);
          assert.ok(ok, `seed ${seed} input ${i}: reply ${j} is op ${f.op}`);
        }
        pongs += rest.filter((f) => f.op === Op.Pong).length;
        const last = rest.at(-1);
        const kind = last === undefined
          ? "silent close"
          : last.op === Op.Error
          ? `error ${last.code}`
          : "answered";
        counts.set(kind, (counts.get(kind) ?? 0) + 1);
      };
      // A few clients at once: the worker serves them one after another (a newcomer waits for
      // the current client), while connecting and writing overlap.
      let at = 0;
      await Promise.all(Array.from({ length: 4 }, async () => {
        while (at < inputs.length) {
          const i = at++;
          const frames = await deadline(
            fuzzOne(address, inputs[i]),
            5000,
            () => new Error(`fuzz input ${i} got no answer within 5 s`),
          );
          check(i, frames);
        }
      }));
      // The mix reached the refusal paths and the answering paths, not just one of them.
      for (const kind of [`error ${ErrorCode.Malformed}`, `error ${ErrorCode.Range}`, "answered"]) {
        assert.ok((counts.get(kind) ?? 0) > 10, `${kind}: ${JSON.stringify([...counts])}`);
      }
      // Most mutated PINGs are malformed; the fixed seed still lets some through intact.
      assert.ok(pongs > 0, `${pongs} PONGs`);
    });

    await t.step("afterwards the worker answers a valid hello and runs correctly", async () => {
      const client = await rawClient(address);
      assert.equal(client.hello.op, Op.Hello);
      const model = await openGguf(path);
      const head = await openReferenceStage(model, { first: 0, end: 2, slots: 1, ctx: CTX });
      const whole = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: CTX });
      const ids = Uint32Array.of(4, 8, 15);
      const hidden = await head.run(0, { kind: "ids", ids }, 3, 0);
      const want = await whole.run(0, { kind: "ids", ids }, 3, 0, { topk: 3 });
      head.close();
      whole.close();
      model.close();
      assert.equal(hidden.kind, "hidden");
      if (hidden.kind !== "hidden" || want.kind !== "ids") return;
      await client.send(
        encodeFrame({ op: Op.Run, slot: 1, base: 0, n: 3, topk: 3, rows: hidden.rows }, D),
      );
      const got = await client.next();
      assert.ok(got?.op === Op.Ids);
      assert.deepEqual([...got.ids], [...want.ids]);
      assert.deepEqual(got.top.map((e) => e.id), want.top.map((e) => e.id));
      client.close();
    });
  } finally {
    await worker.stop();
  }
});
