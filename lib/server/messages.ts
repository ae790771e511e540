// POST /v1/messages and /v1/messages/count_tokens: Anthropic request body → ChatRequest
// (validation, Claude Code normalisation), then the reply as one JSON body or an SSE stream.

import type { ChatMessage, ChatToolCall } from "../tokenizer/chat_template.ts";
import { errorResponse, invalidField, toApiError } from "./api_error.ts";
import { checkFields, fieldsOf } from "./api_fields.ts";
import { AnthropicEventStream, anthropicUsage } from "./events.ts";
import { describeJson, Field, type JsonObject } from "./fields.ts";
import { admitChat, streamSignal } from "./admit.ts";
import type { Head } from "./head_context.ts";
import { randomId } from "./random_id.ts";
import type { SamplingRequest } from "./sampling_defaults.ts";
import { collectReply, type Reply, type ToolSpec } from "./output.ts";
import { type ChatRequest, checkFits, type ToolChoice } from "./prompt.ts";
import type { ReplyFormat } from "./tool_grammar.ts";
import { sseResponse, SseStream } from "./sse.ts";

export interface MessagesRequest {
  readonly model: string;
  readonly chat: ChatRequest;
  readonly maxTokens: number;
  readonly stop: string[];
  readonly sampling: SamplingRequest;
  readonly stream: boolean;
}

/** Claude Code's per-conversation attribution block: dropped so prompts share a cache prefix. */
const BILLING_HEADER = "x-anthropic-billing-header:";

/** A text block's text; `what` names the place for the error when it is another type. */
function textBlock(block: Field, what: string): string {
  block.object();
  const type = block.key("type").string();
  if (type !== "text") block.key("type").fail(`${what} may hold only text blocks, got "${type}"`);
  return block.key("text").string();
}

/** A string, or a list of text blocks joined by newlines (system, tool results). */
function textOf(field: Field, what: string): string {
  if (typeof field.value === "string") return field.value;
  return field.array().map((b) => textBlock(b, what)).join("\n");
}

function systemText(field: Field): string {
  if (typeof field.value === "string") return field.value;
  const parts = field.array().map((b) => textBlock(b, "system"));
  if (parts[0]?.startsWith(BILLING_HEADER)) parts.shift();
  return parts.join("\n");
}

function toolResultText(block: Field): string {
  const content = block.key("content");
  const text = !content.present ? "" : textOf(content, "a tool_result's content");
  return block.key("is_error").optBoolean() ? `Error: ${text}` : text;
}

/** One Anthropic message → template messages (tool results become role "tool"). */
function convertMessage(field: Field, out: ChatMessage[], system: string[]): void {
  field.object();
  const role = field.key("role").oneOf(["user", "assistant", "system"] as const);
  const content = field.key("content");
  if (role === "system") {
    // Claude Code sends system turns mid-conversation; Qwen templates refuse them there.
    system.push(textOf(content, "a system message"));
    return;
  }
  if (typeof content.value === "string") {
    out.push({ role, content: content.value });
    return;
  }
  if (!Array.isArray(content.value)) {
    content.fail(
      `expected a string or an array of content blocks, got ${describeJson(content.value)}`,
    );
  }
  const blocks = content.array();
  if (role === "assistant") {
    let text = "";
    let reasoning: string | undefined;
    const calls: ChatToolCall[] = [];
    for (const b of blocks) {
      b.object();
      const type = b.key("type").string();
      if (type === "text") text += b.key("text").string();
      else if (type === "thinking") reasoning = (reasoning ?? "") + b.key("thinking").string();
      else if (type === "tool_use") {
        calls.push({
          id: b.key("id").string(),
          type: "function",
          function: { name: b.key("name").string(), arguments: b.key("input").object() },
        });
      } else if (type !== "redacted_thinking") unsupported(b, type);
    }
    out.push({
      role,
      content: text,
      ...(reasoning !== undefined ? { reasoning_content: reasoning } : {}),
      ...(calls.length ? { tool_calls: calls } : {}),
    });
    return;
  }
  let text: string[] = [];
  const flush = () => {
    if (text.length) out.push({ role: "user", content: text.join("\n") });
    text = [];
  };
  for (const b of blocks) {
    b.object();
    const type = b.key("type").string();
    if (type === "text") text.push(b.key("text").string());
    else if (type === "tool_result") {
      flush();
      out.push({
        role: "tool",
        tool_call_id: b.key("tool_use_id").string(),
        content: toolResultText(b),
      });
    } else unsupported(b, type);
  }
  flush();
}

function unsupported(block: Field, type: string): never {
  throw invalidField(
    block.key("type").path,
    `content blocks of type "${type}" are not supported by this server (text, tool_use, ` +
      `tool_result and thinking are)`,
  );
}

function parseTools(field: Field): ToolSpec[] {
  if (!field.present) return [];
  const tools: ToolSpec[] = [];
  for (const t of field.array()) {
    t.object();
    const type = t.key("type").optString();
    // Anthropic-hosted tools (bash_2025…, web_search_…) have no schema and run on Anthropic's
    // side: accepted and not offered to this model.
    if (type !== undefined && type !== "custom") continue;
    tools.push({
      name: t.key("name").string(),
      description: t.key("description").optString(),
      inputSchema: t.key("input_schema").object(),
      schemaPath: t.key("input_schema").path,
    });
  }
  return tools;
}

function parseToolChoice(field: Field, tools: readonly ToolSpec[]): ToolChoice {
  if (!field.present) return { type: "auto" };
  field.object();
  const type = field.key("type").oneOf(["auto", "any", "tool", "none"] as const);
  if (type !== "tool") {
    if (type === "any" && tools.length === 0) {
      field.key("type").fail(`"any" needs at least one tool in "tools"`);
    }
    return { type };
  }
  const name = field.key("name").string();
  if (!tools.some((t) => t.name === name)) {
    field.key("name").fail(`no tool named "${name}" is in "tools"`);
  }
  return { type, name };
}

/**
 * Structured output: `output_config.format` (or the beta's top-level `output_format`) as
 * {type: "json_schema", schema}.
 */
function parseOutputFormat(root: Field): ReplyFormat | undefined {
  const config = root.key("output_config");
  if (config.present) config.object();
  const field = config.key("format").present ? config.key("format") : root.key("output_format");
  if (!field.present) return undefined;
  field.object();
  field.key("type").oneOf(["json_schema"] as const);
  const schema = field.key("schema");
  return { type: "json_schema", schema: schema.object(), path: schema.path };
}

/** Validates an Anthropic body; `countOnly` is count_tokens (no max_tokens, no sampling). */
export function parseMessagesRequest(body: JsonObject, countOnly = false): MessagesRequest {
  const root = Field.root(body);
  checkFields(
    root,
    fieldsOf(countOnly ? "POST /v1/messages/count_tokens" : "POST /v1/messages"),
  );
  const model = root.key("model").string();
  const system: string[] = [];
  if (root.key("system").present) system.push(systemText(root.key("system")));
  const messages: ChatMessage[] = [];
  const list = root.key("messages").array();
  if (list.length === 0) root.key("messages").fail("at least one message is required");
  list.forEach((m) => convertMessage(m, messages, system));
  let prefill: string | undefined;
  const last = messages[messages.length - 1];
  if (last?.role === "assistant" && !last.tool_calls && typeof last.content === "string") {
    // A final assistant turn is a prefill that the reply continues.
    messages.pop();
    prefill = last.content.trimEnd();
  }
  if (system.length) messages.unshift({ role: "system", content: system.join("\n\n") });
  const tools = parseTools(root.key("tools"));
  const toolChoice = parseToolChoice(root.key("tool_choice"), tools);
  const thinking = root.key("thinking");
  let thinkingOn = false;
  if (thinking.present) {
    thinking.object();
    thinkingOn = thinking.key("type").oneOf(["enabled", "disabled", "adaptive"] as const) !==
      "disabled";
  }
  if (root.key("metadata").present) {
    root.key("metadata").object();
    root.key("metadata").key("user_id").optString();
  }
  if (root.key("output_config").present) root.key("output_config").object();
  const chat: ChatRequest = {
    messages,
    tools,
    toolChoice,
    thinking: thinkingOn,
    prefill,
    format: parseOutputFormat(root),
  };
  if (countOnly) {
    return { model, chat, maxTokens: 0, stop: [], sampling: {}, stream: false };
  }
  const stop = root.key("stop_sequences").present ? root.key("stop_sequences").strings() : [];
  return {
    model,
    chat,
    maxTokens: root.key("max_tokens").number({ integer: true, min: 1 }),
    stop,
    sampling: {
      temperature: root.key("temperature").optNumber({ min: 0, max: 1 }),
      topP: root.key("top_p").optNumber({ min: 0, max: 1 }),
      topK: root.key("top_k").optNumber({ integer: true, min: 0 }),
    },
    stream: root.key("stream").optBoolean() ?? false,
  };
}

/** The non-streaming response body. */
export function messageBody(id: string, model: string, reply: Reply): Record<string, unknown> {
  return {
    id,
    type: "message",
    role: "assistant",
    model,
    content: reply.blocks.map((b) =>
      b.type === "text"
        ? { type: "text", text: b.text }
        : b.type === "thinking"
        ? { type: "thinking", thinking: b.thinking, signature: b.signature }
        : { type: "tool_use", id: b.id, name: b.name, input: b.input }
    ),
    stop_reason: reply.stopReason,
    stop_sequence: reply.stopSequence,
    usage: anthropicUsage(reply.usage),
  };
}

/** POST /v1/messages. */
export async function createMessage(
  head: Head,
  body: JsonObject,
  requestId: string,
  request: Request,
): Promise<Response> {
  const req = parseMessagesRequest(body);
  const prompt = await head.prompts.build(req.chat);
  const events = await admitChat(head, req.chat, prompt, {
    maxTokens: req.maxTokens,
    stop: req.stop,
    sampling: req.sampling,
    toolIdPrefix: "toolu_",
    signal: streamSignal(req.stream, request),
  });
  const id = randomId("msg_");
  if (!req.stream) {
    try {
      const reply = await collectReply(events);
      return Response.json(messageBody(id, head.modelId, reply), {
        headers: { "request-id": requestId },
      });
    } catch (e) {
      return errorResponse(toApiError(e), "anthropic", requestId);
    }
  }
  const ping = { event: "ping", data: JSON.stringify({ type: "ping" }) };
  const stream = events
    .pipeThrough(new AnthropicEventStream({ id, model: head.modelId, requestId }))
    .pipeThrough(new SseStream({ keepAlive: { everyMs: head.pingMs, message: ping } }));
  return sseResponse(stream, requestId);
}

/**
 * POST /v1/messages/count_tokens: the templated prompt's length; never queued. A prompt too long
 * to count exactly (several contexts) is refused as too long.
 */
export async function countTokens(
  head: Head,
  body: JsonObject,
  requestId: string,
): Promise<Response> {
  const req = parseMessagesRequest(body, true);
  const prompt = await head.prompts.build(req.chat);
  if (prompt.ids.length !== prompt.tokens) checkFits(prompt.tokens, head.scheduler.ctx, false);
  return Response.json({ input_tokens: prompt.tokens }, {
    headers: { "request-id": requestId },
  });
}
