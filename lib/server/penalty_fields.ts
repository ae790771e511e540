// Request fields → PenaltyOptions (lib/sampling/penalties.ts): logit_bias, repetition, presence and
// frequency penalties in OpenAI's and llama.cpp's spellings, checked and bounded. Used by openai.ts
// (chat and text completions) and completion.ts; the last stage applies the result.

import { BAN, MAX_BIAS, MAX_REPEAT } from "../../engine/stage.ts";
import { MAX_LOGIT_BIAS, MAX_PENALTY_WINDOW, type PenaltyOptions } from "../sampling/penalties.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";
import type { Field } from "./fields.ts";

/** How the route spells and scopes its penalties. */
export type PenaltyStyle = "openai" | "llama";

/** repeat_penalty: within MAX_REPEAT of 1 (a divisor and a factor of logits). */
function repeatPenalty(field: Field): number | undefined {
  return field.optNumber({ min: 1 / MAX_REPEAT, max: MAX_REPEAT });
}

/** repeat_last_n: 0..MAX_PENALTY_WINDOW, or -1 for the whole context when that fits. */
function window(field: Field, fallback: number, ctx: number): number {
  const n = field.optNumber({ integer: true, min: -1 }) ?? fallback;
  const tokens = n === -1 ? ctx : n;
  if (tokens > MAX_PENALTY_WINDOW) {
    field.fail(
      `a window of ${tokens} tokens${n === -1 ? " (the context)" : ""} is longer than the ` +
        `${MAX_PENALTY_WINDOW} this server supports; give ${MAX_PENALTY_WINDOW} or less`,
    );
  }
  return tokens;
}

function tokenId(field: Field, text: string, vocab: number): number {
  if (!/^\d+$/.test(text) || Number(text) >= vocab) {
    field.fail(`"${text}" is not a token id (0..${vocab - 1})`);
  }
  return Number(text);
}

/** OpenAI's logit_bias: {"token id": -100..100}. */
function openaiBias(field: Field, vocab: number): Map<number, number> {
  const bias = new Map<number, number>();
  for (const key of Object.keys(field.object())) {
    bias.set(tokenId(field, key, vocab), field.key(key).number({ min: -100, max: 100 }));
  }
  return bias;
}

/**
 * llama.cpp's logit_bias: [[id or string, bias or false], ...] or {"id or string": bias or
 * false}. A string biases every token of its tokenization; false bans.
 */
function llamaBias(field: Field, tokenizer: TextTokenizer): Map<number, number> {
  const bias = new Map<number, number>();
  const add = (ids: readonly number[], value: Field) => {
    const amount = value.value === false ? BAN : value.number({ min: -MAX_BIAS, max: MAX_BIAS });
    for (const id of ids) bias.set(id, amount);
  };
  if (Array.isArray(field.value)) {
    for (const pair of field.array()) {
      const parts = pair.array();
      if (parts.length !== 2) pair.fail(`expected a [token, bias] pair, got ${parts.length} items`);
      const [token, value] = parts;
      add(
        typeof token.value === "string"
          ? tokenizer.encode(token.value)
          : [token.number({ integer: true, min: 0, max: tokenizer.vocabSize - 1 })],
        value,
      );
    }
    return bias;
  }
  for (const key of Object.keys(field.object())) {
    // A key of digits is a token id, any other key is text, as llama.cpp reads them.
    const ids = /^\d+$/.test(key)
      ? [tokenId(field, key, tokenizer.vocabSize)]
      : tokenizer.encode(key);
    add(ids, field.key(key));
  }
  return bias;
}

/**
 * The penalties of a request body. OpenAI: presence and frequency over the generated tokens (the
 * last 1024), repeat_penalty over the last repeat_last_n (default 64) of prompt and output.
 * llama.cpp: all three over that one window. ignore_eos (llama.cpp) bans `eos`.
 */
export function readPenalties(
  root: Field,
  style: PenaltyStyle,
  tokenizer: TextTokenizer,
  ctx: number,
): PenaltyOptions {
  // OpenAI's range; llama.cpp sets none, so a generous one keeps count × penalty far from f32's.
  const range = style === "openai" ? { min: -2, max: 2 } : { min: -1000, max: 1000 };
  const repeatLastN = window(root.key("repeat_last_n"), 64, ctx);
  const bias = root.key("logit_bias");
  const entries = Array.isArray(bias.value)
    ? bias.value.length
    : Object.keys(bias.present ? bias.object() : {}).length;
  if (entries > MAX_LOGIT_BIAS) {
    bias.fail(`${entries} entries were given; this server takes at most ${MAX_LOGIT_BIAS}`);
  }
  const logitBias = !bias.present
    ? new Map<number, number>()
    : style === "openai"
    ? openaiBias(bias, tokenizer.vocabSize)
    : llamaBias(bias, tokenizer);
  if (style === "llama" && root.key("ignore_eos").optBoolean()) {
    for (const id of tokenizer.eosIds) logitBias.set(id, BAN);
  }
  if (logitBias.size > MAX_LOGIT_BIAS) {
    bias.fail(`it biases ${logitBias.size} tokens; this server takes at most ${MAX_LOGIT_BIAS}`);
  }
  return {
    logitBias,
    repeat: repeatPenalty(root.key("repeat_penalty")),
    repeatLastN,
    presence: root.key("presence_penalty").optNumber(range),
    frequency: root.key("frequency_penalty").optNumber(range),
    penaltyLastN: style === "openai" ? MAX_PENALTY_WINDOW : repeatLastN,
    penaltyScope: style === "openai" ? "output" : "context",
  };
}
