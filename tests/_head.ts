// Test helpers for the head: a head on the tiny model (CPU reference stages, a free port), SSE
// parsing, JSON posting, /metrics samples. Used by tests/http_*, tests/sdk_*, tests/server_*.

import assert from "node:assert/strict";
import { type HeadOptions, type RunningHead, startHead } from "../lib/server/head.ts";
import type { ProviderChoice } from "../engine/gpu/provider.ts";
import { ignore as noGpu } from "./_gpu.ts";
import { testModel } from "./_models.ts";

/** The model every server test uses: tiny qwen35moe, f32, seed 1. */
export function tinyModel(): Promise<string> {
  return testModel({ arch: "qwen35moe" });
}

export interface TestHead extends RunningHead {
  /** Everything the head logged. */
  readonly lines: string[];
}

/** A head on a free loopback port; reference backend, a 256-position context unless given. */
export async function startTestHead(config: Partial<HeadOptions> = {}): Promise<TestHead> {
  const lines: string[] = [];
  const running = await startHead({
    model: config.model ?? await tinyModel(),
    engine: { backend: "reference" },
    port: 0,
    ctx: 256,
    log: (line) => lines.push(line),
    ...config,
  });
  return { ...running, lines };
}

/** The engines a head test can run on: the CPU reference and the GPU engine (Mesa's in CI). */
export type TestBackend = "reference" | "gpu";

/**
 * Registers `fn` once per backend, the GPU run named so and skipped only where no WebGPU adapter
 * exists. For the tests that prove a path on the GPU engine too; the rest run on the reference.
 */
export function backendTest(
  name: string,
  fn: (options: Partial<HeadOptions>) => Promise<void>,
): void {
  Deno.test(name, () => fn({ engine: { backend: "reference" } }));
  Deno.test({
    name: `${name} (GPU engine)`,
    ignore: noGpu,
    fn: () =>
      fn({
        engine: {
          backend: "gpu",
          gpu: (Deno.env.get("TANDEM_GPU") ?? "builtin") as ProviderChoice,
          allowSoftwareGpu: true,
        },
      }),
  });
}

export interface SseFrame {
  readonly event: string | null;
  readonly data: string;
}

/** Parses an SSE body into frames (comments dropped), as the SDKs' decoders do. */
export function parseSse(text: string): SseFrame[] {
  const frames: SseFrame[] = [];
  for (const block of text.split("\n\n")) {
    let event: string | null = null;
    const data: string[] = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) event = line.slice(7);
      else if (line.startsWith("data: ")) data.push(line.slice(6));
    }
    if (event !== null || data.length) frames.push({ event, data: data.join("\n") });
  }
  return frames;
}

/**
 * A streamed body as comparable text: one line per frame, without what may differ between two
 * runs of the same request (random ids, the creation second, llama.cpp's timings, keep-alive
 * pings).
 */
export function comparableSse(body: string): string {
  return parseSse(body)
    .filter((f) => f.event !== "ping")
    .map((f) =>
      `${f.event}|${f.data}`
        .replace(/"(msg|toolu)_[0-9A-Za-z]{24}"/g, '"$1_ID"')
        .replace(/"chatcmpl-[0-9A-Za-z]{24}"/g, '"chatcmpl-ID"')
        .replace(/"created":\d+/g, '"created":0')
        .replace(/"timings":\{[^}]*\}/g, '"timings":{}')
    )
    .join("\n");
}

/** POSTs `body` as JSON. */
export function post(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** A reply body with its random ids blanked: the only bytes two equal replies may differ in. */
export function withoutIds(body: string): string {
  return body.replace(/"(msg|toolu)_[0-9A-Za-z]{24}"/g, '"$1_ID"');
}

/** The Anthropic reply text of a streamed /v1/messages body. */
export function streamedText(frames: readonly SseFrame[]): string {
  return frames
    .filter((f) => f.event === "content_block_delta")
    .map((f) => JSON.parse(f.data).delta)
    .filter((d) => d.type === "text_delta")
    .map((d) => d.text)
    .join("");
}

/** Waits until `check` holds, polling every 20 ms, at most `ms`. */
export async function waitFor(check: () => boolean | Promise<boolean>, ms = 5000): Promise<void> {
  const until = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > until) throw new Error(`Condition not met within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Reads `res` until its body holds `count` matches of `pattern`, then calls `then` and reads the rest. */
export async function readAround(
  res: Response,
  pattern: RegExp,
  count: number,
  then: () => Promise<void>,
): Promise<string> {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while ((text.match(pattern) ?? []).length < count) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`the stream ended before ${count} ${pattern}:\n${text}`);
    text += value;
  }
  await then();
  for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value;
  return text;
}

/** The value of the first /metrics sample whose line starts with `name` (labels included). */
export function metric(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(name));
  assert.ok(line, `no ${name} in /metrics`);
  return Number(line.split(" ").at(-1));
}

/**
 * `streams` llama.cpp /completion streams at once, each of `tokens` greedy tokens whatever it
 * generates (end of generation ignored), each from its own prompt: their bodies, and every
 * token over the time from the first request to the last stream's end.
 */
export async function concurrentStreams(
  url: string,
  streams: number,
  tokens: number,
): Promise<{ readonly bodies: string[]; readonly tokensPerSecond: number }> {
  const t0 = performance.now();
  const bodies = await Promise.all(
    Array.from({ length: streams }, async (_, i) => {
      const res = await post(`${url}/completion`, {
        prompt: `Story number ${i}:`,
        n_predict: tokens,
        ignore_eos: true,
        temperature: 0,
        seed: 1,
        stream: true,
      });
      assert.equal(res.status, 200);
      return await res.text();
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  return { bodies, tokensPerSecond: streams * tokens / seconds };
}

/**
 * One stream's and two streams' aggregate tokens per second (concurrentStreams), `rounds` times
 * each, alternating, so that load from elsewhere falls on both alike; after one unmeasured round.
 */
export async function streamRates(
  url: string,
  rounds: number,
  tokens: number,
): Promise<{ readonly one: number[]; readonly two: number[] }> {
  await concurrentStreams(url, 2, 4);
  const one: number[] = [];
  const two: number[] = [];
  for (let r = 0; r < rounds; r++) {
    one.push((await concurrentStreams(url, 1, tokens)).tokensPerSecond);
    two.push((await concurrentStreams(url, 2, tokens)).tokensPerSecond);
  }
  return { one, two };
}
