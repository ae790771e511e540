// Streams a GGUF model to disk, optionally as gguf-split shards, with bounded memory.
// Used by the model generator (tools/) and the tests; the files it writes are read by read.ts.

import { type GgmlType, typeName } from "../../engine/quant/ggml_types.ts";
import {
  alignUp,
  DEFAULT_ALIGNMENT,
  isPowerOfTwo,
  KEY_ALIGNMENT,
  KEY_SPLIT_COUNT,
  KEY_SPLIT_NO,
  KEY_SPLIT_TENSORS,
  MAX_ARRAY_DEPTH,
  shapeProblem,
  shardPath,
  tensorBytes,
  ValueType,
  WRITE_VERSION,
} from "../../engine/gguf/format.ts";
import type { GgufValue, GgufValueType } from "../../engine/gguf/gguf_model.ts";

export type GgufScalarType =
  | "u8"
  | "i8"
  | "u16"
  | "i16"
  | "u32"
  | "i32"
  | "u64"
  | "i64"
  | "f32"
  | "f64"
  | "bool"
  | "string";
export type GgufScalar = number | bigint | boolean | string;
/** An inner array of an array of arrays; each inner array has its own item type. */
export type GgufArrayValue =
  | { readonly itemType: GgufScalarType; readonly value: readonly GgufScalar[] }
  | { readonly itemType: "array"; readonly value: readonly GgufArrayValue[] };
export type GgufMetaEntry =
  | { key: string; type: GgufScalarType; value: GgufScalar }
  | { key: string; type: "array"; itemType: GgufScalarType; value: readonly GgufScalar[] }
  | { key: string; type: "array"; itemType: "array"; value: readonly GgufArrayValue[] };
export interface GgufTensorPlan {
  name: string;
  shape: readonly number[];
  type: GgmlType;
}
export interface WriteGgufOptions {
  /** Power of two; default `general.alignment` from `meta`, else 32. */
  alignment?: number;
  /** Number of gguf-split shards, 1..65535; default 1 (one plain file). */
  shards?: number;
}

const SCALAR_IDS: Readonly<Record<GgufScalarType, ValueType>> = {
  u8: ValueType.U8,
  i8: ValueType.I8,
  u16: ValueType.U16,
  i16: ValueType.I16,
  u32: ValueType.U32,
  i32: ValueType.I32,
  u64: ValueType.U64,
  i64: ValueType.I64,
  f32: ValueType.F32,
  f64: ValueType.F64,
  bool: ValueType.BOOL,
  string: ValueType.STRING,
};

const SCALAR_NAMES: ReadonlyMap<number, GgufScalarType> = new Map(
  Object.entries(SCALAR_IDS).map(([name, id]) => [id, name as GgufScalarType]),
);

function scalarName(id: number, what: string): GgufScalarType {
  const name = SCALAR_NAMES.get(id);
  if (name === undefined) throw new TypeError(`Cannot write ${what}: value type ${id} is unknown`);
  return name;
}

/** An array value as read (GgufModel.metadata) with its stored types, as the writer takes it. */
function arrayOf(type: GgufValueType, value: GgufValue, what: string): GgufArrayValue {
  if (typeof type === "number" || !Array.isArray(value)) {
    throw new TypeError(`Cannot write ${what}: its value and its stored type disagree`);
  }
  if (type.array !== ValueType.ARRAY) {
    return { itemType: scalarName(type.array, what), value: value as GgufScalar[] };
  }
  const items = type.items ?? [];
  return { itemType: "array", value: value.map((v, i) => arrayOf(items[i], v, what)) };
}

/**
 * The entry that writes a metadata value back exactly as it was read: `type` is its stored type
 * from GgufModel.metadataTypes, so a u32 stays a u32 and an f32 keeps its bits.
 */
export function metaEntryOf(key: string, value: GgufValue, type: GgufValueType): GgufMetaEntry {
  const what = `metadata "${key}"`;
  if (typeof type === "number") {
    if (Array.isArray(value)) throw new TypeError(`Cannot write ${what}: it is an array`);
    return { key, type: scalarName(type, what), value };
  }
  const array = arrayOf(type, value, what);
  return array.itemType === "array"
    ? { key, type: "array", itemType: "array", value: array.value }
    : { key, type: "array", itemType: array.itemType, value: array.value };
}

type IntType = "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "u64" | "i64";
const INT_RANGE: Readonly<Record<IntType, readonly [bigint, bigint]>> = {
  u8: [0n, 0xffn],
  i8: [-0x80n, 0x7fn],
  u16: [0n, 0xffffn],
  i16: [-0x8000n, 0x7fffn],
  u32: [0n, 0xffffffffn],
  i32: [-0x80000000n, 0x7fffffffn],
  u64: [0n, 0xffffffffffffffffn],
  i64: [-0x8000000000000000n, 0x7fffffffffffffffn],
};

const INT_SIZE: Readonly<Record<IntType, number>> = {
  u8: 1,
  i8: 1,
  u16: 2,
  i16: 2,
  u32: 4,
  i32: 4,
  u64: 8,
  i64: 8,
};

/** Large enough that small tensors coalesce into big sequential writes. */
const WRITE_BUFFER_BYTES = 4 << 20;
const utf8 = new TextEncoder();

/** A growable little-endian byte builder for the header. */
class HeaderBytes {
  #bytes = new Uint8Array(1 << 16);
  #view = new DataView(this.#bytes.buffer);
  length = 0;

  #grow(n: number): number {
    const at = this.length;
    if (at + n > this.#bytes.length) {
      const bigger = new Uint8Array(Math.max(2 * this.#bytes.length, at + n));
      bigger.set(this.#bytes.subarray(0, at));
      this.#bytes = bigger;
      this.#view = new DataView(bigger.buffer);
    }
    this.length += n;
    return at;
  }

  u32(v: number): void {
    const at = this.#grow(4);
    this.#view.setUint32(at, v, true);
  }

  u64(v: number | bigint): void {
    const at = this.#grow(8);
    this.#view.setBigUint64(at, BigInt(v), true);
  }

  raw(b: Uint8Array): void {
    const at = this.#grow(b.length);
    this.#bytes.set(b, at);
  }

  string(s: string): void {
    const b = utf8.encode(s);
    this.u64(b.length);
    this.raw(b);
  }

  int(type: IntType, v: bigint): void {
    // Grow first: growing replaces the view, so it must be read afterwards.
    const at = this.#grow(INT_SIZE[type]);
    const w = this.#view;
    switch (type) {
      case "u8":
        return w.setUint8(at, Number(v));
      case "i8":
        return w.setInt8(at, Number(v));
      case "u16":
        return w.setUint16(at, Number(v), true);
      case "i16":
        return w.setInt16(at, Number(v), true);
      case "u32":
        return w.setUint32(at, Number(v), true);
      case "i32":
        return w.setInt32(at, Number(v), true);
      case "u64":
        return w.setBigUint64(at, v, true);
      case "i64":
        return w.setBigInt64(at, v, true);
    }
  }

  float(type: "f32" | "f64", v: number): void {
    const at = this.#grow(type === "f32" ? 4 : 8);
    if (type === "f32") this.#view.setFloat32(at, v, true);
    else this.#view.setFloat64(at, v, true);
  }

  /** Zero-pads to a multiple of `alignment` and returns the bytes. */
  finish(alignment: number): Uint8Array {
    this.#grow(alignUp(this.length, alignment) - this.length);
    return this.#bytes.slice(0, this.length);
  }
}

function scalarId(type: string, what: string): ValueType {
  const id = SCALAR_IDS[type as GgufScalarType];
  if (id === undefined) {
    throw new TypeError(`Cannot write ${what}: "${type}" is not a GGUF value type`);
  }
  return id;
}

function putScalar(out: HeaderBytes, type: GgufScalarType, value: unknown, what: string): void {
  const wrongType = (expected: string) =>
    new TypeError(`Cannot write ${what} as ${type}: ${String(value)} is not ${expected}`);
  if (type === "bool") {
    if (typeof value !== "boolean") throw wrongType("a boolean");
    out.int("u8", value ? 1n : 0n);
  } else if (type === "string") {
    if (typeof value !== "string") throw wrongType("a string");
    out.string(value);
  } else if (type === "f32" || type === "f64") {
    if (typeof value !== "number") throw wrongType("a number");
    out.float(type, value);
  } else {
    const isInt = typeof value === "bigint" || Number.isInteger(value);
    if (!isInt) throw wrongType("an integer number or bigint");
    const v = BigInt(value as number | bigint);
    const [lo, hi] = INT_RANGE[type];
    if (v < lo || v > hi) {
      throw new RangeError(`Cannot write ${what} as ${type}: ${v} is outside ${lo}..${hi}`);
    }
    out.int(type, v);
  }
}

/** An array value: item type, count, items; inner arrays recurse. */
function putArray(
  out: HeaderBytes,
  itemType: string,
  items: unknown,
  depth: number,
  what: string,
): void {
  if (depth > MAX_ARRAY_DEPTH) {
    throw new RangeError(`Cannot write ${what}: arrays nest deeper than ${MAX_ARRAY_DEPTH} levels`);
  }
  if (!Array.isArray(items)) throw new TypeError(`Cannot write ${what}: the value is not an array`);
  const nested = itemType === "array";
  out.u32(nested ? ValueType.ARRAY : scalarId(itemType, what));
  out.u64(items.length);
  for (const item of items) {
    if (nested) {
      const inner = item as GgufArrayValue;
      putArray(out, inner?.itemType, inner?.value, depth + 1, what);
    } else {
      putScalar(out, itemType as GgufScalarType, item, what);
    }
  }
}

/** Header of one file: metadata and tensor infos, padded to where the data section starts. */
function encodeHeader(
  meta: readonly GgufMetaEntry[],
  tensors: readonly GgufTensorPlan[],
  sizes: readonly number[],
  alignment: number,
): Uint8Array {
  const out = new HeaderBytes();
  out.raw(utf8.encode("GGUF"));
  out.u32(WRITE_VERSION);
  out.u64(tensors.length);
  out.u64(meta.length);
  for (const e of meta) {
    const what = `metadata "${e.key}"`;
    out.string(e.key);
    if (e.type === "array") {
      out.u32(ValueType.ARRAY);
      putArray(out, e.itemType, e.value, 1, what);
    } else {
      out.u32(scalarId(e.type, what));
      putScalar(out, e.type, e.value, what);
    }
  }
  let offset = 0;
  tensors.forEach((t, i) => {
    out.string(t.name);
    out.u32(t.shape.length);
    for (const d of t.shape) out.u64(d);
    out.u32(t.type);
    out.u64(offset);
    offset += alignUp(sizes[i], alignment);
  });
  return out.finish(alignment);
}

/** Coalesces small writes; writes at least the buffer's size go straight to the file. */
class BufferedFile {
  #buffer = new Uint8Array(WRITE_BUFFER_BYTES);
  #used = 0;

  constructor(readonly file: Deno.FsFile) {}

  async write(bytes: Uint8Array): Promise<void> {
    if (this.#used + bytes.length > this.#buffer.length) await this.flush();
    if (bytes.length >= this.#buffer.length) return await writeAll(this.file, bytes);
    this.#buffer.set(bytes, this.#used);
    this.#used += bytes.length;
  }

  async flush(): Promise<void> {
    await writeAll(this.file, this.#buffer.subarray(0, this.#used));
    this.#used = 0;
  }
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  for (let done = 0; done < bytes.length;) done += await file.write(bytes.subarray(done));
}

function checkPlan(tensors: readonly GgufTensorPlan[], path: string): number[] {
  const names = new Set<string>();
  return tensors.map((t) => {
    if (typeof t.name !== "string" || names.has(t.name)) {
      throw new TypeError(`Cannot write "${path}": tensor name "${t.name}" is missing or repeated`);
    }
    names.add(t.name);
    const problem = shapeProblem(t.shape, t.type);
    if (problem) {
      throw new RangeError(
        `Cannot write tensor "${t.name}" ([${t.shape}] ${
          typeName(t.type)
        }) to "${path}": ${problem}`,
      );
    }
    return tensorBytes(t.shape, t.type);
  });
}

/** The alignment to use, and the entry to add when `meta` does not already state it. */
function resolveAlignment(
  meta: readonly GgufMetaEntry[],
  requested: number | undefined,
  path: string,
): [number, GgufMetaEntry[]] {
  const stated = meta.find((e) => e.key === KEY_ALIGNMENT);
  const statedValue = stated === undefined
    ? undefined
    : stated.type in INT_RANGE && typeof stated.value !== "boolean"
    ? Number(stated.value)
    : NaN;
  const alignment = requested ?? statedValue ?? DEFAULT_ALIGNMENT;
  if (!isPowerOfTwo(alignment) || (statedValue !== undefined && statedValue !== alignment)) {
    throw new RangeError(
      `Cannot write "${path}" with alignment ${alignment}: it must be a power of two and agree ` +
        `with "${KEY_ALIGNMENT}" in the metadata (${statedValue ?? "absent"})`,
    );
  }
  const entry: GgufMetaEntry[] = stated || alignment === DEFAULT_ALIGNMENT
    ? []
    : [{ key: KEY_ALIGNMENT, type: "u32", value: alignment }];
  return [alignment, entry];
}

function checkKeys(meta: readonly GgufMetaEntry[], sharded: boolean, path: string): void {
  const keys = new Set<string>();
  const reserved = [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS];
  for (const { key } of meta) {
    if (typeof key !== "string" || keys.has(key) || (sharded && reserved.includes(key))) {
      throw new TypeError(
        `Cannot write "${path}": metadata key "${key}" is missing, repeated, or a split.* key ` +
          `that the writer sets itself`,
      );
    }
    keys.add(key);
  }
}

/**
 * Writes the model; with shards > 1 writes gguf-split layout to `${stem}-%05d-of-%05d.gguf` (all
 * metadata in shard 0, other shards only split.* keys; tensors cut sequentially, evenly by count)
 * and returns the paths in order. `data` is called once per tensor, in plan order, and must return
 * exactly the tensor's byte size.
 */
export async function writeGguf(
  path: string,
  meta: readonly GgufMetaEntry[],
  tensors: readonly GgufTensorPlan[],
  data: (t: GgufTensorPlan, index: number) => Uint8Array | Promise<Uint8Array>,
  options: WriteGgufOptions = {},
): Promise<string[]> {
  const shards = options.shards ?? 1;
  if (!Number.isInteger(shards) || shards < 1 || shards > 0xffff) {
    throw new RangeError(`Cannot write "${path}" as ${shards} shards: use 1..65535`);
  }
  checkKeys(meta, shards > 1, path);
  const [alignment, alignmentEntry] = resolveAlignment(meta, options.alignment, path);
  const sizes = checkPlan(tensors, path);
  const bounds = Array.from(
    { length: shards + 1 },
    (_, i) => Math.floor(i * tensors.length / shards),
  );
  const stem = path.replace(/\.gguf$/, "");
  const paths = shards === 1 ? [path] : bounds.slice(1).map((_, i) => shardPath(stem, i, shards));
  const headers = paths.map((_, i) => {
    const split: GgufMetaEntry[] = shards === 1 ? [] : [
      { key: KEY_SPLIT_NO, type: "u16", value: i },
      { key: KEY_SPLIT_COUNT, type: "u16", value: shards },
      { key: KEY_SPLIT_TENSORS, type: "i32", value: tensors.length },
    ];
    const own = i === 0 ? [...split, ...meta, ...alignmentEntry] : [...split, ...alignmentEntry];
    const [from, to] = [bounds[i], bounds[i + 1]];
    return encodeHeader(own, tensors.slice(from, to), sizes.slice(from, to), alignment);
  });
  const padding = new Uint8Array(alignment);
  for (const [s, shardFile] of paths.entries()) {
    const file = await Deno.open(shardFile, { write: true, create: true, truncate: true });
    try {
      const out = new BufferedFile(file);
      await out.write(headers[s]);
      for (let i = bounds[s]; i < bounds[s + 1]; i++) {
        const t = tensors[i];
        const bytes = await data(t, i);
        if (!(bytes instanceof Uint8Array) || bytes.length !== sizes[i]) {
          throw new RangeError(
            `Cannot write tensor "${t.name}" to "${shardFile}": the data callback returned ` +
              `${bytes?.length} bytes, expected ${sizes[i]} for [${t.shape}] ${typeName(t.type)}`,
          );
        }
        await out.write(bytes);
        await out.write(padding.subarray(0, alignUp(sizes[i], alignment) - sizes[i]));
      }
      await out.flush();
    } finally {
      file.close();
    }
  }
  return paths;
}
