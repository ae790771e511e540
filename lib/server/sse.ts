// Server-sent events → bytes, with keep-alive frames while the stream is silent (queue waits,
// long prefills). The last step of every streaming response (events.ts, openai.ts, completion.ts).

/**
 * One SSE frame: `event:` is what the Anthropic SDKs dispatch on (OpenAI streams omit it); a
 * comment frame is bytes that every client ignores (a keep-alive).
 */
export type SseMessage =
  | { readonly event?: string; readonly data: string }
  | { readonly comment: string };

export interface SseOptions {
  /** Sent after `everyMs` without output, and again each `everyMs`. */
  readonly keepAlive?: { readonly everyMs: number; readonly message: SseMessage };
}

const utf8 = new TextEncoder();

/** The frame's bytes; a multi-line payload becomes several `data:` lines. */
export function encodeSse(message: SseMessage): Uint8Array {
  if ("comment" in message) return utf8.encode(`: ${message.comment}\n\n`);
  const lines = message.data.split("\n").map((line) => `data: ${line}\n`).join("");
  return utf8.encode(`${message.event ? `event: ${message.event}\n` : ""}${lines}\n`);
}

/**
 * @example
 * ```ts
 * const ping = { event: "ping", data: '{"type":"ping"}' };
 * const sse = new SseStream({ keepAlive: { everyMs: 10_000, message: ping } });
 * const body = events.pipeThrough(sse);
 * ```
 */
export class SseStream extends TransformStream<SseMessage, Uint8Array> {
  constructor(options: SseOptions = {}) {
    let timer: ReturnType<typeof setInterval> | undefined;
    let quiet = true;
    const stop = () => clearInterval(timer);
    super({
      start(controller) {
        const keepAlive = options.keepAlive;
        if (!keepAlive) return;
        const bytes = encodeSse(keepAlive.message);
        timer = setInterval(() => {
          if (quiet) controller.enqueue(bytes);
          quiet = true;
        }, keepAlive.everyMs);
      },
      transform(message, controller) {
        quiet = false;
        controller.enqueue(encodeSse(message));
      },
      flush: stop,
      cancel: stop,
    });
  }
}

/** A 200 carrying an SSE body. */
export function sseResponse(body: ReadableStream<Uint8Array>, requestId: string): Response {
  return new Response(body, {
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "request-id": requestId,
    },
  });
}
