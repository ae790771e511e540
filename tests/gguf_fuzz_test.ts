// Seeded fuzzing of what a head reads from a GGUF before any weight (engine/gguf header, hparams,
// lib/tokenizer): hostile values, flipped bytes and cuts give a model or a "Cannot …" error that
// names the file, and the key and value at fault, never an internal failure. CI runs a few hundred
// mutants; `deno task fuzz` 10,000.

import assert from "node:assert/strict";
import { GgmlType } from "../engine/quant/ggml_types.ts";
import { readHeadModel } from "../lib/server/head_model.ts";
import { type GgufMetaEntry, writeGguf } from "../tools/gguf/gguf_write.ts";
import { planModel } from "../tools/synth/generate_model.ts";
import { fuzzRuns, fuzzSeed, Random } from "./_fuzz.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { describeValue, type GgufValue } from "../engine/gguf/gguf_model.ts";
import { withTempDir } from "../engine/gguf/_gguf_bytes.ts";

/** Values that have broken readers: zero, signs, powers of two, huge counts, non-finite floats. */
const HOSTILE: Readonly<Record<string, readonly (number | bigint)[]>> = {
  u8: [0, 1, 255],
  u16: [0, 1, 0xffff],
  u32: [0, 1, 7, 2 ** 16, 2 ** 31, 2 ** 32 - 1, 1e8],
  i32: [0, -1, -(2 ** 31), 2 ** 31 - 1, 1e8],
  u64: [0n, 1n, 2n ** 31n, 2n ** 53n + 1n, 2n ** 64n - 1n],
  i64: [0n, -1n, -(2n ** 63n), 2n ** 63n - 1n],
  f32: [0, -1, NaN, Infinity, -Infinity, 3e38, 1e-45],
  f64: [0, -1, NaN, Infinity, 1e308],
};

/** Metadata with one entry changed: which key, and its value as a reader will see it. */
interface Mutated {
  readonly meta: GgufMetaEntry[];
  readonly key: string;
  /** undefined where the key is gone. */
  readonly value: GgufValue | undefined;
}

/** `value` of `type` as the reader returns it: f32 rounded, 64-bit integers within 2^53 numbers. */
function readBack(type: string, value: number | bigint): GgufValue {
  if (type === "f32") return Math.fround(Number(value));
  if (typeof value !== "bigint") return value;
  return value >= -Number.MAX_SAFE_INTEGER && value <= Number.MAX_SAFE_INTEGER
    ? Number(value)
    : value;
}

/** One way a structured mutation changes the metadata. */
function mutateMeta(meta: readonly GgufMetaEntry[], r: Random): Mutated {
  const out = [...meta];
  const i = r.int(out.length);
  const entry = out[i];
  switch (r.int(4)) {
    case 0: // a hostile number of the entry's own type, or of a wider one
    case 1: {
      const type = entry.type !== "array" && HOSTILE[entry.type]
        ? entry.type
        : r.pick(Object.keys(HOSTILE));
      const value = r.pick(HOSTILE[type]);
      out[i] = { key: entry.key, type, value } as GgufMetaEntry;
      return { meta: out, key: entry.key, value: readBack(type, value) };
    }
    case 2: // the key gone
      out.splice(i, 1);
      return { meta: out, key: entry.key, value: undefined };
    default: { // another kind of value: text, empty array, a long array of hostile numbers
      const changed = r.pick<GgufMetaEntry & { value: GgufValue }>([
        { key: entry.key, type: "string", value: "x" },
        { key: entry.key, type: "array", itemType: "u32", value: [] },
        {
          key: entry.key,
          type: "array",
          itemType: "u32",
          value: Array.from({ length: 1 + r.int(600) }, () => r.pick(HOSTILE.u32) as number),
        },
      ]);
      out[i] = changed;
      return { meta: out, key: entry.key, value: changed.value };
    }
  }
}

const escapeRegExp = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/**
 * Checks that a refusal of the mutant at `path` says where: it names the file; a refusal of what
 * the metadata says (past the GGUF structure) names one of `keys` and what was expected; and when
 * only `mutated` changed, it names that key and its value (or that it is missing).
 */
function assertNamesCause(
  message: string,
  path: string,
  keys: readonly string[],
  mutated: Mutated | undefined,
  what: string,
) {
  assert.ok(message.includes(`"${path}"`), `the file is not named: ${what}`);
  if (!message.startsWith(`Cannot read "${path}" as GGUF: `)) {
    assert.ok(keys.some((key) => message.includes(`"${key}"`)), `no key is named: ${what}`);
    assert.match(message, /, expected /, `what was expected is not said: ${what}`);
  }
  // Flipped bytes may land anywhere: only a mutation of values alone has a known cause.
  if (!mutated) return;
  assert.ok(message.includes(`"${mutated.key}"`), `${mutated.key} is not named: ${what}`);
  const value = mutated.value === undefined ? "missing" : describeValue(mutated.value);
  const named = new RegExp(`\\bis ${escapeRegExp(value)}(?![\\w.])`);
  assert.match(message, named, `its value ${value} is not named: ${what}`);
}

/** What a head does with a model file before its weights: header, tokenizer, template, hparams. */
async function readLikeAHead(path: string): Promise<void> {
  const model = await openGguf(path);
  try {
    readHeadModel(model);
  } finally {
    model.close();
  }
}

Deno.test("mutated GGUF headers open as a model or fail with a Cannot … error naming file and key, never internally", () =>
  withTempDir(async (dir) => {
    const runs = fuzzRuns(300);
    const seed = fuzzSeed(0x99f);
    const r = new Random(seed);
    const { meta } = planModel({ preset: "tiny", arch: "qwen35moe" });
    const keys = meta.map((e) => e.key);
    const tensors = [
      { name: "token_embd.weight", shape: [32, 2], type: GgmlType.F32 },
      { name: "output_norm.weight", shape: [32], type: GgmlType.F32 },
    ];
    const zeros = (t: { shape: readonly number[] }) =>
      new Uint8Array(4 * t.shape.reduce((a, b) => a * b, 1));
    const base = `${dir}/base.gguf`;
    await writeGguf(base, meta, tensors, zeros);
    const original = await Deno.readFile(base);
    const headerEnd = original.length - 4 * (64 + 32);
    const path = `${dir}/mutant.gguf`;
    const outcomes = new Map<string, number>();
    for (let run = 0; run < runs; run++) {
      const kind = r.pick(["values", "bytes", "cut", "values+bytes"] as const);
      let mutated: Mutated | undefined;
      if (kind === "values" || kind === "values+bytes") {
        mutated = mutateMeta(meta, r);
        try {
          await writeGguf(path, mutated.meta, tensors, zeros);
        } catch (e) {
          // The writer refuses some combinations itself (e.g. general.alignment not a power of 2).
          assert.match((e as Error).message, /^Cannot write/, `seed ${seed} run ${run}`);
          continue;
        }
      } else await Deno.writeFile(path, original);
      if (kind === "bytes" || kind === "values+bytes") {
        await Deno.writeFile(path, r.mutate(await Deno.readFile(path), headerEnd));
      }
      if (kind === "cut") await Deno.writeFile(path, original.subarray(0, r.int(original.length)));
      try {
        await readLikeAHead(path);
        outcomes.set("opened", (outcomes.get("opened") ?? 0) + 1);
      } catch (e) {
        const what = `seed ${seed} run ${run} (${kind}): ${(e as Error)?.stack ?? e}`;
        assert.ok(e instanceof SyntaxError || e instanceof RangeError, what);
        assert.match(e.message, /^Cannot /, what);
        const cause = kind === "values" ? mutated : undefined;
        assertNamesCause(e.message, path, keys, cause, what);
        outcomes.set(e.name, (outcomes.get(e.name) ?? 0) + 1);
      }
    }
    // Both outcomes, and both kinds of refusal, were reached.
    for (const outcome of ["opened", "SyntaxError", "RangeError"]) {
      assert.ok((outcomes.get(outcome) ?? 0) > 0, `${outcome}: ${JSON.stringify([...outcomes])}`);
    }
  }));
