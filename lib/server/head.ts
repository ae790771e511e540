// The head assembled: binds its HTTP address, then opens model, tokenizer, chat template, the
// local stage (layers 0:k) and the link to the next stage → lib/scheduler/ → lib/server/handler.ts.

import { modelStem } from "../../engine/gguf/stage_shard.ts";
import { modelPath, type ModelSource } from "../../engine/gguf/model_files.ts";
import { openGguf } from "../../engine/gguf/read.ts";
import { type EngineChoice, openLocalStage } from "../../engine/open_stage.ts";
import { type DraftMode, rewindFor } from "../scheduler/draft.ts";
import { StageLink } from "../scheduler/link.ts";
import { defaultSnapshots } from "../scheduler/prefix_cache.ts";
import { Scheduler } from "../scheduler/scheduler.ts";
import { TokenizerThread } from "../tokenizer/tokenizer_thread.ts";
import { VocabIndex } from "../grammar/token_mask.ts";
import { modelFingerprint } from "../wire/hello.ts";
import { remoteStageAfter } from "../wire/remote_stage.ts";
import { checkChainLink, checkFirstStage } from "../../engine/stage_checks.ts";
import { DEFAULT_CTX, DEFAULT_SLOTS } from "../../engine/stage.ts";
import { DEFAULT_TEMPERATURE, type SamplingDefaults } from "./sampling_defaults.ts";
import { accessLog } from "./access_log.ts";
import { ApiError, errorResponse } from "./api_error.ts";
import { listenError } from "../cli.ts";
import { createHandler } from "./handler.ts";
import { guardHeaders } from "./header_guard.ts";
import { PromptBuilder } from "./prompt.ts";
import { readHeadModel } from "./head_model.ts";

export interface HeadOptions {
  /** A path, or the files a launcher resolved (lib/launch/grants.ts). */
  readonly model: ModelSource;
  /** The local layers; required with `next`, the whole model without it. */
  readonly layers?: { readonly first: number; readonly end: number };
  /** host:port of the worker serving the layers after `layers`. */
  readonly next?: string;
  readonly host?: string;
  /** 0 picks a free port. Default 8080. */
  readonly port?: number;
  readonly slots?: number;
  readonly ctx?: number;
  readonly queue?: number;
  readonly snapshots?: number;
  readonly maxBatch?: number;
  /** Prompt positions a sequence runs per step while others generate (Scheduler). */
  readonly prefillChunk?: number;
  /** How long such a step may take, ms; 0: no budget (Scheduler). */
  readonly prefillStepMs?: number;
  /** Speculative decoding of greedy sequences (Scheduler); default "off". */
  readonly draft?: DraftMode;
  readonly apiKey?: string;
  /** Request bodies beyond this are refused with 413. Default 32 MiB. */
  readonly maxBodyBytes?: number;
  /** Time a connection has to send its request headers; then 408. Default 10 s. */
  readonly headerTimeoutMs?: number;
  /** Origins browsers may call from ("*" for any); none: no CORS headers. */
  readonly corsOrigins?: readonly string[];
  /**
   * Loopback port of the HTTP server behind the header guard; 0 (the default) picks a free one.
   * The launcher picks it, so the head's grant can name it.
   */
  readonly internalPort?: number;
  /** The wire's shared key (the worker's --key-file). */
  readonly wireKey?: CryptoKey;
  /** The engine of the local stage; default the GPU engine on the auto provider. */
  readonly engine?: EngineChoice;
  readonly sampling?: Partial<SamplingDefaults>;
  readonly modelId?: string;
  readonly pingMs?: number;
  /** How long a sequence waits for a failed next stage to come back; default 30 s. */
  readonly restartGraceMs?: number;
  /**
   * How long the next stage may send nothing before it counts as down; default
   * DEFAULT_SILENCE_MS (lib/wire/liveness.ts).
   */
  readonly silenceMs?: number;
  readonly log?: (line: string) => void;
}

export interface RunningHead {
  readonly url: string;
  readonly scheduler: Scheduler;
  /** Stops serving, cancels every sequence and closes the stages and the model. */
  close(): Promise<void>;
}

type Handle = (request: Request) => Response | Promise<Response>;

/**
 * How long a connection to the next stage may take, hello included: a silent worker is seen
 * within it (its kernel accepts the connection, it never answers). Longer than a worker's own
 * wait for its next hop (lib/wire/stage_worker.ts), whose refusal then names that hop.
 */
const CONNECT_MS = 3000;

/** Until the model is loaded every request is told to come back, as llama.cpp's server does. */
const loading: Handle = () =>
  errorResponse(
    new ApiError("stage_unavailable", "The model is still loading; retry in a few seconds", {
      retryAfter: 5,
    }),
    "anthropic",
    "req_loading",
  );

/**
 * Binds host:port first (so a busy port fails before minutes of weight loading), then opens the
 * model and its stages and serves the head until close.
 */
export async function startHead(options: HeadOptions): Promise<RunningHead> {
  const log = options.log ?? ((line: string) => console.error(`[head] ${line}`));
  let handle: Handle = loading;
  const hostname = options.host ?? "127.0.0.1";
  const port = options.port ?? 8080;
  let listener: Deno.Listener<Deno.TcpConn>;
  try {
    listener = Deno.listen({ hostname, port });
  } catch (e) {
    throw listenError(hostname, port, e, "--host/--port");
  }
  // Deno.serve has no header timeout: it listens on loopback behind a guard that gives every
  // connection headerTimeoutMs for its request head.
  const listening = Promise.withResolvers<Deno.NetAddr>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: options.internalPort ?? 0,
    onListen: (addr) => listening.resolve(addr as Deno.NetAddr),
    onError: (e) => {
      log(`unhandled: ${(e as Error)?.stack ?? e}`);
      return Response.json(
        { type: "error", error: { type: "api_error", message: "Internal server error" } },
        { status: 500 },
      );
    },
  }, (request) => handle(request));
  const guard = guardHeaders({
    listener,
    upstream: await listening.promise,
    headerTimeoutMs: options.headerTimeoutMs ?? 10_000,
    log,
  });
  const shutdown = async () => {
    guard.close();
    await server.shutdown();
    await guard.finished;
  };
  const addr = listener.addr as Deno.NetAddr;
  const cleanup: (() => void)[] = [];
  try {
    const model = await openGguf(options.model);
    cleanup.push(() => model.close());
    const { tokenizer, template, hp } = readHeadModel(model);
    // Grammars walk the vocabulary sorted bytewise: sort it now, not inside a first request.
    VocabIndex.of(tokenizer);
    const layers = options.layers ?? { first: 0, end: hp.nLayer };
    // Checked before the weights load; the scheduler checks the opened stages again.
    checkFirstStage(layers);
    checkChainLink(
      { ...layers, nLayer: hp.nLayer },
      options.next ? { first: layers.end } : undefined,
    );
    const slots = options.slots ?? DEFAULT_SLOTS;
    const ctx = options.ctx ?? DEFAULT_CTX;
    const snapshots = options.snapshots ?? defaultSnapshots(ctx, slots);
    const local = await openLocalStage(model, {
      hp,
      engine: options.engine ?? { backend: "gpu" },
      first: 0,
      end: layers.end,
      slots,
      ctx,
      maxBatch: options.maxBatch,
      snapshots,
      maxRewind: rewindFor(options.draft ?? "off"),
      // Drafts come from the model's own MTP head where the local stage can run it.
      mtp: (options.draft ?? "off") !== "off",
    });
    cleanup.push(() => local.close());
    const link = options.next
      ? new StageLink(
        remoteStageAfter(options.next, local, await modelFingerprint(model), {
          key: options.wireKey,
          connectTimeoutMs: CONNECT_MS,
          silenceMs: options.silenceMs,
        }),
        { log },
      )
      : undefined;
    if (link) cleanup.push(() => link.close());
    const prompts = await TokenizerThread.start(model.metadata, template);
    cleanup.push(() => prompts.close());
    const access = accessLog(log);
    const scheduler = new Scheduler({
      local,
      link,
      tokenizer,
      slots,
      queue: options.queue ?? 16,
      snapshots,
      restartGraceMs: options.restartGraceMs,
      prefillChunk: options.prefillChunk,
      prefillStepMs: options.prefillStepMs,
      draft: options.draft,
      log,
      onAdmit: access.onAdmit,
    });
    const sampling = options.sampling ?? {};
    const modelId = options.modelId ?? modelStem(modelPath(options.model));
    handle = access.wrap(createHandler({
      scheduler,
      tokenizer,
      prompts: new PromptBuilder(prompts, ctx),
      chatTemplate: template,
      modelId,
      defaults: {
        temperature: sampling.temperature ?? DEFAULT_TEMPERATURE,
        temperatureCap: sampling.temperatureCap ?? 2,
        topK: sampling.topK ?? 40,
        topP: sampling.topP ?? 1,
      },
      pingMs: options.pingMs ?? 10_000,
      log,
    }, {
      apiKey: options.apiKey,
      maxBodyBytes: options.maxBodyBytes,
      corsOrigins: options.corsOrigins,
    }));
    const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
    const url = `http://${host}:${addr.port}`;
    const split = link
      ? `layers 0:${layers.end} here, ${layers.end}:${hp.nLayer} at ${options.next}`
      : "unsplit";
    // Where drafts come from: the last stage's MTP block (here, or over the link once it
    // answers), else prompt lookup.
    const draft = options.draft ?? "off";
    const drafting = draft === "off"
      ? ""
      : `, drafts ${draft} (${
        local.draft
          ? "the MTP head"
          : link
          ? "the last worker's MTP head if it has one, else prompt lookup"
          : "prompt lookup"
      })`;
    log(
      `serving ${modelId} at ${url}: ${split}; slots ${slots}, ctx ${ctx}, prefix cache ` +
        `${snapshots} places${drafting}${options.apiKey ? ", API key required" : ""}`,
    );
    if (link) {
      // Lazy: a worker that starts later is fine; this only reports the first contact.
      link.connect().then(
        () => log(`next stage ${options.next} answered`),
        (e) => log(`next stage ${options.next} is not answering yet: ${(e as Error).message}`),
      );
    }
    return {
      url,
      scheduler,
      async close() {
        // Ending the sequences first lets their streams finish, which shutdown waits for.
        await scheduler.close();
        await shutdown();
        for (const f of cleanup.reverse()) f();
      },
    };
  } catch (e) {
    await shutdown();
    for (const f of cleanup.reverse()) f();
    throw e;
  }
}
