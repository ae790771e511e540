// One access-log line per HTTP request of the head: time, route, status, and for generations the
// tokens in/out, prefix-cache tokens, time to first token and a sampled reply's seed. Wraps
// lib/server/handler.ts's handle.

import { AsyncLocalStorage } from "node:async_hooks";
import type { Sequence } from "../scheduler/sequence.ts";

type Handle = (request: Request) => Promise<Response>;

export interface AccessLog {
  /** The scheduler's onAdmit: ties each sequence to the request whose handler admitted it. */
  readonly onAdmit: (sequence: Sequence) => void;
  /** `handle`, logging one line when each response has been sent (or abandoned). */
  wrap(handle: Handle): Handle;
}

/**
 * `2026-12-01T15:04:05.678Z POST /v1/messages 200 in=12 cached=8 out=32 ttft=41ms 903ms end_turn`,
 * then `temperature=0.7 seed=…` when the reply was sampled; a request that generated nothing has
 * no token fields.
 */
export function formatAccessLine(
  at: Date,
  request: Request,
  status: number,
  ms: number,
  sequences: readonly Sequence[],
): string {
  const path = new URL(request.url).pathname;
  const parts = [at.toISOString(), request.method, path, String(status)];
  if (sequences.length > 0) {
    const sum = (f: (s: Sequence) => number) => sequences.reduce((t, s) => t + f(s), 0);
    const firsts = sequences.map((s) => s.firstTokenMs).filter((t) => t !== null);
    parts.push(
      `in=${sum((s) => s.request.prompt.length)}`,
      `cached=${sum((s) => s.cachedTokens)}`,
      `out=${sum((s) => s.outputTokens)}`,
      `ttft=${firsts.length ? `${Math.min(...firsts).toFixed(0)}ms` : "-"}`,
    );
  }
  parts.push(`${ms.toFixed(0)}ms`);
  const outcomes = [...new Set(sequences.map((s) => s.outcome ?? "running"))];
  if (outcomes.length) parts.push(outcomes.join(","));
  // A sampled reply is replayed by its seed (random unless the request set one).
  for (const { temperature, seed } of sequences.map((s) => s.request.sampling)) {
    if (temperature > 0) parts.push(`temperature=${temperature}`, `seed=${seed}`);
  }
  return parts.join(" ");
}

/** Settles when the sequence has ended (its signal aborts then, whatever the reason). */
function ended(sequence: Sequence): Promise<void> {
  const { signal } = sequence;
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}

export function accessLog(log: (line: string) => void): AccessLog {
  const current = new AsyncLocalStorage<Sequence[]>();
  return {
    onAdmit: (sequence) => current.getStore()?.push(sequence),
    wrap: (handle) => async (request) => {
      const at = new Date();
      const start = performance.now();
      const sequences: Sequence[] = [];
      const response = await current.run(sequences, () => handle(request));
      const done = () =>
        log(formatAccessLine(at, request, response.status, performance.now() - start, sequences));
      if (response.body === null) {
        done();
        return response;
      }
      // A streamed body is logged when it ends: sent in full, failed, or cancelled by the client
      // (after the cancel has reached its sequences, so that they show as cancelled).
      const reader = response.body.getReader();
      // Cancelling the reader also ends a pending read, which must not log before the cancel.
      let cancelled = false;
      const relay = new ReadableStream<Uint8Array>({
        async pull(controller) {
          try {
            const chunk = await reader.read();
            if (!chunk.done) return controller.enqueue(chunk.value);
            controller.close();
          } catch (e) {
            controller.error(e);
          }
          if (!cancelled) done();
        },
        async cancel(reason) {
          cancelled = true;
          await reader.cancel(reason);
          await Promise.all(sequences.map(ended));
          done();
        },
      }, { highWaterMark: 0 });
      return new Response(relay, response);
    },
  };
}
