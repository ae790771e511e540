// `deno task worker`: one pipeline stage served over TCP (lib/wire/), optionally chained to --next.
// Flags → model → its layers (engine/open_stage.ts) → lib/wire/stage_server.ts until SIGINT/SIGTERM.

import { parseArgs } from "node:util";
import { openGguf } from "./engine/gguf/read.ts";
import { type Backend, openLocalStage, parseBackend, parseLayers } from "./engine/open_stage.ts";
import type { Stage } from "./engine/stage.ts";
import { hex, loadKeyFile, modelFingerprint } from "./lib/wire/hello.ts";
import { parseAddress } from "./lib/wire/peer.ts";
import { RemoteStage } from "./lib/wire/remote_stage.ts";
import { serveStage } from "./lib/wire/stage_server.ts";

const USAGE = `Usage: deno task worker --model M.gguf --layers a:b --port P [--host H]
  [--slots N] [--ctx N] [--max-batch N] [--snapshots N] [--next host:port]
  [--key-file F | --insecure] [--backend reference|gpu] [--gpu auto|builtin|dawn]
Binds 127.0.0.1 unless --host is given; any other address needs --key-file or --insecure.
Permissions: see docs/WIRE.md (net: the listen address and --next only; read: the model files).`;

function fail(message: string): never {
  console.error(`${message}\n${USAGE}`);
  Deno.exit(2);
}

function whole(name: string, text: string, min: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < min) {
    fail(`Cannot use --${name} "${text}": expected a whole number ≥ ${min}`);
  }
  return n;
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

function parseFlags() {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      model: { type: "string" },
      layers: { type: "string" },
      port: { type: "string" },
      host: { type: "string", default: "127.0.0.1" },
      slots: { type: "string", default: "1" },
      ctx: { type: "string", default: "4096" },
      "max-batch": { type: "string" },
      snapshots: { type: "string", default: "0" },
      next: { type: "string" },
      "key-file": { type: "string" },
      insecure: { type: "boolean", default: false },
      backend: { type: "string" },
      gpu: { type: "string", default: "auto" },
      "allow-software-gpu": { type: "boolean", default: false },
    },
  });
  if (!values.model) fail("Missing --model");
  if (!values.layers) fail("Missing --layers");
  if (!values.port) fail("Missing --port");
  const layers = parseLayers(values.layers);
  if (layers.first === 0) {
    fail(
      `Cannot serve layers ${values.layers} on a worker: layer 0 embeds token ids, which the ` +
        `head does; start the worker at the layer where the previous stage ends`,
    );
  }
  if (!isLoopback(values.host) && !values["key-file"] && !values.insecure) {
    fail(
      `Cannot listen on ${values.host} without a key: pass --key-file F (a shared secret, see ` +
        `docs/WIRE.md) or --insecure to serve anyone who can reach the port`,
    );
  }
  return {
    model: values.model,
    layers,
    port: whole("port", values.port, 1),
    host: values.host,
    slots: whole("slots", values.slots, 1),
    ctx: whole("ctx", values.ctx, 1),
    maxBatch: values["max-batch"] === undefined
      ? undefined
      : whole("max-batch", values["max-batch"], 1),
    snapshots: whole("snapshots", values.snapshots, 0),
    next: values.next,
    keyFile: values["key-file"],
    backend: parseBackend(values.backend),
    gpu: values.gpu,
    allowSoftwareGpu: values["allow-software-gpu"],
  };
}

/**
 * The reference backend needs no FFI and no environment, so a worker started with them (as
 * `deno task worker` is) drops both; net and read cannot be narrowed at run time, so a broad
 * grant of those is only reported.
 */
async function narrowPermissions(backend: Backend, log: (line: string) => void): Promise<void> {
  if (backend === "reference") {
    await Deno.permissions.revoke({ name: "ffi" });
    await Deno.permissions.revoke({ name: "env" });
  }
  const broad: string[] = [];
  for (const name of ["net", "read"] as const) {
    if ((await Deno.permissions.query({ name })).state === "granted") broad.push(`--allow-${name}`);
  }
  if (broad.length > 0) {
    log(
      `running with unrestricted ${broad.join(" and ")}; docs/WIRE.md shows the command that ` +
        `limits them to this worker's address, next hop and model files`,
    );
  }
}

async function main(): Promise<void> {
  const flags = parseFlags();
  if (flags.next) parseAddress(flags.next);
  const key = flags.keyFile ? await loadKeyFile(flags.keyFile) : undefined;
  const model = await openGguf(flags.model);
  let stage: Stage | undefined;
  try {
    stage = await openLocalStage(model, {
      backend: flags.backend,
      gpu: flags.gpu,
      allowSoftwareGpu: flags.allowSoftwareGpu,
      first: flags.layers.first,
      end: flags.layers.end,
      slots: flags.slots,
      ctx: flags.ctx,
      maxBatch: flags.maxBatch,
      snapshots: flags.snapshots,
    });
    const fingerprint = await modelFingerprint(model);
    const next = flags.next
      ? new RemoteStage(flags.next, {
        first: stage.end,
        nLayer: stage.nLayer,
        nEmbd: stage.nEmbd,
        slots: stage.slots,
        ctx: stage.ctx,
        snapshots: stage.snapshots,
        fingerprint,
      }, { key })
      : undefined;
    const range = `${stage.first}..${stage.end}`;
    const log = (line: string) => console.error(`[worker ${range}] ${line}`);
    await narrowPermissions(flags.backend, log);
    const listener = Deno.listen({ hostname: flags.host, port: flags.port });
    const server = serveStage(listener, { stage, fingerprint, key, next, log });
    const stop = () => server.close();
    Deno.addSignalListener("SIGINT", stop);
    Deno.addSignalListener("SIGTERM", stop);
    const i = server.info;
    log(
      `listening on ${flags.host}:${flags.port}: layers ${range} of ${i.nLayer}` +
        `${next ? `, then ${next.address}` : ""}; n_embd ${i.nEmbd}, slots ${i.slots}, ` +
        `ctx ${i.ctx}, max batch ${i.maxBatch}, fingerprint ${hex(fingerprint).slice(0, 16)}, ` +
        `${key ? "key required" : "no key"}`,
    );
    await server.finished;
    next?.close();
  } finally {
    stage?.close();
    model.close();
  }
}

if (import.meta.main) {
  try {
    await main();
  } catch (e) {
    console.error(`Worker stopped: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
