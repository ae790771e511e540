// `deno task head` and tandem-head: flags (lib/cli.ts) → the grant they call for (lib/launch/) →
// lib/server/head.ts (model, stages, scheduler, HTTP) until SIGINT/SIGTERM.

import {
  address,
  type Command,
  decimal,
  ENGINE_FLAGS,
  engineChoice,
  flag,
  type FlagTable,
  type FlagValues,
  isLoopback,
  layerRange,
  listOf,
  MODEL_FLAG,
  SILENCE_FLAG,
  switchFlag,
  text,
  UsageError,
  whole,
} from "./lib/cli.ts";
import { DEFAULT_CTX, DEFAULT_MAX_BATCH, DEFAULT_SLOTS } from "./engine/stage.ts";
import { DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_STEP_MS } from "./lib/scheduler/scheduler.ts";
import { AUTO_DRAFTS, DRAFT_MODE } from "./lib/scheduler/draft.ts";
import { describePath, type ResolvedPath } from "./engine/gguf/model_files.ts";
import type { RoleFiles } from "./lib/launch/grants.ts";
import { freeLoopbackPort, runRole } from "./lib/launch/launch.ts";
import { startHead } from "./lib/server/head.ts";
import { loadKeyFile } from "./lib/wire/hello.ts";

export const HEAD = {
  name: "Head",
  usage: "deno task head",
  about: "Serves the Anthropic (/v1/messages), OpenAI (/v1/chat/completions, /v1/completions) " +
    "and llama.cpp (/completion, /tokenize, /props, ...) APIs for one model: the whole model " +
    "here, or layers 0:k here and the rest at --next (a worker). docs/API_FIELDS.md lists every " +
    "route and request field.",
  flags: {
    model: MODEL_FLAG,
    layers: flag(layerRange, "this process's layers, 0:k; needed with --next (default all)"),
    next: flag(address, "the worker serving the layers after --layers"),
    host: flag(text("HOST"), "the HTTP listen address", "127.0.0.1"),
    port: flag(whole(0, 65535), "the HTTP port; 0 picks a free one", 8080),
    slots: flag(whole(1), "sequences decoded at once (they share each step)", DEFAULT_SLOTS),
    ctx: flag(whole(1), "positions per slot (prompt + reply)", DEFAULT_CTX),
    queue: flag(whole(0), "requests that may wait for a slot before 529/429", 16),
    snapshots: flag(
      whole(0),
      "prefix-cache places; must not exceed the worker's; 0 turns the cache off (default " +
        "slots × 1..4, four while they hold at most 32768 positions per slot)",
    ),
    "max-batch": flag(
      whole(1),
      `positions per prefill chunk (default ${DEFAULT_MAX_BATCH}, or the context if shorter; fewer take less activation memory and shorter steps beside other slots' decode)`,
    ),
    "prefill-chunk": flag(
      whole(1),
      "prompt positions a sequence runs per step while others generate (shorter: their tokens " +
        "wait less; default " + DEFAULT_PREFILL_CHUNK + ")",
    ),
    "prefill-step-ms": flag(
      decimal(0, 60_000),
      "how long a step holding a prompt chunk may take while others generate: deep in a long " +
        "prompt its chunks shrink to fit, the others' tokens wait less and its first token " +
        "comes later (default " + DEFAULT_PREFILL_STEP_MS + ": no limit)",
    ),
    draft: flag(
      DRAFT_MODE,
      "speculative decoding of requests without grammar, logprobs or penalties: tokens looked " +
        "up in the sequence verified " +
        `in one run a step; auto (${AUTO_DRAFTS} a step while they pay and the request runs ` +
        "alone) or N a step; workers need --rewind drafts + 1",
      "off",
    ),
    "api-key-file": flag(text("PATH"), "a file holding the API key clients must send"),
    "max-body-bytes": flag(whole(1), "larger request bodies get 413", 32 * 1024 * 1024),
    "header-timeout": flag(decimal(0.1, 3600), "seconds a client has to send its headers", 10),
    "internal-port": flag(
      whole(0, 65535),
      "the loopback port of the HTTP server behind the header guard; 0 picks a free one",
      0,
    ),
    insecure: switchFlag("serve a non-loopback --host without --api-key-file"),
    "key-file": flag(text("PATH"), "the wire's shared key (the worker's --key-file)"),
    "cors-origin": flag(
      listOf(text("ORIGIN")),
      "origins browsers may call from, or *; sends CORS headers and answers preflights " +
        "(default none)",
    ),
    temperature: flag(decimal(0, 2), "used when a request sets none; 0 is greedy", 1),
    "temperature-cap": flag(decimal(0, 2), "requests asking for more are clamped to this", 2),
    "top-k": flag(whole(0), "used when a request sets none", 40),
    "top-p": flag(decimal(0, 1), "used when a request sets none", 1),
    "model-id": flag(text("NAME"), "the model id the APIs report (default the file's stem)"),
    "restart-grace-s": flag(
      decimal(0, 3600),
      "seconds a stream waits for a failed worker to come back, then resumes or fails",
      30,
    ),
    "silence-s": SILENCE_FLAG,
    ...ENGINE_FLAGS,
  },
} satisfies Command<FlagTable>;

async function readApiKey(file: ResolvedPath): Promise<string> {
  const named = `--api-key-file "${describePath(file)}"`;
  let text: string;
  try {
    text = (await Deno.readTextFile(file.resolved)).trim();
  } catch (e) {
    throw new Error(`Cannot read ${named}: ${(e as Error).message}`, { cause: e });
  }
  if (!text) throw new Error(`Cannot use ${named}: it is empty`);
  return text;
}

/**
 * The head's values and what its grant follows: its HTTP server sits on a loopback port behind
 * the header guard, so the launcher picks that port now and the grant names only it; its
 * tokenizer runs in a thread whose modules Deno reads when the head starts it.
 */
export function prepareHead(flags: FlagValues<typeof HEAD.flags>) {
  const values = { ...flags, "internal-port": flags["internal-port"] || freeLoopbackPort() };
  return { values, touches: { ...values, internal: values["internal-port"], threads: true } };
}

/**
 * The head's life in its role thread: serve until SIGINT or SIGTERM. It reads the model and the
 * keys as `files` resolved them.
 */
export async function serveHead(
  flags: FlagValues<typeof HEAD.flags>,
  files: RoleFiles,
): Promise<void> {
  if (flags.next && !flags.layers) {
    throw new UsageError("--next needs --layers 0:k for the head's own layers");
  }
  if (!isLoopback(flags.host) && !flags["api-key-file"] && !flags.insecure) {
    throw new UsageError(
      `Cannot serve on ${flags.host} without an API key: pass --api-key-file F (clients send ` +
        `it as x-api-key) or --insecure to serve anyone who can reach the port`,
    );
  }
  const apiKeyFile = files["api-key-file"];
  const wireKeyFile = files["key-file"];
  const running = await startHead({
    model: files.model,
    layers: flags.layers,
    next: flags.next,
    host: flags.host,
    port: flags.port,
    slots: flags.slots,
    ctx: flags.ctx,
    queue: flags.queue,
    snapshots: flags.snapshots,
    maxBatch: flags["max-batch"],
    prefillChunk: flags["prefill-chunk"],
    prefillStepMs: flags["prefill-step-ms"],
    draft: flags.draft,
    apiKey: apiKeyFile ? await readApiKey(apiKeyFile) : undefined,
    maxBodyBytes: flags["max-body-bytes"],
    headerTimeoutMs: flags["header-timeout"] * 1000,
    internalPort: flags["internal-port"],
    corsOrigins: flags["cors-origin"],
    wireKey: wireKeyFile ? await loadKeyFile(wireKeyFile.resolved) : undefined,
    engine: engineChoice(flags),
    sampling: {
      temperature: flags.temperature,
      temperatureCap: flags["temperature-cap"],
      topK: flags["top-k"],
      topP: flags["top-p"],
    },
    modelId: flags["model-id"],
    restartGraceMs: flags["restart-grace-s"] * 1000,
    silenceMs: flags["silence-s"] * 1000,
  });
  const stop = Promise.withResolvers<void>();
  Deno.addSignalListener("SIGINT", () => stop.resolve());
  Deno.addSignalListener("SIGTERM", () => stop.resolve());
  await stop.promise;
  await running.close();
}

if (import.meta.main) {
  await runRole("head", HEAD, import.meta.url, prepareHead, serveHead);
}
