// Seeded fuzzing of what a head reads from a GGUF before any weight (engine/gguf header, hparams,
// lib/tokenizer): hostile values, flipped bytes and cuts give a model or a "Cannot …" error, never
// an internal failure. CI runs a few hundred mutants; `deno task fuzz` 10,000.

import assert from "node:assert/strict";
import { GgmlType } from "../engine/quant/ggml_types.ts";
import { readHParams } from "../engine/hparams.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { type GgufMetaEntry, writeGguf } from "../tools/gguf/gguf_write.ts";
import { planModel } from "../tools/synth/generate_model.ts";
import { fuzzRuns, fuzzSeed, Random } from "./_fuzz.ts";
import { openGguf } from "../engine/gguf/read.ts";
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

/** One way a structured mutation changes the metadata. */
function mutateMeta(meta: readonly GgufMetaEntry[], r: Random): GgufMetaEntry[] {
  const out = [...meta];
  const i = r.int(out.length);
  const entry = out[i];
  switch (r.int(4)) {
    case 0: // a hostile number of the entry's own type, or of a wider one
    case 1: {
      const type = entry.type !== "array" && HOSTILE[entry.type]
        ? entry.type
        : r.pick(Object.keys(HOSTILE));
      out[i] = { key: entry.key, type, value: r.pick(HOSTILE[type]) } as GgufMetaEntry;
      break;
    }
    case 2: // the key gone
      out.splice(i, 1);
      break;
    default: // another kind of value: text, empty array, a long array of hostile numbers
      out[i] = r.pick<GgufMetaEntry>([
        { key: entry.key, type: "string", value: "x" },
        { key: entry.key, type: "array", itemType: "u32", value: [] },
        {
          key: entry.key,
          type: "array",
          itemType: "u32",
          value: Array.from({ length: 1 + r.int(600) }, () => r.pick(HOSTILE.u32) as number),
        },
      ]);
  }
  return out;
}

/** What a head does with a model file before its weights: header, hparams, tokenizer, template. */
async function readLikeAHead(path: string): Promise<void> {
  const model = await openGguf(path);
  try {
    readHParams(model.metadata);
    TextTokenizer.fromGguf(model.metadata);
  } finally {
    model.close();
  }
}

Deno.test("mutated GGUF headers open as a model or fail with a Cannot … error, never internally", () =>
  withTempDir(async (dir) => {
    const runs = fuzzRuns(300);
    const seed = fuzzSeed(0x99f);
    const r = new Random(seed);
    const { meta } = planModel({ preset: "tiny", arch: "qwen35moe" });
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
      if (kind === "values" || kind === "values+bytes") {
        try {
          await writeGguf(path, mutateMeta(meta, r), tensors, zeros);
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
        outcomes.set(e.name, (outcomes.get(e.name) ?? 0) + 1);
      }
    }
    // Both outcomes, and both kinds of refusal, were reached.
    for (const outcome of ["opened", "SyntaxError", "RangeError"]) {
      assert.ok((outcomes.get(outcome) ?? 0) > 0, `${outcome}: ${JSON.stringify([...outcomes])}`);
    }
  }));
