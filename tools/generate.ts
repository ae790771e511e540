// `deno task generate`: greedy continuation of a prompt on one process or a chain of stages.
// Flags → model, tokenizer, local stage (+ the rest via --next) → lib/scheduler/ → stdout.

import { readingFile } from "../engine/gguf/model_errors.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { openLocalStage } from "../engine/open_stage.ts";
import type { Stage } from "../engine/stage.ts";
import {
  address,
  type Command,
  ENGINE_FLAGS,
  engineChoice,
  flag,
  type FlagTable,
  type FlagValues,
  type Kind,
  layerRange,
  MODEL_FLAG,
  runCommand,
  switchFlag,
  text,
  UsageError,
  whole,
} from "../lib/cli.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { loadKeyFile } from "../lib/wire/hello.ts";
import { connectRemoteStage, type RemoteStage } from "../lib/wire/remote_stage.ts";

const tokenIds: Kind<number[]> = {
  value: "ID,...",
  parse(t) {
    const ids = t.split(",").map((s) => Number(s.trim()));
    if (ids.some((id) => !Number.isInteger(id) || id < 0)) {
      throw new Error("expected comma-separated token ids");
    }
    return ids;
  },
};

const GENERATE = {
  name: "Generate",
  usage: "deno task generate",
  about: "Greedy continuation of a prompt (--prompt or --prompt-ids, exactly one) on this " +
    "process, or on layers 0:k here and the rest at --next.",
  flags: {
    model: MODEL_FLAG,
    prompt: flag(text("TEXT"), "the prompt, tokenized with the model's tokenizer"),
    "prompt-ids": flag(tokenIds, "the prompt as token ids"),
    n: flag(whole(1), "tokens to generate at most", 32),
    json: switchFlag("print {prompt_ids, ids, text} as JSON instead of the text"),
    "ignore-eos": switchFlag("keep generating past an end-of-sequence token"),
    ctx: flag(whole(1), "positions (default the prompt plus --n, at least 256)"),
    layers: flag(layerRange, "this process's layers, 0:k; needed with --next (default all)"),
    next: flag(address, "the worker serving the layers after --layers"),
    "key-file": flag(text("PATH"), "the wire's shared key (the worker's --key-file)"),
    ...ENGINE_FLAGS,
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof GENERATE.flags>): Promise<void> {
  if ((values.prompt === undefined) === (values["prompt-ids"] === undefined)) {
    throw new UsageError("Give exactly one of --prompt and --prompt-ids");
  }
  if (values.next && !values.layers) {
    throw new UsageError("--next needs --layers 0:k for the local stage");
  }
  const n = values.n;
  const model = await openGguf(values.model);
  const tokenizer = readingFile(model.path, () => TextTokenizer.fromGguf(model.metadata));
  const prompt = values["prompt-ids"] ?? tokenizer.encode(values.prompt!);
  const ctx = values.ctx ?? Math.max(256, prompt.length + n);
  let local: Stage | undefined;
  let next: RemoteStage | undefined;
  try {
    local = await openLocalStage(model, {
      engine: engineChoice(values),
      first: values.layers?.first ?? 0,
      end: values.layers?.end,
      slots: 1,
      ctx,
    });
    if (values.next) {
      const key = values["key-file"] ? await loadKeyFile(values["key-file"]) : undefined;
      next = await connectRemoteStage(values.next, { local, model, key });
    }
    // The server's decode loop: greedy, FUSED_STEPS tokens per readback on a whole-model stage.
    const stopIds = values["ignore-eos"] ? new Set<number>() : undefined;
    const request = greedy(prompt, { maxTokens: n, stopIds });
    const { ids } = await completeOnce({ local, next, tokenizer }, request);
    const text = tokenizer.decode(ids);
    if (values.json) console.log(JSON.stringify({ prompt_ids: prompt, ids, text }));
    else console.log(text);
  } finally {
    next?.close();
    local?.close();
    model.close();
  }
}

if (import.meta.main) await runCommand(GENERATE, main);
