// `deno task generate`: greedy continuation of a prompt on one process or a chain of stages.
// Flags → model, tokenizer, local stage (+ remote stages via --next) → engine/greedy_loop.ts → stdout.

import { parseArgs } from "node:util";
import { openGguf } from "../engine/gguf/read.ts";
import { generateGreedy } from "../engine/greedy_loop.ts";
import { checkChain } from "../engine/pipeline.ts";
import { openLocalStage, parseBackend, parseLayers } from "../engine/open_stage.ts";
import type { Stage } from "../engine/stage.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";

const USAGE = `Usage: deno task generate --model M.gguf (--prompt "text" | --prompt-ids 1,2,3) --n N
  [--json] [--backend reference|gpu] [--gpu auto|builtin|dawn] [--layers a:b --next host:port [--key-file F]]
  [--ctx N] [--ignore-eos]`;

function fail(message: string): never {
  console.error(`${message}\n${USAGE}`);
  Deno.exit(2);
}

function parsePromptIds(text: string): number[] {
  const ids = text.split(",").map((s) => Number(s.trim()));
  if (ids.some((id) => !Number.isInteger(id) || id < 0)) {
    fail(`Cannot parse --prompt-ids "${text}": expected comma-separated token ids`);
  }
  return ids;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      model: { type: "string" },
      prompt: { type: "string" },
      "prompt-ids": { type: "string" },
      n: { type: "string", default: "32" },
      json: { type: "boolean", default: false },
      backend: { type: "string" },
      gpu: { type: "string", default: "auto" },
      layers: { type: "string" },
      next: { type: "string" },
      "key-file": { type: "string" },
      ctx: { type: "string" },
      "ignore-eos": { type: "boolean", default: false },
      "allow-software-gpu": { type: "boolean", default: false },
    },
  });
  if (!values.model) fail("Missing --model");
  if ((values.prompt === undefined) === (values["prompt-ids"] === undefined)) {
    fail("Give exactly one of --prompt and --prompt-ids");
  }
  const n = Number(values.n);
  if (!Number.isInteger(n) || n < 1) {
    fail(`Cannot use --n "${values.n}": expected a positive integer`);
  }
  const model = await openGguf(values.model);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const prompt = values.prompt !== undefined
    ? tokenizer.encode(values.prompt)
    : parsePromptIds(values["prompt-ids"]!);
  const ctx = Number(values.ctx ?? Math.max(256, prompt.length + n));
  const stages: Stage[] = [];
  try {
    const backend = parseBackend(values.backend);
    const layers = values.layers ? parseLayers(values.layers) : undefined;
    if (values.next && !layers) fail("--next needs --layers 0:k for the local stage");
    const local = await openLocalStage(model, {
      backend,
      gpu: values.gpu,
      allowSoftwareGpu: values["allow-software-gpu"],
      first: layers?.first ?? 0,
      end: layers?.end,
      slots: 1,
      ctx,
    });
    stages.push(local);
    if (values.next) {
      const { connectRemoteStage } = await import("../lib/wire/remote_stage.ts");
      const { loadKeyFile } = await import("../lib/wire/hello.ts");
      const key = values["key-file"] ? await loadKeyFile(values["key-file"]) : undefined;
      stages.push(await connectRemoteStage(values.next, { local, model, key }));
    }
    checkChain(stages);
    const stopIds = values["ignore-eos"] ? undefined : tokenizer.eosIds;
    const { ids } = await generateGreedy(stages, prompt, { n, stopIds });
    const text = tokenizer.decode(ids);
    if (values.json) console.log(JSON.stringify({ prompt_ids: prompt, ids, text }));
    else console.log(text);
  } finally {
    for (const s of stages) s.close();
    model.close();
  }
}

if (import.meta.main) {
  try {
    await main();
  } catch (e) {
    console.error(`generate: ${e instanceof Error ? e.message : String(e)}`);
    Deno.exit(1);
  }
}
