// A worker assembled: binds its TCP address, then opens the model and its layers
// (engine/open_stage.ts), the next hop if any, and serves them with lib/wire/stage_server.ts.

import type { ModelSource } from "../../engine/gguf/model_files.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import { type EngineChoice, openLocalStage } from "../../engine/open_stage.ts";
import type { Stage } from "../../engine/stage.ts";
import { listenError } from "../cli.ts";
import type { HelloInfo } from "./frame.ts";
import { hex, modelFingerprint } from "./hello.ts";
import { type RemoteStage, remoteStageAfter } from "./remote_stage.ts";
import { serveStage } from "./stage_server.ts";

export interface WorkerOptions {
  /** A path, or the files a launcher resolved (lib/launch/grants.ts). */
  readonly model: ModelSource;
  readonly layers: { readonly first: number; readonly end: number };
  readonly host: string;
  /** 0 picks a free port. */
  readonly port: number;
  readonly slots: number;
  readonly ctx: number;
  readonly maxBatch?: number;
  readonly snapshots: number;
  /** Positions of a rewindable run it keeps (engine/stage.ts maxRewind); default 0. */
  readonly maxRewind?: number;
  /** Draft with the model's MTP block, on the last stage of a file that has one. */
  readonly mtp?: boolean;
  /** host:port of the worker serving the layers after these. */
  readonly next?: string;
  /** How long `next` may send nothing before it counts as down; default DEFAULT_SILENCE_MS. */
  readonly silenceMs?: number;
  /** The wire's shared key: clients must prove they hold it, and so must `next`. */
  readonly key?: CryptoKey;
  readonly engine: EngineChoice;
  readonly log: (line: string) => void;
}

export interface RunningWorker {
  /** What HELLO tells clients. */
  readonly info: HelloInfo;
  /** host:port it listens on. */
  readonly address: string;
  /** Settles once close() has run and the last client is gone. */
  readonly finished: Promise<void>;
  /** Stops listening, drops the current client, closes the stage and the model. */
  close(): void;
}

/**
 * How long this worker's hello may wait for its next hop's. Shorter than the head's own wait
 * (lib/server/head.ts), so that while a hop behind this worker is silent the head hears this
 * worker's refusal, which names that hop, instead of timing out on this worker.
 */
const NEXT_CONNECT_MS = 2000;

/**
 * Binds host:port first (so a busy port fails before the weights load), then serves the stage.
 * Clients that connect while it loads wait in the listen backlog.
 */
export async function startWorker(options: WorkerOptions): Promise<RunningWorker> {
  const { log } = options;
  let listener: Deno.TcpListener;
  try {
    listener = Deno.listen({ hostname: options.host, port: options.port });
  } catch (e) {
    throw listenError(options.host, options.port, e, "--host/--port");
  }
  const model = await openGguf(options.model).catch((e) => {
    listener.close();
    throw e;
  });
  let stage: Stage | undefined;
  let next: RemoteStage | undefined;
  try {
    stage = await openLocalStage(model, {
      engine: options.engine,
      ...options.layers,
      slots: options.slots,
      ctx: options.ctx,
      maxBatch: options.maxBatch,
      snapshots: options.snapshots,
      maxRewind: options.maxRewind,
      mtp: options.mtp,
    });
    const fingerprint = await modelFingerprint(model);
    next = options.next
      ? remoteStageAfter(options.next, stage, fingerprint, {
        key: options.key,
        silenceMs: options.silenceMs,
        connectTimeoutMs: NEXT_CONNECT_MS,
      })
      : undefined;
    const server = serveStage(listener, { stage, fingerprint, key: options.key, next, log });
    const { hostname, port } = listener.addr;
    const i = server.info;
    log(
      `listening on ${hostname}:${port}: layers ${stage.first}..${stage.end} of ${i.nLayer}` +
        `${next ? `, then ${next.address}` : ""}; n_embd ${i.nEmbd}, slots ${i.slots}, ` +
        `ctx ${i.ctx}, max batch ${i.maxBatch}, fingerprint ${hex(fingerprint).slice(0, 16)}, ` +
        `${options.key ? "key required" : "no key"}`,
    );
    const opened = { stage, next };
    const finished = server.finished.finally(() => {
      opened.next?.close();
      opened.stage.close();
      model.close();
    });
    return {
      info: i,
      address: `${hostname.includes(":") ? `[${hostname}]` : hostname}:${port}`,
      finished,
      close: () => server.close(),
    };
  } catch (e) {
    next?.close();
    stage?.close();
    model.close();
    listener.close();
    throw e;
  }
}
