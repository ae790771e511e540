// Reply events → Anthropic stream events: message_start … message_stop, or `error` on failure.
// Between output.ts and sse.ts on the streaming path of POST /v1/messages.

import type { Usage } from "../scheduler/sequence.ts";
import type { ReplyEvent } from "./output.ts";
import type { SseMessage } from "./sse.ts";

/**
 * Anthropic's usage object: the prompt is input_tokens + cache_creation_input_tokens (computed,
 * then written into the prefix cache) + cache_read_input_tokens (restored from it).
 */
export function anthropicUsage(usage: Usage): Record<string, number> {
  return {
    input_tokens: usage.promptTokens - usage.cachedTokens - usage.cacheWriteTokens,
    output_tokens: usage.outputTokens,
    cache_creation_input_tokens: usage.cacheWriteTokens,
    cache_read_input_tokens: usage.cachedTokens,
  };
}

function frame(type: string, body: Record<string, unknown>): SseMessage {
  return { event: type, data: JSON.stringify({ type, ...body }) };
}

export interface MessageInfo {
  readonly id: string;
  readonly model: string;
  readonly requestId: string;
}

/**
 * One SSE frame per Anthropic event, named by `event:` (the SDKs dispatch on it). A thinking
 * block's signature goes out as a signature_delta just before its content_block_stop.
 */
export class AnthropicEventStream extends TransformStream<ReplyEvent, SseMessage> {
  constructor(info: MessageInfo) {
    super({
      transform(e, controller) {
        const send = (type: string, body: Record<string, unknown>) =>
          controller.enqueue(frame(type, body));
        switch (e.type) {
          case "start":
            send("message_start", {
              message: {
                id: info.id,
                type: "message",
                role: "assistant",
                model: info.model,
                content: [],
                stop_reason: null,
                stop_sequence: null,
                usage: anthropicUsage({
                  promptTokens: e.promptTokens,
                  cachedTokens: e.cachedTokens,
                  cacheWriteTokens: e.cacheWriteTokens,
                  outputTokens: 0,
                }),
              },
            });
            send("ping", {});
            return;
          case "block_start": {
            const b = e.block;
            const block = b.type === "text"
              ? { type: "text", text: "" }
              : b.type === "thinking"
              ? { type: "thinking", thinking: "", signature: "" }
              : { type: "tool_use", id: b.id, name: b.name, input: {} };
            send("content_block_start", { index: e.index, content_block: block });
            return;
          }
          case "delta": {
            const delta = e.kind === "text"
              ? { type: "text_delta", text: e.text }
              : e.kind === "thinking"
              ? { type: "thinking_delta", thinking: e.text }
              : { type: "input_json_delta", partial_json: e.text };
            send("content_block_delta", { index: e.index, delta });
            return;
          }
          case "logprobs":
            return; // The Anthropic API has no log-probabilities.
          case "block_stop":
            if (e.signature !== undefined) {
              send("content_block_delta", {
                index: e.index,
                delta: { type: "signature_delta", signature: e.signature },
              });
            }
            send("content_block_stop", { index: e.index });
            return;
          case "end":
            send("message_delta", {
              delta: { stop_reason: e.stopReason, stop_sequence: e.stopSequence },
              usage: anthropicUsage(e.usage),
            });
            send("message_stop", {});
            return;
          case "error":
            controller.enqueue({
              event: "error",
              data: JSON.stringify(e.error.body("anthropic", info.requestId)),
            });
        }
      },
    });
  }
}
