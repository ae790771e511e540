// llama.cpp's utility routes: POST /tokenize and /detokenize, GET /props (defaults, slots, chat
// template) and GET /slots (read-only slot states). Served by handler.ts next to /completion.

import type { SamplingOptions } from "../scheduler/sequence.ts";
import { ApiError } from "./api_error.ts";
import { checkFields, fieldsOf } from "./api_fields.ts";
import { Field, type JsonObject } from "./fields.ts";
import type { Head } from "./head_context.ts";

const json = (body: unknown, requestId: string) =>
  Response.json(body, { headers: { "request-id": requestId } });

/** A piece as llama.cpp shows it: its text when it is whole UTF-8, else its bytes. */
function piece(bytes: Uint8Array): string | number[] {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return [...bytes];
  }
}

/** POST /tokenize, on the tokenizer thread: up to four contexts of tokens. */
export async function tokenize(head: Head, body: JsonObject, requestId: string): Promise<Response> {
  const root = Field.root(body);
  checkFields(root, fieldsOf("POST /tokenize"));
  const content = root.key("content").string();
  const specials = root.key("parse_special").optBoolean() ?? true;
  const counted = await head.prompts.texts([content], specials);
  if (counted.parts.length === 0) {
    root.key("content").fail(
      `it has at least ${counted.tokens} tokens, more than this server tokenizes at once`,
    );
  }
  const t = head.tokenizer;
  const ids = Array.from(counted.parts[0]);
  if ((root.key("add_special").optBoolean() ?? false) && t.addBos) ids.unshift(t.bosId!);
  const tokens = root.key("with_pieces").optBoolean()
    ? ids.map((id) => ({ id, piece: piece(t.tokenBytes(id)) }))
    : ids;
  return json({ tokens }, requestId);
}

/** POST /detokenize. */
export function detokenize(head: Head, body: JsonObject, requestId: string): Response {
  const root = Field.root(body);
  checkFields(root, fieldsOf("POST /detokenize"));
  const max = head.tokenizer.vocabSize - 1;
  const list = root.key("tokens").present ? root.key("tokens").array() : [];
  // As /tokenize: at most four contexts at once, so no request holds the event loop.
  const limit = 4 * head.scheduler.ctx;
  if (list.length > limit) {
    root.key("tokens").fail(`${list.length} ids; this server detokenizes at most ${limit} at once`);
  }
  const ids = list.map((f) => f.number({ integer: true, min: 0, max }));
  return json({ content: head.tokenizer.decode(ids) }, requestId);
}

/** A generation's settings in llama.cpp's `params` shape. */
function params(sampling: SamplingOptions, nPredict: number): Record<string, unknown> {
  const p = sampling.penalties ?? {};
  return {
    n_predict: nPredict,
    seed: sampling.seed <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(sampling.seed)
      : sampling.seed.toString(),
    temperature: sampling.temperature,
    top_k: sampling.topK,
    top_p: sampling.topP,
    min_p: sampling.minP ?? 0,
    min_keep: sampling.minKeep ?? 0,
    repeat_penalty: p.repeat ?? 1,
    repeat_last_n: p.repeatLastN ?? 64,
    presence_penalty: p.presence ?? 0,
    frequency_penalty: p.frequency ?? 0,
    samplers: ["penalties", "top_k", "top_p", "min_p", "temperature"],
  };
}

/** GET /props: what a client needs to know before its first request. */
export function props(head: Head, requestId: string): Response {
  const d = head.defaults;
  // seed -1: a random seed per request, as llama.cpp shows it.
  const defaults = { temperature: d.temperature, topK: d.topK, topP: d.topP, seed: -1n };
  return json({
    default_generation_settings: {
      n_ctx: head.scheduler.ctx,
      params: { ...params(defaults, -1), temperature_cap: d.temperatureCap },
    },
    total_slots: head.scheduler.slots,
    model_alias: head.modelId,
    chat_template: head.chatTemplate,
    modalities: { vision: false, audio: false },
    build_info: "tandem",
  }, requestId);
}

/** GET /slots (?fail_on_no_slot=1: 503 when every slot is busy). */
export function slots(head: Head, requestId: string, url: URL): Response {
  const states = head.scheduler.slotStates();
  if (url.searchParams.get("fail_on_no_slot") === "1" && states.every((s) => s.running)) {
    throw new ApiError("overloaded", "No slot is free: all are busy", { retryAfter: 1 });
  }
  return json(
    states.map(({ slot, running }) => {
      const seq = running?.sequence;
      const max = seq?.request.maxTokens ?? -1;
      return {
        id: slot,
        id_task: running?.task ?? -1,
        n_ctx: head.scheduler.ctx,
        is_processing: seq !== undefined,
        ...(seq
          ? {
            params: params(seq.request.sampling, max >= Number.MAX_SAFE_INTEGER ? -1 : max),
            n_prompt_tokens: seq.request.prompt.length,
          }
          : {}),
        next_token: {
          has_next_token: seq !== undefined,
          n_remain: seq && max < Number.MAX_SAFE_INTEGER ? max - seq.outputTokens : -1,
          n_decoded: seq?.outputTokens ?? 0,
        },
      };
    }),
    requestId,
  );
}
