// gguf_dump: prints a GGUF model's metadata (long arrays abbreviated) and its tensor table.
// A debugging tool beside the weight path: opens the file with engine/gguf/read.ts, reads no data.
//
//   deno run --allow-read tools/gguf/gguf_dump.ts MODEL.gguf [--items=N]

import { typeName } from "../../engine/quant/ggml_types.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import type { GgufModel, GgufValue } from "../../engine/gguf/gguf_model.ts";

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

async function main(args: readonly string[]): Promise<void> {
  const path = args.find((a) => !a.startsWith("--"));
  const itemsFlag = args.find((a) => a.startsWith("--items="));
  const items = itemsFlag ? Number(itemsFlag.slice("--items=".length)) : 8;
  if (!path || !Number.isInteger(items) || items < 0) {
    console.error("Usage: deno run --allow-read tools/gguf/gguf_dump.ts MODEL.gguf [--items=N]");
    Deno.exit(2);
  }
  const model = await openGguf(path);
  try {
    console.log(formatModel(model, items));
  } finally {
    model.close();
  }
}

if (import.meta.main) await main(Deno.args);
