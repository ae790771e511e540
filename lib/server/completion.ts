// POST /completion in llama.cpp's style: a raw prompt (no template), n_predict, sampling, seed,
// n_probs; the reply as one JSON object or `data:` frames with `stop: true` on the last.

import type { SequenceEvent, StopReason, TokenProbs } from "../scheduler/sequence.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import { MAX_TOPK } from "../../engine/stage.ts";
import { ApiError, errorResponse, toApiError } from "./api_error.ts";
import { checkFields, fieldsOf } from "./api_fields.ts";
import { readPenalties } from "./penalty_fields.ts";
import { Field, type JsonObject, readSeed } from "./fields.ts";
import { streamSignal } from "./admit.ts";
import type { Head } from "./head_context.ts";
import { resolveSampling } from "./sampling_defaults.ts";
import { checkFits } from "./prompt.ts";
import { type PromptPart, rawPromptIds } from "./raw_prompt.ts";
import { grammarConstraint } from "../grammar/token_mask.ts";
import { type ReplyFormat, replyGrammar } from "./tool_grammar.ts";
import { type SseMessage, sseResponse, SseStream } from "./sse.ts";

const STOP_TYPE: Readonly<Record<StopReason, string>> = {
  end_turn: "eos",
  max_tokens: "limit",
  stop_sequence: "word",
  constraint: "eos",
};

/** `prompt`: a string, token ids, or a list mixing both (as llama.cpp accepts). */
function promptParts(field: Field, head: Head): PromptPart[] {
  if (typeof field.value === "string") return [field.value];
  return field.array().map((part) =>
    typeof part.value === "string"
      ? part.value
      : part.number({ integer: true, min: 0, max: head.tokenizer.vocabSize - 1 })
  );
}

function tokenEntry(tokenizer: TextTokenizer, id: number, logprob: number) {
  const bytes = tokenizer.tokenBytes(id);
  return {
    id,
    token: new TextDecoder().decode(bytes),
    bytes: [...bytes],
    logprob,
  };
}

function probabilities(tokenizer: TextTokenizer, id: number, probs: TokenProbs) {
  return {
    ...tokenEntry(tokenizer, id, probs.logprob),
    top_logprobs: probs.top.map((c) => tokenEntry(tokenizer, c.id, c.logprob)),
  };
}

/** llama.cpp's constraints: `json_schema` (a schema object) or `grammar` (GBNF text), not both. */
function completionFormat(root: Field): ReplyFormat | undefined {
  const schema = root.key("json_schema");
  const gbnf = root.key("grammar");
  // llama.cpp clients send an empty grammar for none.
  const noGrammar = gbnf.value === "";
  if (schema.present && gbnf.present && !noGrammar) {
    gbnf.fail(`cannot be combined with "json_schema"; send one of them`);
  }
  if (schema.present) return { type: "json_schema", schema: schema.object(), path: schema.path };
  if (gbnf.present && !noGrammar) return { type: "gbnf", grammar: gbnf.string(), path: gbnf.path };
  return undefined;
}

/** Numbers JSON carries exactly stay numbers; larger seeds become decimal strings. */
function seedJson(seed: bigint): number | string {
  return seed <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(seed) : seed.toString();
}

/** POST /completion. */
export async function createCompletion(
  head: Head,
  body: JsonObject,
  requestId: string,
  request: Request,
): Promise<Response> {
  const root = Field.root(body);
  checkFields(root, fieldsOf("POST /completion"));
  // A grammar is compiled (and refused) before the prompt is tokenized.
  const format = completionFormat(root);
  const grammar = format && replyGrammar({ format, reasoning: false });
  const { ids: prompt, tokens } = await rawPromptIds(promptParts(root.key("prompt"), head), head);
  if (tokens === 0) root.key("prompt").fail("the prompt has no tokens");
  const nPredict = root.key("n_predict").optNumber({ integer: true, min: -1 }) ?? -1;
  const nProbs = root.key("n_probs").optNumber({ integer: true, min: 0, max: MAX_TOPK }) ?? 0;
  const sampling = resolveSampling({
    temperature: root.key("temperature").optNumber({ min: 0 }),
    topK: root.key("top_k").optNumber({ integer: true, min: 0 }),
    topP: root.key("top_p").optNumber({ min: 0, max: 1 }),
    minP: root.key("min_p").optNumber({ min: 0, max: 1 }),
    minKeep: root.key("min_keep").optNumber({ integer: true, min: 0 }),
    seed: readSeed(root.key("seed")),
    penalties: readPenalties(root, "llama", head.tokenizer, head.scheduler.ctx),
  }, head.defaults);
  const cachePrompt = root.key("cache_prompt").optBoolean() ?? true;
  const returnTokens = root.key("return_tokens").optBoolean() ?? false;
  const stop = root.key("stop").present ? root.key("stop").strings() : [];
  const stream = root.key("stream").optBoolean() ?? false;
  checkFits(tokens, head.scheduler.ctx, prompt.length === tokens);
  const seq = await head.scheduler.admit({
    prompt,
    // The next request with the same prompt (or one that extends it) starts from here.
    cacheBoundary: prompt.length - 1,
    cache: cachePrompt,
    maxTokens: nPredict < 0 ? Number.MAX_SAFE_INTEGER : Math.max(nPredict, 1),
    stop,
    sampling,
    constraint: grammar && grammarConstraint(grammar, head.tokenizer),
    logprobs: nProbs > 0 ? nProbs : undefined,
    signal: streamSignal(stream, request),
  });
  const settings = {
    n_predict: nPredict,
    temperature: sampling.temperature,
    top_k: sampling.topK,
    top_p: sampling.topP,
    min_p: sampling.minP,
    min_keep: sampling.minKeep,
    repeat_penalty: sampling.penalties?.repeat ?? 1,
    repeat_last_n: sampling.penalties?.repeatLastN,
    presence_penalty: sampling.penalties?.presence ?? 0,
    frequency_penalty: sampling.penalties?.frequency ?? 0,
    ignore_eos: root.key("ignore_eos").optBoolean() ?? false,
    seed: seedJson(sampling.seed),
    n_probs: nProbs,
  };
  const t0 = performance.now();
  let firstAt = 0;
  let content = "";
  const ids: number[] = [];
  const probs: unknown[] = [];
  let cached = 0;
  /** The final object: llama.cpp's shape, `content` holding what the caller still lacks. */
  const final = (event: Extract<SequenceEvent, { type: "end" }>, rest: string) => {
    const end = performance.now();
    return {
      index: 0,
      content: rest,
      // Streamed frames carry their ids already; `ids` is filled only when buffering.
      tokens: returnTokens ? ids : [],
      id_slot: -1,
      stop: true,
      model: head.modelId,
      tokens_predicted: event.usage.outputTokens,
      tokens_evaluated: event.usage.promptTokens,
      tokens_cached: event.usage.cachedTokens,
      stop_type: STOP_TYPE[event.reason],
      stopping_word: event.stopSequence ?? "",
      truncated: false,
      generation_settings: settings,
      timings: {
        prompt_n: event.usage.promptTokens - cached,
        prompt_ms: firstAt - t0,
        predicted_n: event.usage.outputTokens,
        predicted_ms: end - firstAt,
        predicted_per_token_ms: (end - firstAt) / Math.max(1, event.usage.outputTokens - 1),
      },
      ...(nProbs > 0 ? { completion_probabilities: probs } : {}),
    };
  };
  const observe = (e: SequenceEvent) => {
    if (e.type === "start") cached = e.cachedTokens;
    if (e.type === "token" && firstAt === 0) firstAt = performance.now();
  };

  if (!stream) {
    for await (const e of seq.events) {
      observe(e);
      if (e.type === "token" || e.type === "text") content += e.text;
      if (e.type === "token") ids.push(e.id);
      if (e.type === "token" && e.probs) probs.push(probabilities(head.tokenizer, e.id, e.probs));
      if (e.type === "error") return errorResponse(toApiError(e.error), "llama", requestId);
      if (e.type === "end") {
        return Response.json(final(e, content), { headers: { "request-id": requestId } });
      }
    }
    return errorResponse(
      new ApiError("internal", "The completion ended early: its client went away"),
      "llama",
      requestId,
    );
  }
  const frames = seq.events.pipeThrough(
    new TransformStream<SequenceEvent, SseMessage>({
      transform(e, controller) {
        observe(e);
        const send = (body: unknown) => controller.enqueue({ data: JSON.stringify(body) });
        switch (e.type) {
          case "token":
          case "text":
            if (e.type === "token" || e.text) {
              send({
                index: 0,
                content: e.text,
                stop: false,
                ...(e.type === "token" ? { tokens: [e.id] } : {}),
                ...(e.type === "token" && e.probs
                  ? { completion_probabilities: [probabilities(head.tokenizer, e.id, e.probs)] }
                  : {}),
              });
            }
            return;
          case "end":
            send(final(e, ""));
            return;
          case "error":
            send(toApiError(e.error).body("llama", requestId));
        }
      },
    }),
  ).pipeThrough(
    new SseStream({ keepAlive: { everyMs: head.pingMs, message: { comment: "ping" } } }),
  );
  return sseResponse(frames, requestId);
}
