// Opens a GGUF model, one file or all shards of a gguf-split, and reads tensor bytes on demand.
// Start of the weight path: header.ts parses each file; loaders call readTensor per stage.

import { type Header, quote, readAt, readHeader } from "./header.ts";
import {
  KEY_SPLIT_COUNT,
  KEY_SPLIT_NO,
  KEY_SPLIT_TENSORS,
  parseShardPath,
  shardPath,
} from "./format.ts";
import type { GgufModel, GgufTensorInfo, GgufValue, GgufValueType } from "./gguf_model.ts";
import type { ModelSource } from "./model_files.ts";

/** One open file. Seek+read pairs are queued so concurrent tensor reads cannot interleave. */
class ShardFile {
  #queue: Promise<unknown> = Promise.resolve();

  constructor(readonly file: Deno.FsFile, readonly path: string) {}

  read(offset: number, length: number, into?: Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
    const run = this.#queue.then(() => readAt(this.file, this.path, offset, length, into));
    // The caller sees a failure through `run`; the queue only needs to know it settled.
    this.#queue = run.then(() => undefined, () => undefined);
    return run;
  }
}

class OpenedModel implements GgufModel {
  readonly shardPaths: readonly string[];
  readonly #shards: readonly ShardFile[];
  #closed = false;

  constructor(
    readonly path: string,
    readonly version: number,
    readonly metadata: ReadonlyMap<string, GgufValue>,
    readonly metadataTypes: ReadonlyMap<string, GgufValueType>,
    readonly tensors: ReadonlyMap<string, GgufTensorInfo>,
    shards: readonly ShardFile[],
  ) {
    this.#shards = shards;
    this.shardPaths = shards.map((s) => s.path);
  }

  readTensor(name: string): Promise<Uint8Array> {
    return this.readTensorBytes(name, 0, this.tensors.get(name)?.nbytes ?? 0);
  }

  async readTensorBytes(
    name: string,
    start: number,
    length: number,
    into?: Uint8Array<ArrayBuffer>,
  ): Promise<Uint8Array> {
    const t = this.tensors.get(name);
    if (!t) {
      throw new RangeError(
        `Cannot read tensor "${name}": "${this.path}" has no tensor of that name`,
      );
    }
    const inRange = Number.isSafeInteger(start) && Number.isSafeInteger(length) && start >= 0 &&
      length >= 0 && start + length <= t.nbytes;
    if (!inRange) {
      throw new RangeError(
        `Cannot read bytes ${start}..${start + length} of tensor "${name}": it has ` +
          `${t.nbytes} bytes`,
      );
    }
    if (this.#closed) {
      throw new Deno.errors.BadResource(
        `Cannot read tensor "${name}": the model "${this.path}" is closed`,
      );
    }
    return await this.#shards[t.shard].read(t.fileOffset + start, length, into);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const s of this.#shards) s.file.close();
  }
}

/** The split.* keys of one shard; undefined when the file is not part of a split. */
interface SplitKeys {
  readonly no: number;
  readonly count: number;
  readonly tensors: number;
}

function splitKeys(h: Header, path: string): SplitKeys | undefined {
  if (!h.metadata.has(KEY_SPLIT_COUNT)) return undefined;
  const get = (key: string, max: number) => {
    const v = h.metadata.get(key);
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > max) {
      throw new SyntaxError(
        `Cannot read "${path}" as a GGUF split: "${key}" is ${quote(String(v))}, ` +
          `expected an integer 0..${max}`,
      );
    }
    return v;
  };
  const keys = {
    no: get(KEY_SPLIT_NO, 0xffff),
    count: get(KEY_SPLIT_COUNT, 0xffff),
    tensors: get(KEY_SPLIT_TENSORS, 0x7fffffff),
  };
  if (keys.no >= keys.count) {
    throw new SyntaxError(
      `Cannot read "${path}" as a GGUF split: "${KEY_SPLIT_NO}" ${keys.no} is not below ` +
        `"${KEY_SPLIT_COUNT}" ${keys.count}`,
    );
  }
  return keys;
}

/** Opens the shard named `path` at `at` (where its links lead); messages name `path`. */
async function openShard(path: string, at: string): Promise<[ShardFile, Header]> {
  const file = await Deno.open(at, { read: true });
  try {
    return [new ShardFile(file, path), await readHeader(file, path)];
  } catch (e) {
    file.close();
    throw e;
  }
}

/** Paths of shards 1..count-1, derived from the first shard's name as llama.cpp does. */
function otherShardPaths(path: string, split: SplitKeys): string[] {
  const parsed = parseShardPath(path);
  if (!parsed || parsed.index !== 0 || parsed.count !== split.count) {
    throw new SyntaxError(
      `Cannot find the other shards of "${path}": it is shard 1 of ${split.count}, so its ` +
        `name must end in "${shardPath("", 0, split.count)}"; rename it as gguf-split did`,
    );
  }
  return Array.from(
    { length: split.count - 1 },
    (_, i) => shardPath(parsed.stem, i + 1, split.count),
  );
}

async function openOtherShard(
  path: string,
  at: string,
  index: number,
  first: SplitKeys,
  firstPath: string,
): Promise<[ShardFile, Header]> {
  let opened: [ShardFile, Header];
  try {
    opened = await openShard(path, at);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
    throw new Deno.errors.NotFound(
      `Cannot open shard ${index + 1} of ${first.count} of "${firstPath}": "${path}" does not ` +
        `exist; download every shard into the same directory`,
      { cause: e },
    );
  }
  try {
    const keys = splitKeys(opened[1], path);
    const problem = !keys
      ? `it has no "${KEY_SPLIT_COUNT}" key`
      : keys.count !== first.count
      ? `it is one of ${keys.count} shards, the first shard says ${first.count}`
      : keys.tensors !== first.tensors
      ? `it says the model has ${keys.tensors} tensors, the first shard says ${first.tensors}`
      : keys.no !== index
      ? `it holds shard ${keys.no + 1}, expected ${index + 1}; the shard files were renamed`
      : undefined;
    if (problem) {
      throw new SyntaxError(
        `Cannot use "${path}" as shard ${index + 1} of "${firstPath}": ${problem}; ` +
          `the shards must all come from one gguf-split of one model`,
      );
    }
    return opened;
  } catch (e) {
    opened[0].file.close();
    throw e;
  }
}

function indexTensors(
  headers: readonly Header[],
  paths: readonly string[],
): Map<string, GgufTensorInfo> {
  const tensors = new Map<string, GgufTensorInfo>();
  headers.forEach((h, shard) => {
    for (const t of h.tensors) {
      const seen = tensors.get(t.name);
      if (seen) {
        throw new SyntaxError(
          `Cannot combine the shards of "${paths[0]}": tensor ${quote(t.name)} is in both ` +
            `"${paths[seen.shard]}" and "${paths[shard]}"`,
        );
      }
      tensors.set(t.name, { ...t, shard });
    }
  });
  return tensors;
}

/**
 * Opens a GGUF file and, when it is the first shard of a split, the other shards beside it.
 * Only headers are read here; tensor data is read by the returned model on request. Given
 * resolved files, each shard is opened where its name resolved to (all a role's grant may name)
 * and named in messages, and in the model, by its path as given.
 */
export async function openGguf(source: ModelSource): Promise<GgufModel> {
  const path = typeof source === "string" ? source : source.path;
  const resolved = new Map(
    typeof source === "string" ? [] : source.files.map((f) => [f.given, f.resolved]),
  );
  const at = (name: string) => resolved.get(name) ?? name;
  const opened = [await openShard(path, at(path))];
  try {
    const [, first] = opened[0];
    const split = splitKeys(first, path);
    if (split && split.no !== 0) {
      const parsed = parseShardPath(path);
      const hint = parsed ? `; open "${shardPath(parsed.stem, 0, split.count)}" instead` : "";
      throw new SyntaxError(
        `Cannot open "${path}" as a model: it is shard ${split.no + 1} of ${split.count}${hint}`,
      );
    }
    if (split && split.count > 1) {
      for (const [i, p] of otherShardPaths(path, split).entries()) {
        opened.push(await openOtherShard(p, at(p), i + 1, split, path));
      }
    }
    const paths = opened.map(([s]) => s.path);
    const tensors = indexTensors(opened.map(([, h]) => h), paths);
    if (split && tensors.size !== split.tensors) {
      throw new SyntaxError(
        `Cannot combine the shards of "${path}": they hold ${tensors.size} tensors but ` +
          `"${KEY_SPLIT_TENSORS}" is ${split.tensors}; a shard is from another split`,
      );
    }
    return new OpenedModel(
      path,
      first.version,
      first.metadata,
      first.metadataTypes,
      tensors,
      opened.map(([s]) => s),
    );
  } catch (e) {
    for (const [s] of opened) s.file.close();
    throw e;
  }
}
