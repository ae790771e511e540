// `deno task worker` and tandem-worker: one pipeline stage served over TCP, optionally chained to
// --next. Flags (lib/cli.ts) → the grant they call for (lib/launch/) → lib/wire/stage_worker.ts
// (bind, open the layers, serve) until SIGINT/SIGTERM.

import {
  address,
  type Command,
  ENGINE_FLAGS,
  engineChoice,
  flag,
  type FlagTable,
  type FlagValues,
  isLoopback,
  layerRange,
  MODEL_FLAG,
  requiredFlag,
  SILENCE_FLAG,
  switchFlag,
  text,
  UsageError,
  whole,
} from "./lib/cli.ts";
import { DEFAULT_CTX, DEFAULT_MAX_BATCH, DEFAULT_SLOTS } from "./engine/stage.ts";
import type { RoleFiles } from "./lib/launch/grants.ts";
import { runRole } from "./lib/launch/launch.ts";
import { loadKeyFile } from "./lib/wire/hello.ts";
import { defaultSnapshots } from "./lib/scheduler/prefix_cache.ts";
import { startWorker } from "./lib/wire/stage_worker.ts";

export const WORKER = {
  name: "Worker",
  usage: "deno task worker",
  about: "Serves layers a:b of a model to the stage before it (the head or another worker) over " +
    "the stage wire protocol. Binds 127.0.0.1 unless --host is given; any other address needs " +
    "--key-file or --insecure. It may reach only its listen address and --next and read only " +
    "--model and --key-file (docs/DEPLOY.md).",
  flags: {
    model: MODEL_FLAG,
    layers: requiredFlag(layerRange, "the layers served here, a:b with a > 0"),
    port: requiredFlag(whole(0, 65535), "the TCP port; 0 picks a free one"),
    host: flag(text("HOST"), "the listen address", "127.0.0.1"),
    slots: flag(whole(1), "sequences decoded at once; at least the head's", DEFAULT_SLOTS),
    ctx: flag(whole(1), "positions per slot; at least the head's", DEFAULT_CTX),
    "max-batch": flag(
      whole(1),
      `positions per frame (default ${DEFAULT_MAX_BATCH}, or the context if shorter)`,
    ),
    snapshots: flag(
      whole(0),
      "prefix-cache places; at least the head's (default sized as the head's from --ctx and " +
        "--slots)",
    ),
    rewind: flag(
      whole(0),
      "positions of a speculative step's verify run this worker keeps to rewind; at least " +
        "the head's (its drafts + 1)",
      0,
    ),
    mtp: switchFlag(
      "draft speculative steps with the file's MTP block, on the last stage (the head's --draft " +
        "then takes its drafts; costs the block's weights and a KV cache a slot)",
    ),
    next: flag(address, "the worker serving the layers after these"),
    "silence-s": SILENCE_FLAG,
    "key-file": flag(text("PATH"), "the wire's shared key, a secret file (docs/WIRE.md)"),
    insecure: switchFlag("listen on a non-loopback address without a key"),
    ...ENGINE_FLAGS,
  },
} satisfies Command<FlagTable>;

/**
 * The worker's life in its role thread: serve until SIGINT or SIGTERM. It reads the model and the
 * key as `files` resolved them.
 */
export async function serveWorker(
  flags: FlagValues<typeof WORKER.flags>,
  files: RoleFiles,
): Promise<void> {
  const { layers, host } = flags;
  if (layers.first === 0) {
    throw new UsageError(
      `Cannot serve layers ${layers.first}:${layers.end} on a worker: layer 0 embeds token ` +
        `ids, which the head does; start the worker at the layer where the previous stage ends`,
    );
  }
  if (!isLoopback(host) && !flags["key-file"] && !flags.insecure) {
    throw new UsageError(
      `Cannot listen on ${host} without a key: pass --key-file F (a shared secret, see ` +
        `docs/WIRE.md) or --insecure to serve anyone who can reach the port`,
    );
  }
  const keyFile = files["key-file"];
  const key = keyFile ? await loadKeyFile(keyFile.resolved) : undefined;
  const log = (line: string) => console.error(`[worker ${layers.first}..${layers.end}] ${line}`);
  const worker = await startWorker({
    model: files.model,
    layers,
    host,
    port: flags.port,
    slots: flags.slots,
    ctx: flags.ctx,
    maxBatch: flags["max-batch"],
    snapshots: flags.snapshots ?? defaultSnapshots(flags.ctx, flags.slots),
    maxRewind: flags.rewind,
    mtp: flags.mtp,
    next: flags.next,
    silenceMs: flags["silence-s"] * 1000,
    key,
    engine: engineChoice(flags),
    log,
  });
  Deno.addSignalListener("SIGINT", worker.close);
  Deno.addSignalListener("SIGTERM", worker.close);
  await worker.finished;
}

if (import.meta.main) {
  await runRole(
    "worker",
    WORKER,
    import.meta.url,
    (flags) => ({ values: flags, touches: flags }),
    serveWorker,
  );
}
