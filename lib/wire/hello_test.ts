// Tests of lib/wire/hello.ts: the model fingerprint, shared-key import and proofs, and the
// mismatch messages a connecting stage gives for a worker's HELLO.

import assert from "node:assert/strict";
import { openGguf } from "../../engine/gguf/read.ts";
import type { HelloInfo } from "./frame.ts";
import {
  type ChainExpectation,
  clientProof,
  freshNonce,
  helloMismatch,
  hex,
  importKey,
  modelFingerprint,
  verifyClientProof,
  verifyWorkerProof,
  workerProof,
} from "./hello.ts";
import { testModel, type TestModelSpec } from "../../tests/_models.ts";

async function fingerprintOf(spec: TestModelSpec): Promise<string> {
  const model = await openGguf(await testModel(spec));
  try {
    return hex(await modelFingerprint(model));
  } finally {
    model.close();
  }
}

Deno.test("the fingerprint tells apart seeds, quantizations and archs, but not a split", async () => {
  const base = await fingerprintOf({ arch: "qwen35moe", quant: "q4_k_m" });
  assert.match(base, /^[0-9a-f]{64}$/);
  assert.equal(await fingerprintOf({ arch: "qwen35moe", quant: "q4_k_m" }), base);
  // Same tensor table, other weights: only the data samples can tell these apart.
  assert.notEqual(await fingerprintOf({ arch: "qwen35moe", quant: "q4_k_m", seed: 2 }), base);
  assert.notEqual(await fingerprintOf({ arch: "qwen3next", quant: "q4_k_m" }), base);
  assert.notEqual(await fingerprintOf({ arch: "qwen35", quant: "q4_k_m" }), base);
  // The same model cut into gguf-split shards is the same model.
  assert.equal(await fingerprintOf({ arch: "qwen35moe", quant: "q4_k_m", split: 2 }), base);
});

const SECRET = new TextEncoder().encode("0123456789abcdef0123456789abcdef");

Deno.test("keys are trimmed of surrounding whitespace and must hold 16 bytes", async () => {
  const plain = await importKey(SECRET, "test");
  const padded = await importKey(
    new TextEncoder().encode(" 0123456789abcdef0123456789abcdef\n"),
    "t",
  );
  const [nc, ns] = [freshNonce(), freshNonce()];
  assert.ok(await verifyClientProof(padded, nc, ns, await clientProof(plain, nc, ns)));
  await assert.rejects(
    importKey(new TextEncoder().encode("  short-key-123\n"), `file "k"`),
    /Cannot use key file "k": it holds 13 bytes after trimming whitespace, expected at least 16/,
  );
});

Deno.test("proofs check only with the same key, the same nonces and the same hello", async () => {
  const key = await importKey(SECRET, "a");
  const other = await importKey(SECRET.map((b) => b ^ 1), "b");
  const [nc, ns] = [freshNonce(), freshNonce()];
  const proof = await clientProof(key, nc, ns);
  assert.ok(await verifyClientProof(key, nc, ns, proof));
  assert.ok(!await verifyClientProof(other, nc, ns, proof));
  assert.ok(!await verifyClientProof(key, freshNonce(), ns, proof));
  assert.ok(!await verifyClientProof(key, nc, freshNonce(), proof));
  // The worker's proof is a different statement: a client proof never passes for it.
  const info = helloInfo();
  assert.ok(!await verifyWorkerProof(key, nc, ns, info, proof));
  const signed = await workerProof(key, nc, ns, info);
  assert.ok(await verifyWorkerProof(key, nc, ns, info, signed));
  assert.ok(!await verifyWorkerProof(key, nc, ns, { ...info, ctx: info.ctx + 1 }, signed));
  assert.ok(!await verifyWorkerProof(other, nc, ns, info, signed));
});

function helloInfo(): HelloInfo {
  return {
    first: 2,
    end: 4,
    nLayer: 4,
    nEmbd: 256,
    slots: 2,
    ctx: 512,
    maxBatch: 64,
    snapshots: 4,
    maxRewind: 3,
    drafts: false,
    fingerprint: new Uint8Array(32).fill(0x11),
  };
}

Deno.test("a HELLO that fits passes, and each misfit names both values and the fix", () => {
  const want: ChainExpectation = {
    first: 2,
    nLayer: 4,
    nEmbd: 256,
    slots: 2,
    ctx: 512,
    snapshots: 4,
    maxRewind: 3,
    fingerprint: new Uint8Array(32).fill(0x11),
  };
  const info = helloInfo();
  assert.equal(helloMismatch(info, want), undefined);
  assert.equal(helloMismatch({ ...info, slots: 3, ctx: 1024, snapshots: 8 }, want), undefined);
  const cases: [Partial<HelloInfo>, RegExp][] = [
    [
      { fingerprint: new Uint8Array(32).fill(0x22) },
      /fingerprint is 2222222222222222…, this stage's is 1111111111111111…; both must load the same model/,
    ],
    [{ nLayer: 6, end: 6 }, /its model has 6 layers of width 256, this stage's has 4 of width 256/],
    [{ nEmbd: 128 }, /its model has 4 layers of width 128, this stage's has 4 of width 256/],
    [
      { first: 3 },
      /serves layers 3\.\.4 but this stage ends at layer 2; start it with --layers 2:<end>/,
    ],
    [{ end: 3 }, /its chain stops at layer 3 but the model has 4 layers/],
    [{ slots: 1 }, /it has 1 slots, this stage uses 2; start it with --slots 2 or more/],
    [
      { ctx: 256 },
      /its context is 256 tokens, this stage's is 512; start it with --ctx 512 or more/,
    ],
    [
      { snapshots: 3 },
      /it has 3 snapshot places, this stage uses 4; start it with --snapshots 4 or more/,
    ],
    [
      { maxRewind: 2 },
      /it keeps 2 positions to rewind, this stage verifies up to 3; start it with --rewind 3 or more/,
    ],
    [{ maxBatch: 0 }, /at most 0 rows per frame/],
  ];
  for (const [change, message] of cases) {
    assert.match(helloMismatch({ ...info, ...change }, want) ?? "", message);
  }
});
