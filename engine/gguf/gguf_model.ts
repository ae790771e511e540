// The shape of an opened GGUF model (one file or all shards of a split): metadata and tensors.
// Implemented by engine/gguf/read.ts; used by the weight loaders, the generator and the tools.

import type { GgmlType } from "../quant/ggml_types.ts";

/** A metadata value. Integers of every width are numbers; u64/i64 beyond 2^53 are bigints. */
export type GgufValue = number | bigint | boolean | string | GgufValue[];

/**
 * How a metadata value is stored: a value type id (engine/gguf/format.ts ValueType) for a
 * scalar; for an array its item type, and when the items are arrays, each one's own type.
 */
export type GgufValueType =
  | number
  | { readonly array: number; readonly items?: readonly GgufValueType[] };

/** Characters of a value an error message shows. */
const SHOWN = 80;

/**
 * A value for an error message, as JSON would write it but with bigints as their digits and NaN
 * and ±Infinity by name, cut to 80 characters; or "missing". A long array is written only as far
 * as is shown.
 */
export function describeValue(value: GgufValue | undefined): string {
  if (value === undefined) return "missing";
  const text = describeUpTo(value, SHOWN + 1);
  return text.length > SHOWN ? `${text.slice(0, SHOWN)}…` : text;
}

/** `value` written until at least `room` characters, when it has that many. */
function describeUpTo(value: GgufValue, room: number): string {
  if (!Array.isArray(value)) {
    if (typeof value === "string") return JSON.stringify(value.slice(0, room));
    return String(value);
  }
  let text = "[";
  for (const [i, item] of value.entries()) {
    if (text.length >= room) return text;
    text += (i > 0 ? "," : "") + describeUpTo(item, room - text.length);
  }
  return `${text}]`;
}

/** One tensor as the file describes it. `shape` is ggml's `ne`: shape[0] varies fastest. */
export interface GgufTensorInfo {
  readonly name: string;
  readonly shape: readonly number[];
  readonly type: GgmlType;
  /** Byte size of the tensor's data. */
  readonly nbytes: number;
  /** Index of the shard (0-based) that holds the data. */
  readonly shard: number;
  /** Absolute byte offset of the data in that shard's file. */
  readonly fileOffset: number;
}

/** An opened model. Tensor data is read lazily with positioned reads. */
export interface GgufModel {
  /** Path of the first (or only) file. */
  readonly path: string;
  readonly version: number;
  /** Paths of all shards, in shard order. */
  readonly shardPaths: readonly string[];
  /** All metadata keys (from shard 0 of a split; the split.* keys included). */
  readonly metadata: ReadonlyMap<string, GgufValue>;
  /** The stored type of each metadata value (from the same shard as `metadata`). */
  readonly metadataTypes: ReadonlyMap<string, GgufValueType>;
  /** All tensors over all shards, in file order. */
  readonly tensors: ReadonlyMap<string, GgufTensorInfo>;
  /** Reads a whole tensor's bytes. Throws a RangeError naming the tensor if absent. */
  readTensor(name: string): Promise<Uint8Array>;
  /**
   * Reads `length` bytes starting `start` bytes into a tensor's data (e.g. one expert's rows);
   * into `into` when given (exactly `length` long, e.g. a mapped GPU buffer), which it returns.
   */
  readTensorBytes(
    name: string,
    start: number,
    length: number,
    into?: Uint8Array<ArrayBuffer>,
  ): Promise<Uint8Array>;
  close(): void;
}
