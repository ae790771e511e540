// One GGUF file's header (magic, version, metadata, tensor infos), parsed with positioned reads.
// The first step of engine/gguf/read.ts; hostile bytes stop here as a SyntaxError with the offset.

import { blockGeometry, type GgmlType, typeName } from "../quant/ggml_types.ts";
import {
  alignUp,
  DEFAULT_ALIGNMENT,
  FIXED_SIZE,
  GGUF_MAGIC,
  isPowerOfTwo,
  KEY_ALIGNMENT,
  MAX_ARRAY_DEPTH,
  MAX_DIMS,
  MAX_HEADER_BYTES,
  shapeProblem,
  SUPPORTED_VERSIONS,
  tensorBytes,
  ValueType,
} from "./format.ts";
import type { GgufValue, GgufValueType } from "./gguf_model.ts";

/** A tensor info resolved against its file: `fileOffset` is absolute. */
export interface HeaderTensor {
  readonly name: string;
  readonly shape: readonly number[];
  readonly type: GgmlType;
  readonly nbytes: number;
  readonly fileOffset: number;
}

export interface Header {
  readonly version: number;
  readonly metadata: Map<string, GgufValue>;
  /** How each metadata value is stored, so a copy can write it back with the same types. */
  readonly metadataTypes: Map<string, GgufValueType>;
  readonly tensors: readonly HeaderTensor[];
  readonly alignment: number;
  /** Absolute offset of the data section. */
  readonly dataStart: number;
  readonly fileSize: number;
}

/** Smallest encodings, used to refuse counts the remaining bytes cannot hold before allocating. */
const MIN_KV_BYTES = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8;
const MIN_ITEM_BYTES: ReadonlyMap<ValueType, number> = new Map([
  ...FIXED_SIZE,
  [ValueType.STRING, 8],
  [ValueType.ARRAY, 4 + 8],
]);
const CHUNK_BYTES = 1 << 20;
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** A name from the file, quoted and cut short, so a hostile 60 MB key cannot flood a message. */
export function quote(name: string): string {
  return JSON.stringify(name.length > 80 ? `${name.slice(0, 80)}…` : name);
}

/**
 * Reads exactly `length` bytes at `offset` into `into` (a new array when absent), which it
 * returns; a short file is a SyntaxError.
 */
export async function readAt(
  file: Deno.FsFile,
  path: string,
  offset: number,
  length: number,
  into?: Uint8Array<ArrayBuffer>,
): Promise<Uint8Array<ArrayBuffer>> {
  if (into && into.length !== length) {
    throw new RangeError(`Cannot read ${length} bytes of "${path}" into ${into.length} bytes`);
  }
  const out = into ?? new Uint8Array(length);
  await file.seek(offset, Deno.SeekMode.Start);
  let done = 0;
  while (done < length) {
    const n = await file.read(out.subarray(done));
    if (n === null) {
      throw new SyntaxError(
        `Cannot read "${path}" as GGUF: the file ends at byte ${offset + done}, inside ` +
          `${length} bytes read from byte ${offset}; the file is truncated or was modified`,
      );
    }
    done += n;
  }
  return out;
}

/** A read position over the file with a window of buffered bytes. */
class Cursor {
  pos = 0;
  #window = new Uint8Array(0);
  #view = new DataView(this.#window.buffer);
  #windowStart = 0;

  constructor(
    readonly file: Deno.FsFile,
    readonly path: string,
    readonly fileSize: number,
  ) {}

  error(at: number, problem: string): SyntaxError {
    return new SyntaxError(`Cannot read "${this.path}" as GGUF: ${problem} (at byte ${at})`);
  }

  /** Bytes the header may still take: the rest of the file, capped by MAX_HEADER_BYTES. */
  get room(): number {
    return Math.min(this.fileSize, MAX_HEADER_BYTES) - this.pos;
  }

  roomText(): string {
    return this.fileSize <= MAX_HEADER_BYTES
      ? `only ${this.room} remain in the file`
      : `the header may take only ${this.room} more (limit ${MAX_HEADER_BYTES} bytes)`;
  }

  /** Whether the window already holds `n` bytes at `pos`. */
  has(n: number): boolean {
    return this.pos + n <= this.#windowStart + this.#window.length;
  }

  /** Makes `n` bytes at `pos` available to the synchronous readers below. */
  async need(n: number, what: string): Promise<void> {
    if (this.has(n)) return;
    const end = this.pos + n;
    if (end > this.fileSize) {
      throw this.error(this.pos, `the file ends at byte ${this.fileSize}, inside ${what}`);
    }
    if (end > MAX_HEADER_BYTES) {
      throw this.error(
        this.pos,
        `${what} ends past byte ${MAX_HEADER_BYTES}, the limit for metadata plus tensor infos; ` +
          `the file is corrupt or not a model`,
      );
    }
    const length = Math.min(Math.max(n, CHUNK_BYTES), this.fileSize - this.pos);
    this.#window = await readAt(this.file, this.path, this.pos, length);
    this.#view = new DataView(this.#window.buffer);
    this.#windowStart = this.pos;
  }

  #at(size: number): number {
    const i = this.pos - this.#windowStart;
    this.pos += size;
    return i;
  }

  u32(): number {
    return this.#view.getUint32(this.#at(4), true);
  }

  /** A u64 as a number, or a bigint beyond 2^53. */
  u64(): number | bigint {
    const v = this.peekU64();
    this.pos += 8;
    return v;
  }

  peekU64(): number | bigint {
    const i = this.pos - this.#windowStart;
    const hi = this.#view.getUint32(i + 4, true);
    // Below 2^53 the value is exact as a number; building a bigint per length costs GC time.
    if (hi < 2 ** 21) return hi * 2 ** 32 + this.#view.getUint32(i, true);
    return this.#view.getBigUint64(i, true);
  }

  bytes(n: number): Uint8Array {
    const i = this.#at(n);
    return this.#window.subarray(i, i + n);
  }

  fixed(type: ValueType): number | bigint | boolean {
    const v = this.#view;
    switch (type) {
      case ValueType.U8:
        return v.getUint8(this.#at(1));
      case ValueType.I8:
        return v.getInt8(this.#at(1));
      case ValueType.U16:
        return v.getUint16(this.#at(2), true);
      case ValueType.I16:
        return v.getInt16(this.#at(2), true);
      case ValueType.U32:
        return v.getUint32(this.#at(4), true);
      case ValueType.I32:
        return v.getInt32(this.#at(4), true);
      case ValueType.F32:
        return v.getFloat32(this.#at(4), true);
      case ValueType.BOOL:
        return v.getUint8(this.#at(1)) !== 0;
      case ValueType.U64:
        return this.u64();
      case ValueType.I64: {
        const x = v.getBigInt64(this.#at(8), true);
        return x >= -MAX_SAFE && x <= MAX_SAFE ? Number(x) : x;
      }
      case ValueType.F64:
        return v.getFloat64(this.#at(8), true);
      default:
        throw new TypeError(`Cannot read value type ${type} as a fixed-size value`);
    }
  }
}

/** A count of items of at least `minBytes` each; refused when the file cannot hold them. */
async function readCount(c: Cursor, minBytes: number, what: string): Promise<number> {
  const at = c.pos;
  await c.need(8, `the ${what} count`);
  const n = c.u64();
  if (typeof n === "bigint" || n * minBytes > c.room) {
    throw c.error(
      at,
      `${what} count ${n} needs at least ${BigInt(n) * BigInt(minBytes)} bytes but ` +
        c.roomText(),
    );
  }
  return n;
}

/** Decodes the `n` string bytes at the cursor; `at` is where the string's length field starts. */
function decodeString(c: Cursor, n: number, at: number, what: string): string {
  try {
    return utf8.decode(c.bytes(n));
  } catch (e) {
    throw c.error(at + 8, `${what} is not valid UTF-8: ${(e as Error).message}`);
  }
}

async function readString(c: Cursor, what: string): Promise<string> {
  const at = c.pos;
  await c.need(8, `the length of ${what}`);
  const n = c.u64();
  if (typeof n === "bigint" || n > c.room) {
    throw c.error(at, `${what} has length ${n} bytes but ${c.roomText()}`);
  }
  await c.need(n, what);
  return decodeString(c, n, at, what);
}

/**
 * A fixed-size or string value read without awaiting when the window already holds all of it,
 * else undefined (then readValue refills, or reports the problem). Keeps a 150k-token vocabulary
 * from costing an await per token.
 */
function valueInWindow(c: Cursor, type: number, what: string): GgufValue | undefined {
  const size = FIXED_SIZE.get(type);
  if (size !== undefined) return c.has(size) ? c.fixed(type) : undefined;
  if (type !== ValueType.STRING || !c.has(8)) return undefined;
  const n = c.peekU64();
  if (typeof n === "bigint" || !c.has(8 + n)) return undefined;
  const at = c.pos;
  c.pos += 8;
  return decodeString(c, n, at, what);
}

/**
 * One value; its stored type goes to `types`. Scalar items of an array record nothing: the
 * array's item type covers them.
 */
async function readValue(
  c: Cursor,
  type: number,
  depth: number,
  what: string,
  types?: GgufValueType[],
): Promise<GgufValue> {
  const size = FIXED_SIZE.get(type);
  if (size !== undefined) {
    await c.need(size, what);
    types?.push(type);
    return c.fixed(type);
  }
  if (type === ValueType.STRING) {
    types?.push(type);
    return await readString(c, what);
  }
  if (depth >= MAX_ARRAY_DEPTH) {
    throw c.error(c.pos, `${what} nests arrays deeper than ${MAX_ARRAY_DEPTH} levels`);
  }
  const typeAt = c.pos;
  await c.need(4, `the item type of ${what}`);
  const itemType = c.u32();
  const minBytes = MIN_ITEM_BYTES.get(itemType);
  if (minBytes === undefined) throw c.error(typeAt, `${what} has unknown item type ${itemType}`);
  const n = await readCount(c, minBytes, `${what} item`);
  const items: GgufValue[] = new Array(n);
  // Each inner array has its own item type, so arrays of arrays keep one type per item.
  const inner: GgufValueType[] | undefined = itemType === ValueType.ARRAY ? [] : undefined;
  for (let i = 0; i < n; i++) {
    items[i] = valueInWindow(c, itemType, what) ??
      await readValue(c, itemType, depth + 1, what, inner);
  }
  types?.push(inner ? { array: itemType, items: inner } : { array: itemType });
  return items;
}

interface Metadata {
  readonly metadata: Map<string, GgufValue>;
  readonly metadataTypes: Map<string, GgufValueType>;
  readonly alignment: number;
}

async function readMetadata(c: Cursor, count: number): Promise<Metadata> {
  const metadata = new Map<string, GgufValue>();
  const metadataTypes = new Map<string, GgufValueType>();
  let alignment = DEFAULT_ALIGNMENT;
  for (let i = 0; i < count; i++) {
    const keyAt = c.pos;
    const key = await readString(c, `metadata key ${i}`);
    const label = quote(key);
    if (metadata.has(key)) throw c.error(keyAt, `metadata key ${label} appears twice`);
    const typeAt = c.pos;
    await c.need(4, `the value type of ${label}`);
    const type = c.u32();
    if (!MIN_ITEM_BYTES.has(type)) {
      throw c.error(typeAt, `metadata key ${label} has unknown value type ${type}`);
    }
    const valueAt = c.pos;
    const types: GgufValueType[] = [];
    const value = await readValue(c, type, 0, `the value of ${label}`, types);
    if (key === KEY_ALIGNMENT) {
      if (typeof value !== "number" || !isPowerOfTwo(value)) {
        throw c.error(valueAt, `"${KEY_ALIGNMENT}" is ${value}; it must be a power of two`);
      }
      alignment = value;
    }
    metadata.set(key, value);
    metadataTypes.set(key, types[0]);
  }
  return { metadata, metadataTypes, alignment };
}

interface RawTensor {
  readonly at: number;
  readonly name: string;
  readonly shape: number[];
  readonly type: GgmlType;
  readonly offset: number;
}

async function readTensorInfo(c: Cursor, index: number, names: Set<string>): Promise<RawTensor> {
  const at = c.pos;
  const name = await readString(c, `the name of tensor ${index}`);
  const label = quote(name);
  if (names.has(name)) throw c.error(at, `tensor ${label} appears twice`);
  names.add(name);
  await c.need(4, `the dimension count of ${label}`);
  const nDims = c.u32();
  if (nDims < 1 || nDims > MAX_DIMS) {
    throw c.error(at, `tensor ${label} has ${nDims} dimensions; GGUF allows 1 to ${MAX_DIMS}`);
  }
  await c.need(8 * nDims + 4 + 8, `the info of ${label}`);
  const shape: number[] = [];
  for (let d = 0; d < nDims; d++) {
    const ne = c.u64();
    if (typeof ne === "bigint") {
      throw c.error(at, `tensor ${label} has dimension ${ne}, beyond 2^53`);
    }
    shape.push(ne);
  }
  const type = c.u32();
  if (!blockGeometry(type)) {
    throw c.error(
      at,
      `tensor ${label} has type ${typeName(type)}, which this engine cannot read; ` +
        `use a file quantized to a supported type (engine/quant/ggml_types.ts)`,
    );
  }
  const problem = shapeProblem(shape, type);
  if (problem) throw c.error(at, `tensor ${label} cannot be stored: ${problem}`);
  const offset = c.u64();
  if (typeof offset === "bigint") {
    throw c.error(at, `tensor ${label} has data offset ${offset}, beyond 2^53`);
  }
  return { at, name, shape, type, offset };
}

/** Checks placement within the data section: aligned, inside the file, no two overlapping. */
function placeTensors(
  c: Cursor,
  raw: readonly RawTensor[],
  dataStart: number,
  alignment: number,
): HeaderTensor[] {
  const placed = raw.map((t) => {
    if (t.offset % alignment !== 0) {
      throw c.error(
        t.at,
        `tensor ${
          quote(t.name)
        } has data offset ${t.offset}, not a multiple of the alignment ${alignment}`,
      );
    }
    const nbytes = tensorBytes(t.shape, t.type);
    const fileOffset = dataStart + t.offset;
    if (fileOffset + nbytes > c.fileSize) {
      throw c.error(
        t.at,
        `tensor ${quote(t.name)} occupies bytes ${fileOffset}..${
          fileOffset + nbytes
        } but the file ` +
          `ends at byte ${c.fileSize}; the file is truncated`,
      );
    }
    return { at: t.at, name: t.name, shape: t.shape, type: t.type, nbytes, fileOffset };
  });
  const byStart = [...placed].sort((a, b) => a.fileOffset - b.fileOffset);
  for (let i = 1; i < byStart.length; i++) {
    const prev = byStart[i - 1], t = byStart[i];
    if (t.fileOffset < prev.fileOffset + prev.nbytes) {
      throw c.error(
        t.at,
        `tensor ${quote(t.name)} at byte ${t.fileOffset} overlaps tensor ${quote(prev.name)} ` +
          `(bytes ${prev.fileOffset}..${prev.fileOffset + prev.nbytes})`,
      );
    }
  }
  return placed.map(({ name, shape, type, nbytes, fileOffset }) => ({
    name,
    shape,
    type,
    nbytes,
    fileOffset,
  }));
}

async function readVersion(c: Cursor): Promise<number> {
  await c.need(8, "the magic and version");
  const magic = c.bytes(4);
  if (String.fromCharCode(...magic) !== GGUF_MAGIC) {
    const shown = JSON.stringify(String.fromCharCode(...magic));
    throw c.error(0, `the first 4 bytes are ${shown}, expected "${GGUF_MAGIC}"`);
  }
  const version = c.u32();
  if (!SUPPORTED_VERSIONS.includes(version)) {
    const byteSwapped = ((version & 0xff) << 24 | (version & 0xff00) << 8 |
      (version >>> 8) & 0xff00 | version >>> 24) >>> 0;
    const hint = SUPPORTED_VERSIONS.includes(byteSwapped)
      ? "; the file is big-endian, which this engine does not read"
      : version === 1
      ? "; version 1 used 32-bit counts: convert the file with a current llama.cpp"
      : "";
    throw c.error(4, `version ${version} is not supported (supported: 2, 3)${hint}`);
  }
  return version;
}

/** Parses the header of one GGUF file already opened for reading. */
export async function readHeader(file: Deno.FsFile, path: string): Promise<Header> {
  const { size } = await file.stat();
  const c = new Cursor(file, path, size);
  const version = await readVersion(c);
  const tensorCount = await readCount(c, MIN_TENSOR_INFO_BYTES, "tensor");
  const kvCount = await readCount(c, MIN_KV_BYTES, "metadata key");
  const { metadata, metadataTypes, alignment } = await readMetadata(c, kvCount);
  const names = new Set<string>();
  const raw: RawTensor[] = [];
  for (let i = 0; i < tensorCount; i++) raw.push(await readTensorInfo(c, i, names));
  const dataStart = alignUp(c.pos, alignment);
  const tensors = placeTensors(c, raw, dataStart, alignment);
  return { version, metadata, metadataTypes, tensors, alignment, dataStart, fileSize: size };
}
