// The connection hello: model fingerprint, shared-key proofs, and the checks a client makes on
// a worker's HELLO. Used by peer.ts (client side) and stage_server.ts (worker side).
//
// Handshake (frames in frame.ts):
//   client → greeting (MAGIC, nonce_c)
//   worker → CHALLENGE (MAGIC, auth mode, nonce_s)
//   client → AUTH (HMAC(key, "tandem client" ‖ MAGIC ‖ nonce_c ‖ nonce_s), or zeros without key)
//   worker → HELLO (info, HMAC(key, "tandem worker" ‖ MAGIC ‖ nonce_c ‖ nonce_s ‖ info)) | ERROR
// Both nonces are fresh, so a recorded proof is worthless on another connection, and the key
// itself never crosses the wire. Each side proves itself: the worker checks the client's proof,
// the client checks the worker's, so neither talks to an impostor.

import type { GgufModel } from "../../engine/gguf/gguf_model.ts";
import type { StageShape } from "../../engine/stage.ts";
import { recordedFingerprint } from "../../engine/gguf/stage_shard.ts";
import { encodeHelloInfo, FINGERPRINT_BYTES, type HelloInfo, MAGIC, PROOF_BYTES } from "./frame.ts";

/** What a connecting stage needs from the chain behind a worker. */
/**
 * What a connecting stage needs of the worker: the same model, its layers starting at `first`
 * (the connecting stage's end), and at least its slots, context and snapshot places.
 */
export interface ChainExpectation
  extends Pick<StageShape, "nLayer" | "nEmbd" | "slots" | "ctx" | "snapshots" | "maxRewind"> {
  readonly first: number;
  readonly fingerprint: Uint8Array;
}

/** Bytes of tensor data hashed per tensor: tells apart models with identical tensor tables. */
const SAMPLE_BYTES = 32;
const MIN_KEY_BYTES = 16;
const utf8 = new TextEncoder();

/**
 * SHA-256 over the tensor table (name, type, shape; sorted by name so shard order does not
 * matter) and the first 32 bytes of each tensor's data. The table alone tells apart different
 * shapes and quantizations; the data samples tell apart two fine-tunes (or two seeds) that share
 * a table, at one small positioned read per tensor. A stage shard holds only part of the table,
 * so it answers with the whole model's fingerprint that `deno task shard` recorded in it.
 */
export async function modelFingerprint(model: GgufModel): Promise<Uint8Array> {
  const recorded = recordedFingerprint(model);
  if (recorded) return recorded;
  const names = [...model.tensors.keys()].sort();
  const parts: Uint8Array[] = [];
  for (const name of names) {
    const t = model.tensors.get(name)!;
    const words = new DataView(new ArrayBuffer(4 * (2 + 2 * t.shape.length)));
    words.setUint32(0, t.type, true);
    words.setUint32(4, t.shape.length, true);
    t.shape.forEach((d, i) => {
      words.setUint32(8 + i * 8, d % 0x1_0000_0000, true);
      words.setUint32(12 + i * 8, Math.floor(d / 0x1_0000_0000), true);
    });
    const sample = await model.readTensorBytes(name, 0, Math.min(SAMPLE_BYTES, t.nbytes));
    parts.push(utf8.encode(name), new Uint8Array(1), new Uint8Array(words.buffer), sample);
  }
  const all = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  parts.reduce((at, p) => (all.set(p, at), at + p.length), 0);
  return new Uint8Array(await crypto.subtle.digest("SHA-256", all));
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function isSpace(byte: number): boolean {
  return byte === 0x20 || (byte >= 0x09 && byte <= 0x0d);
}

/** Imports a shared secret (raw bytes, at least 16 after trimming whitespace) as an HMAC key. */
export async function importKey(secret: Uint8Array, source: string): Promise<CryptoKey> {
  let start = 0;
  let end = secret.length;
  while (start < end && isSpace(secret[start])) start++;
  while (end > start && isSpace(secret[end - 1])) end--;
  const trimmed = secret.slice(start, end);
  if (trimmed.length < MIN_KEY_BYTES) {
    throw new RangeError(
      `Cannot use key ${source}: it holds ${trimmed.length} bytes after trimming whitespace, ` +
        `expected at least ${MIN_KEY_BYTES}; make one with "openssl rand -hex 32 > key"`,
    );
  }
  return await crypto.subtle.importKey(
    "raw",
    trimmed,
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign", "verify"],
  );
}

/** Reads `--key-file`. */
export async function loadKeyFile(path: string): Promise<CryptoKey> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (e) {
    throw new Error(`Cannot read key file "${path}": ${(e as Error).message}`, { cause: e });
  }
  return await importKey(bytes, `file "${path}"`);
}

function proofInput(label: string, nonceC: Uint8Array, nonceS: Uint8Array, info?: Uint8Array) {
  const parts = [utf8.encode(label), new Uint8Array(4), nonceC, nonceS, info ?? new Uint8Array()];
  new DataView(parts[1].buffer).setUint32(0, MAGIC, true);
  const all = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  parts.reduce((at, p) => (all.set(p, at), at + p.length), 0);
  return all;
}

/** The client's proof that it holds the key. */
export async function clientProof(
  key: CryptoKey,
  nonceC: Uint8Array,
  nonceS: Uint8Array,
): Promise<Uint8Array> {
  const data = proofInput("tandem client", nonceC, nonceS);
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, data));
}

export async function verifyClientProof(
  key: CryptoKey,
  nonceC: Uint8Array,
  nonceS: Uint8Array,
  proof: Uint8Array,
): Promise<boolean> {
  const data = proofInput("tandem client", nonceC, nonceS);
  return await crypto.subtle.verify("HMAC", key, new Uint8Array(proof), data);
}

/** The worker's proof that it holds the key, binding the HELLO info it sends. */
export async function workerProof(
  key: CryptoKey,
  nonceC: Uint8Array,
  nonceS: Uint8Array,
  info: HelloInfo,
): Promise<Uint8Array> {
  const data = proofInput("tandem worker", nonceC, nonceS, encodeHelloInfo(info));
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, data));
}

export async function verifyWorkerProof(
  key: CryptoKey,
  nonceC: Uint8Array,
  nonceS: Uint8Array,
  info: HelloInfo,
  proof: Uint8Array,
): Promise<boolean> {
  const data = proofInput("tandem worker", nonceC, nonceS, encodeHelloInfo(info));
  return await crypto.subtle.verify("HMAC", key, new Uint8Array(proof), data);
}

export const NO_PROOF = new Uint8Array(PROOF_BYTES);

export function freshNonce(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(32));
}

/**
 * Why a worker's HELLO does not fit the connecting stage, naming both values and the fix, or
 * undefined when it fits. The model is checked first: a different model explains every other
 * difference.
 */
export function helloMismatch(info: HelloInfo, want: ChainExpectation): string | undefined {
  if (
    info.fingerprint.length !== FINGERPRINT_BYTES || hex(info.fingerprint) !== hex(want.fingerprint)
  ) {
    return `its model fingerprint is ${hex(info.fingerprint).slice(0, 16)}…, this stage's is ` +
      `${hex(want.fingerprint).slice(0, 16)}…; both must load the same model file`;
  }
  if (info.nLayer !== want.nLayer || info.nEmbd !== want.nEmbd) {
    return `its model has ${info.nLayer} layers of width ${info.nEmbd}, this stage's has ` +
      `${want.nLayer} of width ${want.nEmbd}; both must load the same model file`;
  }
  if (info.first !== want.first) {
    return `it serves layers ${info.first}..${info.end} but this stage ends at layer ` +
      `${want.first}; start it with --layers ${want.first}:<end>`;
  }
  if (info.end !== info.nLayer) {
    return `its chain stops at layer ${info.end} but the model has ${info.nLayer} layers; ` +
      `the last stage must reach layer ${info.nLayer} (give the worker --next)`;
  }
  if (info.slots < want.slots) {
    return `it has ${info.slots} slots, this stage uses ${want.slots}; start it with --slots ` +
      `${want.slots} or more`;
  }
  if (info.ctx < want.ctx) {
    return `its context is ${info.ctx} tokens, this stage's is ${want.ctx}; start it with --ctx ` +
      `${want.ctx} or more`;
  }
  if (info.snapshots < want.snapshots) {
    return `it has ${info.snapshots} snapshot places, this stage uses ${want.snapshots}; start ` +
      `it with --snapshots ${want.snapshots} or more`;
  }
  if (info.maxRewind < want.maxRewind) {
    return `it keeps ${info.maxRewind} positions to rewind, this stage verifies up to ` +
      `${want.maxRewind}; start it with --rewind ${want.maxRewind} or more`;
  }
  if (info.maxBatch < 1) return `it accepts at most ${info.maxBatch} rows per frame`;
  return undefined;
}
