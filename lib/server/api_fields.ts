// Every request field of every route, and what the server does with it: honoured, ignored
// (metadata the API lets a server drop) or refused with a 400 naming it. Route parsers call
// checkFields first; docs/API_FIELDS.md is this table in prose (api_fields_test.ts keeps them equal).

import { invalidField } from "./api_error.ts";
import { type Field, isObject, type Json } from "./fields.ts";

export type Handling = "honoured" | "ignored" | "refused";

export interface FieldRule {
  readonly handling: Handling;
  /** What the server does with the field: the last column of the docs table. */
  readonly note: string;
  /** Values of a refused field that ask for nothing: accepted as if the field were absent. */
  readonly neutral?: (value: Json) => boolean;
}

/** Field name (dotted for a key of a nested object: `thinking.budget_tokens`) → rule. */
export type FieldTable = Readonly<Record<string, FieldRule>>;

export interface RouteFields {
  /** The heading of the route's section in docs/API_FIELDS.md. */
  readonly route: string;
  readonly fields: FieldTable;
}

const honoured = (note: string): FieldRule => ({ handling: "honoured", note });
const ignored = (note: string): FieldRule => ({ handling: "ignored", note });
const refused = (note: string, neutral?: (value: Json) => boolean): FieldRule => ({
  handling: "refused",
  note,
  neutral,
});
const is = (...values: Json[]) => (v: Json) => values.includes(v);
const emptyList = (v: Json) => Array.isArray(v) && v.length === 0;

/** Anthropic POST /v1/messages. */
const MESSAGES: FieldTable = {
  model: honoured("any id is accepted; replies name the loaded model"),
  max_tokens: honoured("required, at least 1"),
  messages: honoured(
    "user, assistant and mid-conversation system turns; a final assistant " +
      "turn is a prefill",
  ),
  system: honoured("string or text blocks; Claude Code's billing-header block is dropped"),
  stop_sequences: honoured("generation stops before the first one produced"),
  stream: honoured("SSE events as Anthropic sends them"),
  temperature: honoured("0 to 1; omitted: the head's --temperature; 0 is greedy"),
  top_p: honoured("nucleus cut over the candidates"),
  top_k: honoured("candidates sampled from; omitted: the head's --top-k"),
  tools: honoured("custom tools; Anthropic-hosted tool types are not offered to the model"),
  tool_choice: honoured("auto, none; any and tool force a call by grammar"),
  "tool_choice.type": honoured("auto, any, tool, none"),
  "tool_choice.name": honoured("the forced tool"),
  "tool_choice.disable_parallel_tool_use": refused(
    "true is not supported (the model may call several tools)",
    is(false),
  ),
  thinking: honoured("turns the template's reasoning on or off"),
  "thinking.type": honoured("enabled and adaptive turn reasoning on, disabled off"),
  "thinking.budget_tokens": ignored("no separate reasoning budget: max_tokens bounds the reply"),
  "thinking.display": ignored("reasoning is always returned in full"),
  metadata: ignored("metadata"),
  "metadata.user_id": ignored("metadata"),
  output_config: honoured("an object; see its keys"),
  "output_config.effort": ignored("no effort control; the model reasons as its template says"),
  "output_config.format": honoured(
    "{type: json_schema, schema}: the reply is JSON of the schema (docs/STRUCTURED_OUTPUT.md)",
  ),
  output_format: honoured("the structured-outputs beta's name of output_config.format"),
  service_tier: ignored("one tier"),
  inference_geo: ignored("runs where the head runs"),
  cache_control: ignored("prefix caching is automatic"),
  context_management: ignored("the server does not edit the conversation"),
  container: refused("no code-execution containers"),
  mcp_servers: refused("no MCP connector", emptyList),
};

/** Anthropic POST /v1/messages/count_tokens: the same body, counted and never generated. */
const COUNT_TOKENS: FieldTable = {
  ...MESSAGES,
  max_tokens: ignored("only the prompt is counted"),
  stop_sequences: ignored("only the prompt is counted"),
  stream: ignored("only the prompt is counted"),
  temperature: ignored("only the prompt is counted"),
  top_p: ignored("only the prompt is counted"),
  top_k: ignored("only the prompt is counted"),
  "output_config.format": ignored("only the prompt is counted"),
  output_format: ignored("only the prompt is counted"),
};

/** Sampling extensions llama.cpp and vLLM accept on their OpenAI routes. */
const OPENAI_EXTENSIONS: FieldTable = {
  top_k: honoured("extension: candidates sampled from; omitted: the head's --top-k"),
  min_p: honoured("extension: drops candidates below min_p times the best one's probability"),
  repeat_penalty: honoured(
    "extension (llama.cpp): 0.001 to 1000, over the last repeat_last_n tokens of prompt " +
      "and output, applied to the full logits on the last stage",
  ),
  repeat_last_n: honoured(
    "extension (llama.cpp): the repeat_penalty window, default 64, at " +
      "most 1024",
  ),
};

/** Sampling fields OpenAI's chat and completions routes share. */
const OPENAI_SAMPLING: FieldTable = {
  model: honoured("any id is accepted; replies name the loaded model"),
  temperature: honoured("0 to 2; omitted: the head's --temperature; 0 is greedy"),
  top_p: honoured("nucleus cut over the candidates"),
  seed: honoured("the same seed and request give the same reply"),
  stop: honoured("a string or strings; generation stops before the first one produced"),
  stream: honoured("chunks ending in data: [DONE]"),
  stream_options: honoured("an object; see its keys"),
  "stream_options.include_usage": honoured("a last chunk with usage"),
  "stream_options.include_obfuscation": ignored("no obfuscation padding is sent"),
  n: honoured("1 only; other values are refused"),
  presence_penalty: honoured(
    "-2 to 2, over the generated tokens (the last 1024), applied to " +
      "the full logits on the last stage",
  ),
  frequency_penalty: honoured(
    "-2 to 2, over the generated tokens (the last 1024), applied to " +
      "the full logits on the last stage",
  ),
  logit_bias: honoured(
    "token id to -100..100, added to its logit on the last stage; at most " +
      "1024 entries",
  ),
  user: ignored("metadata"),
  ...OPENAI_EXTENSIONS,
};

/** OpenAI POST /v1/chat/completions. */
const CHAT: FieldTable = {
  ...OPENAI_SAMPLING,
  messages: honoured(
    "system, developer, user, assistant (with tool_calls) and tool turns; " +
      "text content only",
  ),
  max_completion_tokens: honoured("output token limit; omitted: until the end or a full context"),
  max_tokens: honoured("the older name of max_completion_tokens"),
  tools: honoured("function tools"),
  tool_choice: honoured("none, auto, required or a named function (forced by grammar)"),
  parallel_tool_calls: refused(
    "false is not supported (the model may call several tools)",
    is(true),
  ),
  reasoning_effort: honoured("none turns the template's reasoning off, any other value on"),
  chat_template_kwargs: honoured("extension: an object; see its keys"),
  "chat_template_kwargs.enable_thinking": honoured("turns the template's reasoning on or off"),
  response_format: honoured(
    "text, json_object, or json_schema {name, schema, strict}: the reply is that JSON " +
      "(docs/STRUCTURED_OUTPUT.md)",
  ),
  logprobs: honoured("true: each token's log-probability under the model (logprobs.content)"),
  top_logprobs: honoured("0 to 20 alternatives per token; needs logprobs: true"),
  metadata: ignored("metadata"),
  safety_identifier: ignored("metadata"),
  prompt_cache_key: ignored("prefix caching is automatic"),
  prompt_cache_retention: ignored("prefix caching is automatic"),
  service_tier: ignored("one tier"),
  store: ignored("nothing is stored; there is no stored-completions API"),
  modalities: refused("text output only", (v) => Array.isArray(v) && v.every((m) => m === "text")),
  audio: refused("no audio output"),
  prediction: refused("no predicted outputs"),
  web_search_options: refused("no web search"),
  verbosity: refused("no verbosity control"),
  functions: refused("deprecated; use tools"),
  function_call: refused("deprecated; use tool_choice"),
};

/** OpenAI POST /v1/completions (legacy text completions). */
const COMPLETIONS: FieldTable = {
  ...OPENAI_SAMPLING,
  prompt: honoured("a string, token ids, or a list of one of those; several prompts are refused"),
  max_tokens: honoured("output token limit, at least 1, default 16"),
  echo: honoured("the prompt text precedes the completion"),
  logprobs: honoured(
    "0 to 5: each token's log-probability and that many alternatives; not with echo",
  ),
  best_of: refused("values above 1 are not supported", is(1)),
  suffix: refused("no insertion (fill-in-the-middle) mode", is("")),
};

/** llama.cpp POST /completion. */
const LLAMA_COMPLETION: FieldTable = {
  prompt: honoured("a string, token ids, or a list mixing both; no template is applied"),
  model: ignored("the loaded model answers"),
  n_predict: honoured("output token limit; -1 (default): until the end or a full context"),
  stream: honoured("data: frames, the last one with stop: true"),
  stop: honoured("strings; generation stops before the first one produced"),
  temperature: honoured("omitted: the head's --temperature; 0 is greedy"),
  top_k: honoured("candidates sampled from; 0 or omitted: the head's --top-k"),
  top_p: honoured("nucleus cut over the candidates"),
  min_p: honoured("drops candidates below min_p times the best one's probability"),
  min_keep: honoured("top_p and min_p keep at least this many candidates"),
  seed: honoured("-1 or omitted: random; the same seed and request give the same reply"),
  repeat_penalty: honoured(
    "0.001 to 1000, over the last repeat_last_n tokens of prompt and output, applied " +
      "to the full logits on the last stage",
  ),
  repeat_last_n: honoured(
    "the penalty window, default 64, at most 1024; -1: the context when " +
      "it is at most 1024",
  ),
  presence_penalty: honoured("-1000 to 1000, over the same window as repeat_penalty"),
  frequency_penalty: honoured("-1000 to 1000, over the same window as repeat_penalty"),
  logit_bias: honoured(
    "[[id or text, bias or false], ...] or {id or text: bias}, bias within ±1e9; false bans; " +
      "text biases each of its tokens; at most 1024 entries and 1024 tokens",
  ),
  ignore_eos: honoured("end-of-generation tokens are banned"),
  n_probs: honoured("top candidates with log-probabilities per generated token"),
  cache_prompt: honoured(
    "true (default): the prompt minus its last token is cached for the " +
      "next request; false: the prefix cache is neither read nor written",
  ),
  return_tokens: honoured("the generated ids in tokens"),
  id_slot: ignored("slots are assigned by the scheduler"),
  n_keep: ignored("the context never shifts: an overflowing prompt is refused"),
  typical_p: refused("no locally typical sampling", is(1)),
  dynatemp_range: refused("no dynamic temperature", is(0)),
  dynatemp_exponent: ignored("used only with dynatemp_range"),
  mirostat: refused("no mirostat", is(0)),
  mirostat_tau: ignored("used only with mirostat"),
  mirostat_eta: ignored("used only with mirostat"),
  dry_multiplier: refused("no DRY sampling", is(0)),
  dry_base: ignored("used only with dry_multiplier"),
  dry_allowed_length: ignored("used only with dry_multiplier"),
  dry_penalty_last_n: ignored("used only with dry_multiplier"),
  dry_sequence_breakers: ignored("used only with dry_multiplier"),
  xtc_probability: refused("no XTC sampling", is(0)),
  xtc_threshold: ignored("used only with xtc_probability"),
  top_n_sigma: refused("no top-n-sigma sampling", is(-1)),
  grammar: honoured('GBNF the reply follows (docs/STRUCTURED_OUTPUT.md); "": none'),
  json_schema: honoured("the reply is JSON of this schema (docs/STRUCTURED_OUTPUT.md)"),
  post_sampling_probs: refused("n_probs are the model's probabilities, before sampling", is(false)),
  samplers: refused("the sampler order is fixed"),
  n_indent: refused("no indentation control", is(0)),
  n_cmpl: refused("values above 1 are not supported", is(1)),
  n_cache_reuse: refused("no KV shifting", is(0)),
  t_max_predict_ms: refused("no time limit", is(0)),
  timings_per_token: refused("timings come with the last frame only", is(false)),
  return_progress: refused("no prompt progress frames", is(false)),
  response_fields: refused("the response shape is fixed", emptyList),
  lora: refused("no LoRA adapters", emptyList),
};

/** llama.cpp POST /tokenize. */
const TOKENIZE: FieldTable = {
  content: honoured("the text to tokenize, up to four contexts of tokens"),
  add_special: honoured("true: BOS first when the model's tokenizer adds one (Qwen's do not)"),
  parse_special: honoured("false: special-token text is tokenized as plain text"),
  with_pieces: honoured("each id comes with its piece (text, or bytes when not UTF-8)"),
};

/** llama.cpp POST /detokenize. */
const DETOKENIZE: FieldTable = {
  tokens: honoured("token ids to text, up to four contexts of them"),
};

/** Every route that takes a JSON body, in the order of docs/API_FIELDS.md. */
export const ROUTE_FIELDS: readonly RouteFields[] = [
  { route: "POST /v1/messages", fields: MESSAGES },
  { route: "POST /v1/messages/count_tokens", fields: COUNT_TOKENS },
  { route: "POST /v1/chat/completions", fields: CHAT },
  { route: "POST /v1/completions", fields: COMPLETIONS },
  { route: "POST /completion", fields: LLAMA_COMPLETION },
  { route: "POST /tokenize", fields: TOKENIZE },
  { route: "POST /detokenize", fields: DETOKENIZE },
];

export function fieldsOf(route: string): FieldTable {
  const found = ROUTE_FIELDS.find((r) => r.route === route);
  if (!found) throw new RangeError(`No field table for ${route}`);
  return found.fields;
}

/**
 * Refuses, by name, a key of `field`'s object that `table` does not list, or a refused field
 * holding a value that asks for something; then does the same inside each listed nested object.
 * `prefix` is the dotted name of `field` in the table ("" at the top).
 */
export function checkFields(field: Field, table: FieldTable, prefix = ""): void {
  const value = field.value;
  if (!isObject(value)) return; // The route's typed read names a wrong type.
  for (const [key, v] of Object.entries(value)) {
    const name = prefix + key;
    const rule = table[name];
    const at = field.key(key);
    if (!rule) {
      throw invalidField(
        at.path,
        "unknown field; this server does not know it (docs/API_FIELDS.md lists the fields)",
      );
    }
    if (v === null) continue;
    if (rule.handling === "refused" && !rule.neutral?.(v)) {
      throw invalidField(at.path, `not supported by this server: ${rule.note}`);
    }
    if (isObject(v) && Object.keys(table).some((k) => k.startsWith(`${name}.`))) {
      checkFields(at, table, `${name}.`);
    }
  }
}
