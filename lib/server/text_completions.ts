// POST /v1/completions: OpenAI's legacy text completions (a raw prompt, no chat template), as one
// text_completion object or as text_completion chunks ending in `data: [DONE]`.

import type { SequenceEvent, StopReason, TokenProbs } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
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
/** OpenAI's most alternatives per token on this route. */
const MAX_LOGPROBS = 5;

/** Generated tokens with their probabilities, and the text before them in the reply. */
interface ProbedToken {
  readonly id: number;
  readonly probs: TokenProbs;
}

/**
 * OpenAI's legacy `logprobs` object: token texts, their log-probabilities, the `top` best
 * candidates of each as text → log-probability, and each token's offset in the reply text.
 */
function legacyLogprobs(
  tokenizer: TextTokenizer,
  tokens: readonly ProbedToken[],
  top: number,
  at: number,
) {
  const text = (id: number) => new TextDecoder().decode(tokenizer.tokenBytes(id));
  const texts = tokens.map((t) => text(t.id));
  const offsets: number[] = [];
  for (const t of texts) {
    offsets.push(at);
    at += t.length;
  }
  return {
    tokens: texts,
    token_logprobs: tokens.map((t) => t.probs.logprob),
    top_logprobs: tokens.map((t) =>
      Object.fromEntries(t.probs.top.slice(0, top).map((c) => [text(c.id), c.logprob]))
    ),
    text_offset: offsets,
  };
}

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
  const options = readOpenAIOptions(root, head);
  const maxTokens = root.key("max_tokens").optNumber({ integer: true, min: 1 }) ??
    DEFAULT_MAX_TOKENS;
  const echo = root.key("echo").optBoolean() ?? false;
  const logprobs = root.key("logprobs").optNumber({ integer: true, min: 0, max: MAX_LOGPROBS });
  if (echo && logprobs !== undefined) {
    root.key("echo").fail(
      `cannot be combined with "logprobs": the prompt's own log-probabilities are not computed`,
    );
  }
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
    logprobs,
    signal: streamSignal(options.stream, request),
  });
  const id = randomId("cmpl-");
  const created = Math.floor(Date.now() / 1000);
  // Probed tokens not yet sent, and how much text the ones sent before them held.
  let probed: ProbedToken[] = [];
  let offset = 0;
  const choice = (text: string, finish: string | null) => {
    const entries = logprobs === undefined
      ? null
      : legacyLogprobs(head.tokenizer, probed, logprobs, offset);
    offset += entries?.tokens.reduce((n, t) => n + t.length, 0) ?? 0;
    probed = [];
    return {
      id,
      object: "text_completion",
      created,
      model: head.modelId,
      choices: [{ text, index: 0, logprobs: entries, finish_reason: finish }],
    };
  };

  if (!options.stream) {
    let text = echo ? promptText : "";
    for await (const e of seq.events) {
      if (e.type === "token" && e.probs) probed.push({ id: e.id, probs: e.probs });
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
            // A token whose text is held back sends its log-probabilities with the next chunk.
            if (e.type === "token" && e.probs) probed.push({ id: e.id, probs: e.probs });
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
            // The error chunk, then the closing frame of every OpenAI stream.
            send(toApiError(e.error).body("openai", requestId));
            controller.enqueue({ data: "[DONE]" });
        }
      },
    }),
  ).pipeThrough(
    new SseStream({ keepAlive: { everyMs: head.pingMs, message: { comment: "ping" } } }),
  );
  return sseResponse(chunks, requestId);
}
