// `deno task demo`: makes the default model if missing, runs a worker (layers 2:4) and a head (0:2)
// on loopback, streams one /v1/messages reply with per-stage timings, then serves until Ctrl-C.

import { LAUNCHER_FLAGS } from "../lib/launch/grants.ts";
import { generateModel, modelFileStem, type ModelSpec } from "./synth/generate_model.ts";
import { type Backend, BACKENDS } from "../engine/open_stage.ts";
import { type RunningHead, startHead } from "../lib/server/head.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  runCommand,
  text,
  whole,
} from "../lib/cli.ts";

const DEMO = {
  name: "Demo",
  usage: "deno task demo",
  about: "Runs a worker (layers 2:4) and a head (0:2) on loopback, streams one reply with " +
    "per-stage timings, then serves until Ctrl-C. Without --model, makes the tiny qwen35moe test " +
    "model in ./models/ (random weights: the reply is gibberish, the plumbing is real).",
  flags: {
    port: flag(whole(0, 65535), "the head's HTTP port; 0 picks a free one", 8080),
    backend: flag(
      oneOf(BACKENDS),
      "the engine (default gpu, falling back to reference when no GPU works)",
    ),
    model: flag(text("PATH"), "a 4-layer GGUF to serve instead of the tiny test model"),
    prompt: flag(text("TEXT"), "the prompt", "Tell me about two machines serving one model."),
    "max-tokens": flag(whole(1), "tokens to generate at most", 48),
  },
} satisfies Command<FlagTable>;

const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname).replace(/\/$/, "");
const DEFAULT_SPEC: ModelSpec = { preset: "tiny", arch: "qwen35moe", quant: "f32", seed: 1 };

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/** The default model's path, generated on first use. */
async function defaultModel(): Promise<string> {
  const path = `${ROOT}/models/${modelFileStem(DEFAULT_SPEC)}.gguf`;
  if (!(await exists(path))) {
    console.log(`Making the default model ${path} (tiny qwen35moe, random weights)…`);
    await Deno.mkdir(`${ROOT}/models`, { recursive: true });
    await generateModel(path, DEFAULT_SPEC);
  }
  return path;
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

interface Worker {
  readonly address: string;
  stop(): Promise<void>;
}

/** Starts worker.ts for layers 2:4; resolves once it listens, rejects with its output if not. */
async function startWorker(model: string, backend: Backend): Promise<Worker> {
  const port = freePort();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      // As `deno task worker` starts it: the role runs under the grant its flags call for.
      ...LAUNCHER_FLAGS,
      `${ROOT}/worker.ts`,
      ...["--model", model, "--layers", "2:4", "--port", String(port), "--slots", "2"],
      ...["--ctx", "4096", "--snapshots", "8", "--backend", backend, "--allow-software-gpu"],
    ],
    stdin: "null",
    stdout: "inherit",
    stderr: "piped",
  }).spawn();
  let output = "";
  const listening = Promise.withResolvers<void>();
  const pumped = (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      output += chunk;
      if (output.includes("listening on")) listening.resolve();
      for (const line of chunk.split("\n")) {
        if (line.startsWith("[worker")) console.error(line);
      }
    }
  })();
  const exited = child.status.then(async (s) => (await pumped, s));
  const early = await Promise.race([listening.promise.then(() => undefined), exited]);
  if (early) throw new Error(`the worker exited with code ${early.code}:\n${output.trim()}`);
  return {
    address: `127.0.0.1:${port}`,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch (e) {
        if (!(e instanceof TypeError)) throw e; // It has exited already.
      }
      await exited;
    },
  };
}

/** Streams one request and prints its text as it arrives; returns the final usage. */
async function streamOnce(url: string, prompt: string, maxTokens: number) {
  const res = await fetch(`${url}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "demo",
      max_tokens: maxTokens,
      temperature: 0,
      stream: true,
      messages: [{ role: "user", content: prompt }],
    }),
  });
  if (!res.ok) throw new Error(`the head answered ${res.status}: ${await res.text()}`);
  let usage: Record<string, number> = {};
  let stop = "";
  let buffer = "";
  const out = new TextEncoder();
  for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let end;
    while ((end = buffer.indexOf("\n\n")) !== -1) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").find((l) => l.startsWith("data: "))?.slice(6);
      if (!data) continue;
      const event = JSON.parse(data);
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") {
        await Deno.stdout.write(out.encode(event.delta.text));
      } else if (event.type === "message_delta") {
        usage = event.usage;
        stop = event.delta.stop_reason;
      } else if (event.type === "error") {
        throw new Error(`the stream failed: ${event.error.message}`);
      }
    }
  }
  return { usage, stop };
}

function ms(value: number | null): string {
  return value === null ? "–" : `${value.toFixed(2)} ms`;
}

async function main(values: FlagValues<typeof DEMO.flags>): Promise<void> {
  const { port } = values;
  const maxTokens = values["max-tokens"];
  let backend: Backend = values.backend ?? "gpu";
  const model = values.model ?? await defaultModel();

  let worker: Worker;
  try {
    worker = await startWorker(model, backend);
  } catch (e) {
    if (backend !== "gpu" || values.backend) throw e;
    console.error(
      `No usable GPU (${(e as Error).message.split("\n").at(-1)}); using the CPU reference`,
    );
    backend = "reference";
    worker = await startWorker(model, backend);
  }
  let head: RunningHead | undefined;
  try {
    head = await startHead({
      model,
      layers: { first: 0, end: 2 },
      next: worker.address,
      port,
      slots: 2,
      ctx: 4096,
      snapshots: 8,
      engine: { backend, allowSoftwareGpu: true },
    });
    console.log(
      `\nTwo stages on loopback (${backend}): head layers 0:2 → worker ${worker.address} layers 2:4`,
    );
    console.log(`\n> ${values.prompt}\n`);
    const t0 = performance.now();
    const { usage, stop } = await streamOnce(head.url, values.prompt, maxTokens);
    const seconds = (performance.now() - t0) / 1000;
    // The prompt is what was computed plus what the prefix cache wrote and read.
    const prompt = usage.input_tokens + (usage.cache_creation_input_tokens ?? 0) +
      (usage.cache_read_input_tokens ?? 0);
    console.log(
      `\n\n[${stop}] ${prompt} prompt + ${usage.output_tokens} generated tokens in ${
        seconds.toFixed(2)
      } s`,
    );
    const health = await head.scheduler.health();
    console.log("Per-stage decode time per token:");
    for (const s of health.stages) {
      const extra = s.lastRttMs === null ? "" : `, last round trip ${ms(s.lastRttMs)}`;
      console.log(`  layers ${s.layers} (${s.where}): ${ms(s.decodeMsPerToken)}${extra}`);
    }
    console.log(`\nThe head is serving at ${head.url} (Ctrl-C stops head and worker). Try:`);
    console.log(
      `  curl -N ${head.url}/v1/messages -H 'content-type: application/json' -d '{"model":"demo",` +
        `"max_tokens":32,"stream":true,"messages":[{"role":"user","content":"Hi"}]}'`,
    );
    const stop2 = Promise.withResolvers<void>();
    Deno.addSignalListener("SIGINT", () => stop2.resolve());
    Deno.addSignalListener("SIGTERM", () => stop2.resolve());
    await stop2.promise;
    console.log("\nStopping…");
  } finally {
    await head?.close();
    await worker.stop();
  }
}

if (import.meta.main) {
  await runCommand(DEMO, main);
  Deno.exit(0);
}
