// Test helpers for engine/gguf: a raw little-endian byte builder for hand-crafted (often hostile)
// GGUF files, independent of write.ts, plus temp-file and assertion shortcuts.

import assert from "node:assert/strict";
import { openGguf } from "./read.ts";

/** Appends fields in file order; each method returns `this` so a file reads as one chain. */
export class Bytes {
  #parts: number[] = [];

  u8(v: number): this {
    this.#parts.push(v & 0xff);
    return this;
  }

  u16(v: number): this {
    return this.raw([v & 0xff, (v >>> 8) & 0xff]);
  }

  u32(v: number): this {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, v, true);
    return this.raw(b);
  }

  u64(v: number | bigint): this {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
    return this.raw(b);
  }

  raw(b: ArrayLike<number>): this {
    for (let i = 0; i < b.length; i++) this.#parts.push(b[i]);
    return this;
  }

  /** u64 length + UTF-8 bytes. */
  str(s: string): this {
    const b = new TextEncoder().encode(s);
    return this.u64(b.length).raw(b);
  }

  /** GGUF magic, version, tensor count, kv count. */
  header(tensors: number | bigint, kvs: number | bigint, version = 3): this {
    return this.raw([0x47, 0x47, 0x55, 0x46]).u32(version).u64(tensors).u64(kvs);
  }

  /** One tensor info. */
  tensor(
    name: string,
    shape: readonly (number | bigint)[],
    type: number,
    offset: number | bigint,
  ): this {
    this.str(name).u32(shape.length);
    for (const d of shape) this.u64(d);
    return this.u32(type).u64(offset);
  }

  /** Zero bytes up to a multiple of `alignment`. */
  pad(alignment: number): this {
    while (this.#parts.length % alignment !== 0) this.#parts.push(0);
    return this;
  }

  zeros(n: number): this {
    for (let i = 0; i < n; i++) this.#parts.push(0);
    return this;
  }

  get length(): number {
    return this.#parts.length;
  }

  bytes(): Uint8Array {
    return Uint8Array.from(this.#parts);
  }
}

/** Runs `fn` with a fresh temporary directory and removes it afterwards. */
export async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "gguf_test_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Writes `bytes` to `name` in `dir` and returns the path. */
export async function put(dir: string, name: string, bytes: Uint8Array): Promise<string> {
  const path = `${dir}/${name}`;
  await Deno.writeFile(path, bytes);
  return path;
}

/**
 * Open file descriptors of this process pointing into `dir` (Linux); Deno's test runner does not
 * track leaks. Counting only `dir` keeps the check exact while other test files run in parallel.
 */
export async function openFilesUnder(dir: string): Promise<number> {
  let n = 0;
  for await (const fd of Deno.readDir("/proc/self/fd")) {
    const target = await Deno.readLink(`/proc/self/fd/${fd.name}`).catch(() => "");
    if (target.startsWith(`${dir}/`)) n++;
  }
  return n;
}

/**
 * Asserts that opening `path` rejects with `kind` and a message matching `pattern`, leaving no
 * file open behind it.
 */
export async function assertOpenFails(
  path: string,
  kind: new (...args: never[]) => Error,
  pattern: RegExp,
): Promise<void> {
  const dir = path.slice(0, path.lastIndexOf("/"));
  await assert.rejects(openGguf(path), (e: unknown) => {
    assert.ok(e instanceof kind, `expected ${kind.name}, got ${String(e)}`);
    assert.match(e.message, pattern);
    return true;
  });
  assert.equal(await openFilesUnder(dir), 0, `opening "${path}" left a file open`);
}
