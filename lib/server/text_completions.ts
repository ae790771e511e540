// POST /v1/completions: OpenAI's legacy text completions (a raw prompt, no chat template), as one
// text_completion object or as text_completion chunks ending in `data: [DONE]`.

import type { SequenceEvent, StopReason } from "../scheduler/sequence.ts";
import { ApiError, errorResponse, toApiError } from "./api_error.ts";
import { checkFields, fieldsOf } from "./api_fields.ts";
import { Field, type JsonObject } from "./fields.ts";
import { streamSignal } from "./admit.ts";
import type { Head } from "./head_context.ts";
import { randomId } from "./random_id.ts";
import { resolveSampling } from "./sampling_defaults.ts";
import { openaiUsage, readOpenAIOptions } from "./openai.ts";
import { checkFits } from "./prompt.ts";
import { type PromptPart, rawPromptIds } from "./raw_prompt.ts";
import { type SseMessage, sseResponse, SseStream } from "./sse.ts";

const FINISH: Readonly<Record<StopReason, string>> = {
  end_turn: "stop",
  stop_sequence: "stop",
  constraint: "stop",
  max_tokens: "length",
};

/** OpenAI's default max_tokens for this route. */
const DEFAULT_MAX_TOKENS = 16;

/**
 * `prompt`: a string, token ids, or a list holding one of those. Several prompts would be several
 * choices, which this server does not return.
 */
function promptParts(field: Field, vocab: number): PromptPart[] {
  const ids = (f: Field) =>
    f.array().map((t) => t.number({ integer: true, min: 0, max: vocab - 1 }));
  if (typeof field.value === "string") return [field.value];
  const items = field.array();
  if (items.every((f) => typeof f.value === "number")) return ids(field);
  if (items.length !== 1) {
    field.fail(`${items.length} prompts were given; this server completes one per request`);
  }
  return typeof items[0].value === "string" ? [items[0].value] : ids(items[0]);
}

/** POST /v1/completions. */
export async function createTextCompletion(
  head: Head,
  body: JsonObject,
  requestId: string,
  request: Request,
): Promise<Response> {
  const root = Field.root(body);
  checkFields(root, fieldsOf("POST /v1/completions"));
  root.key("model").string();
  const parts = promptParts(root.key("prompt"), head.tokenizer.vocabSize);
  const prompt = await rawPromptIds(parts, head);
  if (prompt.tokens === 0) root.key("prompt").fail("the prompt has no tokens");
  const options = readOpenAIOptions(root);
  const maxTokens = root.key("max_tokens").optNumber({ integer: true, min: 1 }) ??
    DEFAULT_MAX_TOKENS;
  const echo = root.key("echo").optBoolean() ?? false;
  checkFits(prompt.tokens, head.scheduler.ctx, prompt.ids.length === prompt.tokens);
  // What echo repeats: the text given, or the text of the ids given.
  const promptText = parts.every((p) => typeof p === "string")
    ? parts.join("")
    : head.tokenizer.decode(parts as number[]);
  const seq = await head.scheduler.admit({
    prompt: prompt.ids,
    // The next request with the same prompt (or one that extends it) starts from here.
    cacheBoundary: prompt.ids.length - 1,
    maxTokens,
    stop: options.stop,
    sampling: resolveSampling(options.sampling, head.defaults),
    signal: streamSignal(options.stream, request),
  });
  const id = randomId("cmpl-");
  const created = Math.floor(Date.now() / 1000);
  const choice = (text: string, finish: string | null) => ({
    id,
    object: "text_completion",
    created,
    model: head.modelId,
    choices: [{ text, index: 0, logprobs: null, finish_reason: finish }],
  });

  if (!options.stream) {
    let text = echo ? promptText : "";
    for await (const e of seq.events) {
      if (e.type === "token" || e.type === "text") text += e.text;
      if (e.type === "error") return errorResponse(toApiError(e.error), "openai", requestId);
      if (e.type === "end") {
        return Response.json(
          { ...choice(text, FINISH[e.reason]), usage: openaiUsage(e.usage) },
          { headers: { "request-id": requestId } },
        );
      }
    }
    return errorResponse(
      new ApiError("internal", "The completion ended early: its client went away"),
      "openai",
      requestId,
    );
  }
  const chunks = seq.events.pipeThrough(
    new TransformStream<SequenceEvent, SseMessage>({
      start(controller) {
        if (echo) controller.enqueue({ data: JSON.stringify(choice(promptText, null)) });
      },
      transform(e, controller) {
        const send = (body: unknown) => controller.enqueue({ data: JSON.stringify(body) });
        switch (e.type) {
          case "token":
          case "text":
            if (e.text) send(choice(e.text, null));
            return;
          case "end":
            send(choice("", FINISH[e.reason]));
            if (options.includeUsage) {
              send({ ...choice("", null), choices: [], usage: openaiUsage(e.usage) });
            }
            controller.enqueue({ data: "[DONE]" });
            return;
          case "error":
            send(toApiError(e.error).body("openai", requestId));
        }
      },
    }),
  ).pipeThrough(
    new SseStream({ keepAlive: { everyMs: head.pingMs, message: { comment: "ping" } } }),
  );
  return sseResponse(chunks, requestId);
}
