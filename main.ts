// `deno task head`: flags → model, tokenizer, chat template, the local stage (layers 0:k) and the
// link to the next stage → lib/scheduler/ → Deno.serve(lib/server/handler.ts).

import { openGguf } from "./engine/gguf/read.ts";
import { parseShardPath } from "./engine/gguf/format.ts";
import { readHParams } from "./engine/hparams.ts";
import { type Backend, openLocalStage, parseBackend, parseLayers } from "./engine/open_stage.ts";
import { StageLink } from "./lib/scheduler/link.ts";
import { Scheduler } from "./lib/scheduler/scheduler.ts";
import type { SamplingDefaults } from "./lib/server/admit.ts";
import { createHandler } from "./lib/server/handler.ts";
import { PromptBuilder } from "./lib/server/prompt.ts";
import { TextTokenizer } from "./lib/tokenizer/tokenizer.ts";
import { loadKeyFile, modelFingerprint } from "./lib/wire/hello.ts";
import { parseAddress } from "./lib/wire/peer.ts";
import { RemoteStage } from "./lib/wire/remote_stage.ts";
import { parseCommandLine } from "./lib/cli.ts";

const USAGE = `Usage: deno task head --model M.gguf [--layers 0:k --next host:port] [--port 8080]
  [--host 127.0.0.1] [--slots N] [--ctx N] [--queue N] [--snapshots N] [--max-batch N]
  [--api-key-file F] [--max-body-bytes N] [--key-file F] [--temperature T]
  [--temperature-cap T] [--top-k K] [--top-p P] [--model-id NAME]
  [--backend reference|gpu] [--gpu auto|builtin|dawn] [--allow-software-gpu]
Unsplit when --next is absent. --snapshots (prefix cache places) must not exceed the worker's.`;

export interface HeadConfig {
  readonly model: string;
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
  readonly apiKey?: string;
  /** Request bodies beyond this are refused with 413. Default 32 MiB. */
  readonly maxBodyBytes?: number;
  /** The wire's shared key (the worker's --key-file). */
  readonly wireKey?: CryptoKey;
  readonly backend?: Backend;
  readonly gpu?: string;
  readonly allowSoftwareGpu?: boolean;
  readonly sampling?: Partial<SamplingDefaults>;
  readonly modelId?: string;
  readonly pingMs?: number;
  readonly log?: (line: string) => void;
}

export interface RunningHead {
  readonly url: string;
  readonly scheduler: Scheduler;
  /** Stops serving, cancels every sequence and closes the stages and the model. */
  close(): Promise<void>;
}

/** "models/tiny-00001-of-00002.gguf" → "tiny". */
function modelIdOf(path: string): string {
  const stem = parseShardPath(path)?.stem ?? path.replace(/\.gguf$/i, "");
  return stem.slice(stem.lastIndexOf("/") + 1);
}

/** Opens the model and its stages and serves the head until close. */
export async function startHead(config: HeadConfig): Promise<RunningHead> {
  const log = config.log ?? ((line: string) => console.error(`[head] ${line}`));
  const model = await openGguf(config.model);
  const cleanup: (() => void)[] = [() => model.close()];
  try {
    const tokenizer = TextTokenizer.fromGguf(model.metadata);
    const template = model.metadata.get("tokenizer.chat_template");
    if (typeof template !== "string") {
      throw new TypeError(
        `Cannot serve "${config.model}": it has no tokenizer.chat_template, which the chat ` +
          `routes need to build prompts`,
      );
    }
    const hp = readHParams(model.metadata);
    const layers = config.layers ?? { first: 0, end: hp.nLayer };
    if (layers.first !== 0) {
      throw new RangeError(
        `Cannot start the head on layers ${layers.first}:${layers.end}: the head embeds tokens, ` +
          `so its layers start at 0; use --layers 0:${layers.end}`,
      );
    }
    if (config.next && layers.end >= hp.nLayer) {
      throw new RangeError(
        `Cannot use --next with layers 0:${layers.end}: the model has ${hp.nLayer} layers, so ` +
          `nothing is left for the next stage; give --layers 0:k with k < ${hp.nLayer}`,
      );
    }
    if (config.next) parseAddress(config.next);
    const slots = config.slots ?? 1;
    const ctx = config.ctx ?? 4096;
    const snapshots = config.snapshots ?? 0;
    const local = await openLocalStage(model, {
      backend: config.backend ?? parseBackend(undefined),
      gpu: config.gpu,
      allowSoftwareGpu: config.allowSoftwareGpu,
      first: 0,
      end: layers.end,
      slots,
      ctx,
      maxBatch: config.maxBatch,
      snapshots,
    });
    cleanup.push(() => local.close());
    const link = config.next
      ? new StageLink(
        new RemoteStage(config.next, {
          first: local.end,
          nLayer: local.nLayer,
          nEmbd: local.nEmbd,
          slots,
          ctx,
          snapshots,
          fingerprint: await modelFingerprint(model),
        }, { key: config.wireKey, connectTimeoutMs: 3000 }),
        { log },
      )
      : undefined;
    if (link) cleanup.push(() => link.close());
    const scheduler = new Scheduler({
      local,
      link,
      tokenizer,
      slots,
      queue: config.queue ?? 16,
      snapshots,
      log,
    });
    const sampling = config.sampling ?? {};
    const modelId = config.modelId ?? modelIdOf(config.model);
    const handle = createHandler({
      scheduler,
      tokenizer,
      prompts: new PromptBuilder(tokenizer, template),
      modelId,
      defaults: {
        temperature: sampling.temperature ?? 0,
        temperatureCap: sampling.temperatureCap ?? 2,
        topK: sampling.topK ?? 40,
        topP: sampling.topP ?? 1,
      },
      pingMs: config.pingMs ?? 10_000,
      log,
    }, { apiKey: config.apiKey, maxBodyBytes: config.maxBodyBytes });
    const listening = Promise.withResolvers<Deno.NetAddr>();
    const server = Deno.serve({
      hostname: config.host ?? "127.0.0.1",
      port: config.port ?? 8080,
      onListen: (addr) => listening.resolve(addr as Deno.NetAddr),
      onError: (e) => {
        log(`unhandled: ${(e as Error)?.stack ?? e}`);
        return Response.json(
          { type: "error", error: { type: "api_error", message: "Internal server error" } },
          { status: 500 },
        );
      },
    }, handle);
    const addr = await listening.promise;
    const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
    const url = `http://${host}:${addr.port}`;
    const split = link
      ? `layers 0:${layers.end} here, ${layers.end}:${hp.nLayer} at ${config.next}`
      : "unsplit";
    log(
      `serving ${modelId} at ${url}: ${split}; slots ${slots}, ctx ${ctx}, prefix cache ` +
        `${snapshots} places${config.apiKey ? ", API key required" : ""}`,
    );
    if (link) {
      // Lazy: a worker that starts later is fine; this only reports the first contact.
      link.connect().then(
        () => log(`next stage ${config.next} answered`),
        (e) => log(`next stage ${config.next} is not answering yet: ${(e as Error).message}`),
      );
    }
    return {
      url,
      scheduler,
      async close() {
        // Ending the sequences first lets their streams finish, which shutdown waits for.
        await scheduler.close();
        await server.shutdown();
        for (const f of cleanup.reverse()) f();
      },
    };
  } catch (e) {
    for (const f of cleanup.reverse()) f();
    throw e;
  }
}

function fail(message: string): never {
  console.error(`${message}\n${USAGE}`);
  Deno.exit(2);
}

function whole(name: string, text: string | undefined, min: number): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < min) {
    fail(`Cannot use --${name} "${text}": expected a whole number ≥ ${min}`);
  }
  return n;
}

function decimal(name: string, text: string | undefined, min: number, max: number) {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (text.trim() === "" || !Number.isFinite(n) || n < min || n > max) {
    fail(`Cannot use --${name} "${text}": expected a number from ${min} to ${max}`);
  }
  return n;
}

async function readApiKey(path: string): Promise<string> {
  let text: string;
  try {
    text = (await Deno.readTextFile(path)).trim();
  } catch (e) {
    throw new Error(`Cannot read --api-key-file "${path}": ${(e as Error).message}`, { cause: e });
  }
  if (!text) throw new Error(`Cannot use --api-key-file "${path}": it is empty`);
  return text;
}

async function main(): Promise<void> {
  const values = parseCommandLine({
    args: Deno.args,
    options: {
      model: { type: "string" },
      layers: { type: "string" },
      next: { type: "string" },
      host: { type: "string" },
      port: { type: "string", default: "8080" },
      slots: { type: "string" },
      ctx: { type: "string" },
      queue: { type: "string" },
      snapshots: { type: "string" },
      "max-batch": { type: "string" },
      "api-key-file": { type: "string" },
      "max-body-bytes": { type: "string" },
      "key-file": { type: "string" },
      temperature: { type: "string" },
      "temperature-cap": { type: "string" },
      "top-k": { type: "string" },
      "top-p": { type: "string" },
      "model-id": { type: "string" },
      backend: { type: "string" },
      gpu: { type: "string", default: "auto" },
      "allow-software-gpu": { type: "boolean", default: false },
    },
  }, fail);
  if (!values.model) fail("Missing --model");
  if (values.next && !values.layers) fail("--next needs --layers 0:k for the head's own layers");
  const running = await startHead({
    model: values.model,
    layers: values.layers ? parseLayers(values.layers) : undefined,
    next: values.next,
    host: values.host,
    port: whole("port", values.port, 0),
    slots: whole("slots", values.slots, 1),
    ctx: whole("ctx", values.ctx, 1),
    queue: whole("queue", values.queue, 0),
    snapshots: whole("snapshots", values.snapshots, 0),
    maxBatch: whole("max-batch", values["max-batch"], 1),
    apiKey: values["api-key-file"] ? await readApiKey(values["api-key-file"]) : undefined,
    maxBodyBytes: whole("max-body-bytes", values["max-body-bytes"], 1),
    wireKey: values["key-file"] ? await loadKeyFile(values["key-file"]) : undefined,
    backend: parseBackend(values.backend),
    gpu: values.gpu,
    allowSoftwareGpu: values["allow-software-gpu"],
    sampling: {
      temperature: decimal("temperature", values.temperature, 0, 2),
      temperatureCap: decimal("temperature-cap", values["temperature-cap"], 0, 2),
      topK: whole("top-k", values["top-k"], 0),
      topP: decimal("top-p", values["top-p"], 0, 1),
    },
    modelId: values["model-id"],
  });
  const stop = Promise.withResolvers<void>();
  Deno.addSignalListener("SIGINT", () => stop.resolve());
  Deno.addSignalListener("SIGTERM", () => stop.resolve());
  await stop.promise;
  await running.close();
  Deno.exit(0);
}

if (import.meta.main) {
  try {
    await main();
  } catch (e) {
    console.error(`Head stopped: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
