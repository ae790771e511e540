// POST /v1/chat/completions: OpenAI request body → ChatRequest, and the reply as a
// chat.completion or as chat.completion.chunk SSE frames ending in `data: [DONE]`.

import type { Usage } from "../scheduler/sequence.ts";
import type { ChatMessage, ChatToolCall } from "../tokenizer/chat_template.ts";
import { errorResponse, toApiError } from "./api_error.ts";
import { checkFields, fieldsOf } from "./api_fields.ts";
import { readPenalties } from "./penalty_fields.ts";
import { Field, type JsonObject, readSeed } from "./fields.ts";
import { admitChat, streamSignal } from "./admit.ts";
import type { Head } from "./head_context.ts";
import { randomId } from "./random_id.ts";
import type { SamplingRequest } from "./sampling_defaults.ts";
import {
  collectReply,
  type ReplyEvent,
  type ReplyStopReason,
  type TokenLogprob,
  type ToolSpec,
} from "./output.ts";
import type { ReplyFormat } from "./tool_grammar.ts";
import type { ChatRequest, ToolChoice } from "./prompt.ts";
import { type SseMessage, sseResponse, SseStream } from "./sse.ts";

/** The fields OpenAI's chat and text completions share. */
export interface OpenAIOptions {
  readonly stop: string[];
  readonly sampling: SamplingRequest;
  readonly stream: boolean;
  readonly includeUsage: boolean;
}

export interface CompletionsRequest extends OpenAIOptions {
  readonly model: string;
  readonly chat: ChatRequest;
  /** Per-token log-probabilities with this many alternatives (top_logprobs); undefined: none. */
  readonly logprobs: number | undefined;
  /** Undefined: until end of generation or a full context. */
  readonly maxTokens: number | undefined;
}

const FINISH: Readonly<Record<ReplyStopReason, string>> = {
  end_turn: "stop",
  stop_sequence: "stop",
  max_tokens: "length",
  tool_use: "tool_calls",
};

function contentText(field: Field): string | null {
  if (!field.present) return null;
  if (typeof field.value === "string") return field.value;
  return field.array().map((part) => {
    part.object();
    const type = part.key("type").string();
    if (type !== "text") {
      part.key("type").fail(`content parts of type "${type}" are not supported (text is)`);
    }
    return part.key("text").string();
  }).join("\n");
}

function convertMessage(field: Field, out: ChatMessage[], system: string[]): void {
  field.object();
  const role = field.key("role").oneOf(
    ["system", "developer", "user", "assistant", "tool"] as const,
  );
  const content = contentText(field.key("content"));
  switch (role) {
    case "system":
    case "developer":
      system.push(content ?? "");
      return;
    case "user":
      out.push({ role, content: content ?? "" });
      return;
    case "tool":
      out.push({ role, content: content ?? "", tool_call_id: field.key("tool_call_id").string() });
      return;
    case "assistant": {
      const calls: ChatToolCall[] = [];
      if (field.key("tool_calls").present) {
        for (const c of field.key("tool_calls").array()) {
          c.object();
          const fn = c.key("function");
          fn.object();
          calls.push({
            id: c.key("id").optString(),
            type: "function",
            function: { name: fn.key("name").string(), arguments: fn.key("arguments").string() },
          });
        }
      }
      const reasoning = field.key("reasoning_content").optString();
      out.push({
        role,
        content: content ?? "",
        ...(reasoning !== undefined ? { reasoning_content: reasoning } : {}),
        ...(calls.length ? { tool_calls: calls } : {}),
      });
    }
  }
}

function parseTools(field: Field): ToolSpec[] {
  if (!field.present) return [];
  return field.array().map((t) => {
    t.object();
    t.key("type").oneOf(["function"] as const);
    const fn = t.key("function");
    fn.object();
    return {
      name: fn.key("name").string(),
      description: fn.key("description").optString(),
      schemaPath: fn.key("parameters").path,
      inputSchema: fn.key("parameters").present
        ? fn.key("parameters").object()
        : { type: "object", properties: {} },
    };
  });
}

function parseToolChoice(field: Field, tools: readonly ToolSpec[]): ToolChoice {
  if (!field.present) return { type: "auto" };
  if (typeof field.value === "string") {
    const choice = field.oneOf(["none", "auto", "required"] as const);
    if (choice === "required" && tools.length === 0) field.fail(`"required" needs "tools"`);
    return { type: choice === "required" ? "any" : choice };
  }
  field.object();
  field.key("type").oneOf(["function"] as const);
  const fn = field.key("function");
  fn.object();
  const name = fn.key("name").string();
  if (!tools.some((t) => t.name === name)) fn.key("name").fail(`no tool named "${name}"`);
  return { type: "tool", name };
}

/** Reads the sampling, stop and stream fields OpenAI's two completion routes share. */
export function readOpenAIOptions(root: Field, head: Head): OpenAIOptions {
  const n = root.key("n").optNumber({ integer: true, min: 1 });
  if (n !== undefined && n !== 1) root.key("n").fail(`only n = 1 is supported, got ${n}`);
  const streamOptions = root.key("stream_options");
  if (streamOptions.present) streamOptions.object();
  return {
    stop: root.key("stop").present ? root.key("stop").strings() : [],
    sampling: {
      temperature: root.key("temperature").optNumber({ min: 0, max: 2 }),
      topP: root.key("top_p").optNumber({ min: 0, max: 1 }),
      topK: root.key("top_k").optNumber({ integer: true, min: 0 }),
      minP: root.key("min_p").optNumber({ min: 0, max: 1 }),
      seed: readSeed(root.key("seed")),
      penalties: readPenalties(root, "openai", head.tokenizer, head.scheduler.ctx),
    },
    stream: root.key("stream").optBoolean() ?? false,
    includeUsage: streamOptions.key("include_usage").optBoolean() ?? false,
  };
}

/** OpenAI's response_format: text, json_object, or json_schema {name, schema, strict}. */
function parseResponseFormat(field: Field): ReplyFormat | undefined {
  if (!field.present) return undefined;
  field.object();
  const type = field.key("type").oneOf(["text", "json_object", "json_schema"] as const);
  if (type === "text") return undefined;
  if (type === "json_object") return { type };
  const spec = field.key("json_schema");
  spec.object();
  spec.key("name").string();
  spec.key("strict").optBoolean();
  const schema = spec.key("schema");
  return { type, schema: schema.present ? schema.object() : {}, path: schema.path };
}

/** OpenAI's most alternatives per token. */
const MAX_TOP_LOGPROBS = 20;

/** logprobs and top_logprobs (0..20, OpenAI's range, which needs logprobs: true). */
function parseLogprobs(root: Field): number | undefined {
  const on = root.key("logprobs").optBoolean() ?? false;
  const top = root.key("top_logprobs").optNumber({ integer: true, min: 0, max: MAX_TOP_LOGPROBS });
  if (top !== undefined && !on) root.key("top_logprobs").fail(`needs "logprobs": true`);
  return on ? top ?? 0 : undefined;
}

export function parseCompletionsRequest(body: JsonObject, head: Head): CompletionsRequest {
  const root = Field.root(body);
  checkFields(root, fieldsOf("POST /v1/chat/completions"));
  const model = root.key("model").string();
  const system: string[] = [];
  const messages: ChatMessage[] = [];
  const list = root.key("messages").array();
  if (list.length === 0) root.key("messages").fail("at least one message is required");
  list.forEach((m) => convertMessage(m, messages, system));
  if (system.length) messages.unshift({ role: "system", content: system.join("\n\n") });
  const tools = parseTools(root.key("tools"));
  const toolChoice = parseToolChoice(root.key("tool_choice"), tools);
  const kwargs = root.key("chat_template_kwargs");
  if (kwargs.present) kwargs.object();
  const effort = root.key("reasoning_effort").optString();
  const thinking = kwargs.key("enable_thinking").optBoolean() ??
    (effort !== undefined && effort !== "none");
  const maxTokens = root.key("max_completion_tokens").optNumber({ integer: true, min: 1 }) ??
    root.key("max_tokens").optNumber({ integer: true, min: 1 });
  return {
    ...readOpenAIOptions(root, head),
    model,
    chat: {
      messages,
      tools,
      toolChoice,
      thinking,
      format: parseResponseFormat(root.key("response_format")),
    },
    logprobs: parseLogprobs(root),
    maxTokens,
  };
}

export function openaiUsage(usage: Usage): Record<string, unknown> {
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.outputTokens,
    total_tokens: usage.promptTokens + usage.outputTokens,
    prompt_tokens_details: { cached_tokens: usage.cachedTokens },
  };
}

/** OpenAI's floor for a log-probability it cannot tell (a token outside the candidates). */
const LOGPROB_FLOOR = -9999;

function logprobEntry(bytes: Uint8Array, logprob: number) {
  return {
    token: new TextDecoder().decode(bytes),
    logprob: Math.max(logprob, LOGPROB_FLOOR),
    bytes: [...bytes],
  };
}

/** OpenAI's `logprobs.content` entries of generated tokens, with `top` alternatives each. */
export function openaiLogprobs(tokens: readonly TokenLogprob[], top: number) {
  return tokens.map((t) => ({
    ...logprobEntry(t.bytes, t.logprob),
    top_logprobs: t.top.slice(0, top).map((c) => logprobEntry(c.bytes, c.logprob)),
  }));
}

interface ChunkInfo {
  readonly id: string;
  readonly created: number;
  readonly model: string;
  readonly includeUsage: boolean;
  readonly requestId: string;
  /** top_logprobs when logprobs were asked for. */
  readonly logprobs: number | undefined;
}

/**
 * Reply events → chat.completion.chunk frames (no `event:` names), then `[DONE]`; an error ends
 * the stream with an error chunk, then `[DONE]` as well, so that a client reading to the closing
 * frame sees the end of every stream. Token log-probabilities ride on the next chunk.
 */
export class OpenAIChunkStream extends TransformStream<ReplyEvent, SseMessage> {
  constructor(info: ChunkInfo) {
    const calls = new Map<number, number>();
    let pending: TokenLogprob[] = [];
    const chunk = (delta: Record<string, unknown>, finish: string | null = null) => {
      const logprobs = info.logprobs !== undefined && pending.length
        ? { content: openaiLogprobs(pending, info.logprobs), refusal: null }
        : null;
      pending = [];
      return {
        data: JSON.stringify({
          id: info.id,
          object: "chat.completion.chunk",
          created: info.created,
          model: info.model,
          choices: [{ index: 0, delta, finish_reason: finish, logprobs }],
          ...(info.includeUsage ? { usage: null } : {}),
        }),
      };
    };
    super({
      transform(e, controller) {
        switch (e.type) {
          case "start":
            controller.enqueue(chunk({ role: "assistant", content: "" }));
            return;
          case "block_start":
            if (e.block.type === "tool_use") {
              const index = calls.size;
              calls.set(e.index, index);
              controller.enqueue(chunk({
                tool_calls: [{
                  index,
                  id: e.block.id,
                  type: "function",
                  function: { name: e.block.name, arguments: "" },
                }],
              }));
            }
            return;
          case "delta":
            controller.enqueue(chunk(
              e.kind === "text"
                ? { content: e.text }
                : e.kind === "thinking"
                ? { reasoning_content: e.text }
                : { tool_calls: [{ index: calls.get(e.index), function: { arguments: e.text } }] },
            ));
            return;
          case "block_stop":
            return;
          case "logprobs":
            pending.push(...e.tokens);
            return;
          case "end":
            controller.enqueue(chunk({}, FINISH[e.stopReason]));
            if (info.includeUsage) {
              controller.enqueue({
                data: JSON.stringify({
                  id: info.id,
                  object: "chat.completion.chunk",
                  created: info.created,
                  model: info.model,
                  choices: [],
                  usage: openaiUsage(e.usage),
                }),
              });
            }
            controller.enqueue({ data: "[DONE]" });
            return;
          case "error":
            controller.enqueue({ data: JSON.stringify(e.error.body("openai", info.requestId)) });
            controller.enqueue({ data: "[DONE]" });
        }
      },
    });
  }
}

/** POST /v1/chat/completions. */
export async function createChatCompletion(
  head: Head,
  body: JsonObject,
  requestId: string,
  request: Request,
): Promise<Response> {
  const req = parseCompletionsRequest(body, head);
  const prompt = await head.prompts.build(req.chat);
  const events = await admitChat(head, req.chat, prompt, {
    maxTokens: req.maxTokens ?? Number.MAX_SAFE_INTEGER,
    stop: req.stop,
    sampling: req.sampling,
    toolIdPrefix: "call_",
    logprobs: req.logprobs,
    signal: streamSignal(req.stream, request),
  });
  const id = randomId("chatcmpl-");
  const created = Math.floor(Date.now() / 1000);
  if (req.stream) {
    const stream = events
      .pipeThrough(
        new OpenAIChunkStream({
          id,
          created,
          model: head.modelId,
          includeUsage: req.includeUsage,
          requestId,
          logprobs: req.logprobs,
        }),
      )
      .pipeThrough(
        new SseStream({ keepAlive: { everyMs: head.pingMs, message: { comment: "ping" } } }),
      );
    return sseResponse(stream, requestId);
  }
  try {
    const reply = await collectReply(events);
    const text = reply.blocks.flatMap((b) => b.type === "text" ? [b.text] : []).join("");
    const reasoning = reply.blocks.flatMap((b) => b.type === "thinking" ? [b.thinking] : []);
    const calls = reply.blocks.flatMap((b) =>
      b.type === "tool_use"
        ? [{
          id: b.id,
          type: "function",
          function: { name: b.name, arguments: JSON.stringify(b.input) },
        }]
        : []
    );
    return Response.json({
      id,
      object: "chat.completion",
      created,
      model: head.modelId,
      choices: [{
        index: 0,
        message: {
          role: "assistant",
          content: text || (calls.length ? null : ""),
          ...(reasoning.length ? { reasoning_content: reasoning.join("") } : {}),
          ...(calls.length ? { tool_calls: calls } : {}),
        },
        finish_reason: FINISH[reply.stopReason],
        logprobs: req.logprobs === undefined
          ? null
          : { content: openaiLogprobs(reply.logprobs, req.logprobs), refusal: null },
      }],
      usage: openaiUsage(reply.usage),
    }, { headers: { "request-id": requestId } });
  } catch (e) {
    return errorResponse(toApiError(e), "openai", requestId);
  }
}
