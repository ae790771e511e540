// The GGUF byte layout shared by the reader and the writer: value type ids, limits, tensor sizes.
// Used by engine/gguf/header.ts (parse one file), read.ts (open a model) and write.ts (generator).
//
// All integers little-endian. One file (docs/model_arch.md §1.1, §1.3):
//   offset | size | field
//   0      | 4    | magic "GGUF"
//   4      | 4    | u32 version (2 or 3; both use u64 counts and lengths)
//   8      | 8    | u64 tensor_count
//   16     | 8    | u64 kv_count
//   24     | …    | kv_count × (string key, u32 value type, value)
//   …      | …    | tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//   …      | …    | zero padding to a multiple of general.alignment: the data section starts here;
//          |      | each tensor's bytes start at data start + its offset (a multiple of the alignment)
// string = u64 byte length + UTF-8 bytes (no NUL); array = u32 item type, u64 count, items.

import { blockGeometry, type GgmlType, typeName } from "../quant/ggml_types.ts";

export const GGUF_MAGIC = "GGUF";
export const SUPPORTED_VERSIONS: readonly number[] = [2, 3];
export const WRITE_VERSION = 3;

/** Metadata value type ids as stored in the file. */
export enum ValueType {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
}

/** Byte size of each fixed-size value type. */
export const FIXED_SIZE: ReadonlyMap<ValueType, number> = new Map([
  [ValueType.U8, 1],
  [ValueType.I8, 1],
  [ValueType.U16, 2],
  [ValueType.I16, 2],
  [ValueType.U32, 4],
  [ValueType.I32, 4],
  [ValueType.F32, 4],
  [ValueType.BOOL, 1],
  [ValueType.U64, 8],
  [ValueType.I64, 8],
  [ValueType.F64, 8],
]);

export const KEY_ALIGNMENT = "general.alignment";
export const KEY_SPLIT_NO = "split.no";
export const KEY_SPLIT_COUNT = "split.count";
export const KEY_SPLIT_TENSORS = "split.tensors.count";
export const DEFAULT_ALIGNMENT = 32;

/** ggml's GGML_MAX_DIMS. */
export const MAX_DIMS = 4;
/** Arrays of arrays deeper than this are refused, so hostile nesting cannot exhaust the stack. */
export const MAX_ARRAY_DEPTH = 8;
/**
 * Metadata plus tensor infos must end within this many bytes. Real headers are a few MiB (the
 * tokenizer dominates); the cap bounds what a hostile file can make the reader allocate.
 */
export const MAX_HEADER_BYTES = 64 * 1024 * 1024;

export function isPowerOfTwo(n: number): boolean {
  return Number.isSafeInteger(n) && n > 0 && 2 ** Math.round(Math.log2(n)) === n;
}

export function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

/**
 * Why a tensor shape and type cannot be stored, or undefined when they can. Follows ggml: 1 to 4
 * dimensions, each at least 1, rows a whole number of blocks, sizes within 2^53.
 */
export function shapeProblem(shape: readonly number[], type: number): string | undefined {
  const g = blockGeometry(type);
  if (!g) return `type ${typeName(type)} is not supported by this engine`;
  if (shape.length === 0 || shape.length > MAX_DIMS) {
    return `it has ${shape.length} dimensions; GGUF allows 1 to ${MAX_DIMS}`;
  }
  let elements = 1;
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 1) {
      return `dimension ${d} of [${shape}] is not a positive integer`;
    }
    elements *= d;
    if (!Number.isSafeInteger(elements)) return `shape [${shape}] has more than 2^53 elements`;
  }
  if (shape[0] % g.blockSize !== 0) {
    return `its rows of ${shape[0]} ${typeName(type)} values are not a multiple of the block ` +
      `size ${g.blockSize}`;
  }
  if (!Number.isSafeInteger(elements / g.blockSize * g.typeSize)) {
    return `shape [${shape}] of ${typeName(type)} takes more than 2^53 bytes`;
  }
  return undefined;
}

/** Bytes of a tensor's data; the shape must have passed `shapeProblem`. */
export function tensorBytes(shape: readonly number[], type: GgmlType): number {
  const g = blockGeometry(type)!;
  return shape.reduce((n, d) => n * d, 1) / g.blockSize * g.typeSize;
}

const SHARD_SUFFIX = /-(\d{5})-of-(\d{5})\.gguf$/;

/** `${stem}-00002-of-00003.gguf` for index 1 of 3 (llama.cpp's llama_split_path). */
export function shardPath(stem: string, index: number, count: number): string {
  const five = (n: number) => String(n).padStart(5, "0");
  return `${stem}-${five(index + 1)}-of-${five(count)}.gguf`;
}

/** The stem, 0-based index and count encoded in a shard's file name, if it has that form. */
export function parseShardPath(
  path: string,
): { stem: string; index: number; count: number } | undefined {
  const m = SHARD_SUFFIX.exec(path);
  if (!m) return undefined;
  return { stem: path.slice(0, m.index), index: Number(m[1]) - 1, count: Number(m[2]) };
}

/**
 * Every file of the model whose first (or only) file is `path`: the names gguf-split gives its
 * shards when `path` is shard 1 of N, else just `path`. Named from the path alone, so a launcher
 * can grant read access to them before anything is opened.
 */
export function splitPaths(path: string): string[] {
  const shard = parseShardPath(path);
  return shard && shard.index === 0
    ? Array.from({ length: shard.count }, (_, i) => shardPath(shard.stem, i, shard.count))
    : [path];
}
