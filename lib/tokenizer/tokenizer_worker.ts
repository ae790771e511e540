// The tokenizer thread's body: builds a TextTokenizer from the GGUF's tokenizer keys, then renders
// and tokenizes what tokenizer_thread.ts sends, so no prompt holds the head's event loop.

import type { GgufValue } from "../../engine/gguf/gguf_model.ts";
import { chatPrompt, type ChatPromptInput, countedIds } from "./chat_prompt.ts";
import { ChatTemplateError } from "./chat_template.ts";
import { TextTokenizer } from "./tokenizer.ts";

/** The first message: the tokenizer.* metadata and the chat template. */
export interface InitMessage {
  readonly meta: readonly (readonly [string, GgufValue])[];
  readonly template?: string;
}

export type Job =
  | {
    readonly id: number;
    readonly kind: "chat";
    readonly input: ChatPromptInput;
    readonly limit: number;
  }
  | {
    readonly id: number;
    readonly kind: "texts";
    readonly texts: readonly string[];
    readonly limit: number;
    readonly specials: boolean;
  };

export type Reply =
  | { readonly kind: "done"; readonly id: number; readonly result: unknown }
  | {
    readonly kind: "failed";
    readonly id: number;
    readonly template: boolean;
    readonly message: string;
  };

/** The worker globals this file uses (the project is type-checked with the window globals). */
const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<InitMessage | Job>) => void) | null;
  postMessage(message: Reply, transfer?: Transferable[]): void;
};

let tokenizer: TextTokenizer | undefined;
let template = "";

/** Ids of each text in turn, all of them cut short once their total passes `limit`. */
function texts(t: TextTokenizer, list: readonly string[], limit: number, specials: boolean) {
  const parts: Uint32Array<ArrayBuffer>[] = [];
  let tokens = 0;
  for (const text of list) {
    const part = countedIds(t, text, limit - tokens, specials);
    tokens += part.tokens;
    if (tokens > limit) return { parts: [], tokens };
    parts.push(part.ids);
  }
  return { parts, tokens };
}

scope.onmessage = (event) => {
  const message = event.data;
  if (!("id" in message)) {
    tokenizer = TextTokenizer.fromGguf(new Map(message.meta));
    template = message.template ?? "";
    return;
  }
  try {
    const t = tokenizer!;
    if (message.kind === "chat") {
      const result = chatPrompt(t, template, message.input, message.limit);
      scope.postMessage({ kind: "done", id: message.id, result }, [
        result.ids.buffer,
      ]);
    } else {
      const result = texts(t, message.texts, message.limit, message.specials);
      scope.postMessage(
        { kind: "done", id: message.id, result },
        result.parts.map((p) => p.buffer),
      );
    }
  } catch (e) {
    scope.postMessage(
      {
        kind: "failed",
        id: message.id,
        template: e instanceof ChatTemplateError,
        message: e instanceof Error ? e.message : String(e),
      },
    );
  }
};
