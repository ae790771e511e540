// Messages + tools → prompt text, by rendering the model's Jinja tokenizer.chat_template.
// Called by the server with parsed requests; the result goes to lib/tokenizer/tokenizer.ts.

import { Template } from "@huggingface/jinja";

/** A text block of a multi-part message content. */
export interface ChatTextPart {
  readonly type: "text";
  readonly text: string;
}

/** An assistant's tool call, in the OpenAI/HF shape chat templates (and llama.cpp) expect. */
export interface ChatToolCall {
  readonly id?: string;
  readonly type: "function";
  readonly function: {
    readonly name: string;
    /** An object, or its JSON text (rendered verbatim). */
    readonly arguments: string | Readonly<Record<string, unknown>>;
  };
}

/** One message, with the field names templates read (snake_case, as in HF transformers). */
export interface ChatMessage {
  readonly role: "system" | "user" | "assistant" | "tool";
  readonly content: string | readonly ChatTextPart[] | null;
  /** An assistant's reasoning (Anthropic "thinking"), rendered inside <think></think>. */
  readonly reasoning_content?: string;
  readonly tool_calls?: readonly ChatToolCall[];
  /** For role "tool": the call this is the result of. */
  readonly tool_call_id?: string;
  readonly name?: string;
}

/** A tool the model may call; `parameters` is a JSON Schema. */
export interface ChatTool {
  readonly type: "function";
  readonly function: {
    readonly name: string;
    readonly description?: string;
    readonly parameters?: Readonly<Record<string, unknown>>;
  };
}

export interface ChatInput {
  readonly messages: readonly ChatMessage[];
  readonly tools?: readonly ChatTool[];
  /** End with the opening of an assistant turn for the model to complete. */
  readonly addGenerationPrompt?: boolean;
  /** False asks a thinking model to skip reasoning; left out, the template's default applies. */
  readonly enableThinking?: boolean;
  readonly bosToken?: string;
  readonly eosToken?: string;
}

/** A template that cannot be parsed or rendered for this input: the request's fault, or the file's. */
export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

// Parsing costs more than rendering, and a server renders the same template for every request.
let last: { readonly source: string; readonly template: Template } | undefined;

/**
 * Renders a chat template with the variables HF transformers and llama.cpp pass: `messages`,
 * `tools`, `add_generation_prompt`, `enable_thinking` (only when given), `bos_token`,
 * `eos_token`. Throws a ChatTemplateError naming the problem when it cannot be parsed or rendered.
 */
export function renderChat(template: string, input: ChatInput): string {
  if (last?.source !== template) {
    try {
      last = { source: template, template: new Template(template) };
    } catch (e) {
      throw new ChatTemplateError(
        `Cannot parse the chat template: ${errorText(e)}; check tokenizer.chat_template`,
      );
    }
  }
  const context: Record<string, unknown> = {
    messages: input.messages,
    add_generation_prompt: input.addGenerationPrompt ?? false,
    bos_token: input.bosToken ?? "",
    eos_token: input.eosToken ?? "",
  };
  // Templates test `tools` for truth and `enable_thinking` with `is defined`: pass only what
  // is set.
  if (input.tools !== undefined) context.tools = input.tools;
  if (input.enableThinking !== undefined) context.enable_thinking = input.enableThinking;
  try {
    return last.template.render(context);
  } catch (e) {
    throw new ChatTemplateError(`Cannot render the chat template: ${errorText(e)}`);
  }
}

function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
