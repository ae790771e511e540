// gguf_dump: prints a GGUF model's metadata (long arrays abbreviated) and its tensor table.
// A debugging tool beside the weight path: opens the file with engine/gguf/read.ts, reads no data.
//
//   deno run --allow-read tools/gguf/gguf_dump.ts --model MODEL.gguf [--items N]

import { typeName } from "../../engine/quant/ggml_types.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import type { GgufModel, GgufValue } from "../../engine/gguf/gguf_model.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  MODEL_FLAG,
  runCommand,
  whole,
} from "../../lib/cli.ts";

const GGUF_DUMP = {
  name: "GGUF dump",
  usage: "deno run --allow-read tools/gguf/gguf_dump.ts",
  about: "Prints a GGUF model's metadata (long arrays cut short) and its tensor table: name, " +
    "type, shape, bytes, shard and offset. Reads no tensor data.",
  flags: {
    model: MODEL_FLAG,
    items: flag(whole(0), "entries of an array value shown before its length", 8),
  },
} satisfies Command<FlagTable>;

/** One value on one line; arrays show their first `items` entries and their length. */
export function formatValue(v: GgufValue, items: number): string {
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "bigint") return `${v}n`;
  if (!Array.isArray(v)) return String(v);
  const shown = v.slice(0, items).map((x) => formatValue(x, items));
  const more = v.length > items ? `, … (${v.length} items)` : "";
  return `[${shown.join(", ")}${more}]`;
}

/** The whole dump as text: header, metadata, then one row per tensor. */
export function formatModel(model: GgufModel, items: number): string {
  const lines = [
    `${model.path}: GGUF v${model.version}, ${model.shardPaths.length} file(s), ` +
    `${model.metadata.size} keys, ${model.tensors.size} tensors`,
  ];
  for (const [key, value] of model.metadata) lines.push(`  ${key} = ${formatValue(value, items)}`);
  const rows = [...model.tensors.values()].map((t) => [
    t.name,
    typeName(t.type),
    `[${t.shape.join(", ")}]`,
    String(t.nbytes),
    String(t.shard),
    String(t.fileOffset),
  ]);
  const head = ["name", "type", "shape", "bytes", "shard", "offset"];
  const widths = head.map((h, c) => Math.max(h.length, ...rows.map((r) => r[c].length)));
  for (const r of [head, ...rows]) {
    lines.push("  " + r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd());
  }
  return lines.join("\n");
}

async function main(values: FlagValues<typeof GGUF_DUMP.flags>): Promise<void> {
  const model = await openGguf(values.model);
  try {
    console.log(formatModel(model, values.items));
  } finally {
    model.close();
  }
}

if (import.meta.main) await runCommand(GGUF_DUMP, main);
