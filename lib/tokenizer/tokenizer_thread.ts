// The head's side of the tokenizer thread: prompts are rendered and tokenized in a Worker
// (tokenizer_worker.ts) so that no request holds the event loop. Used by lib/server/prompt.ts.

import type { GgufValue } from "../../engine/gguf/gguf_model.ts";
import type { ChatPrompt, ChatPromptInput } from "./chat_prompt.ts";
import { ChatTemplateError } from "./chat_template.ts";
import type { InitMessage, Job, Reply } from "./tokenizer_worker.ts";

/** Ids of several texts (a /completion prompt's string parts), counted together. */
export interface CountedParts {
  /** Each text's ids; empty when the total is over the limit. */
  readonly parts: readonly Uint32Array[];
  /** The total, or when over the limit a lower bound on it, above the limit. */
  readonly tokens: number;
}

interface Pending {
  resolve(result: unknown): void;
  reject(error: Error): void;
}

type JobRequest =
  | { readonly kind: "chat"; readonly input: ChatPromptInput; readonly limit: number }
  | {
    readonly kind: "texts";
    readonly texts: readonly string[];
    readonly limit: number;
    readonly specials: boolean;
  };

/**
 * One worker thread holding the model's tokenizer and chat template. Jobs run there in arrival
 * order; a thread that dies fails the jobs it held and is replaced for the next one.
 */
export class TokenizerThread {
  readonly #init: InitMessage;
  readonly #pending = new Map<number, Pending>();
  #worker: Worker | undefined;
  #nextId = 0;
  #closed = false;

  private constructor(init: InitMessage) {
    this.#init = init;
  }

  /** Starts the thread with the tokenizer.* keys of `meta`; settles once it is ready. */
  static async start(
    meta: ReadonlyMap<string, GgufValue>,
    template?: string,
  ): Promise<TokenizerThread> {
    const keys = [...meta].filter(([key]) => key.startsWith("tokenizer.ggml."));
    const thread = new TokenizerThread({ meta: keys, template });
    await thread.#call({ kind: "texts", texts: [], limit: 0, specials: true });
    return thread;
  }

  /** Renders and tokenizes a chat; past `limit` tokens only a count comes back. */
  chat(input: ChatPromptInput, limit: number): Promise<ChatPrompt> {
    return this.#call({ kind: "chat", input, limit }) as Promise<ChatPrompt>;
  }

  /**
   * Tokenizes texts (control-token texts as those tokens unless `specials` is false); past
   * `limit` tokens in all only a count comes back.
   */
  texts(texts: readonly string[], limit: number, specials = true): Promise<CountedParts> {
    return this.#call({ kind: "texts", texts, limit, specials }) as Promise<CountedParts>;
  }

  /** Stops the thread; jobs still in it fail. */
  close(): void {
    this.#closed = true;
    this.#stop(new Error("Cannot tokenize: the tokenizer thread was closed"));
  }

  #call(request: JobRequest): Promise<unknown> {
    if (this.#closed) {
      return Promise.reject(new Error("Cannot tokenize: the tokenizer thread was closed"));
    }
    const worker = this.#worker ?? this.#spawn();
    const id = this.#nextId++;
    const done = Promise.withResolvers<unknown>();
    this.#pending.set(id, done);
    worker.postMessage({ ...request, id } satisfies Job);
    return done.promise;
  }

  #spawn(): Worker {
    const worker = new Worker(new URL("./tokenizer_worker.ts", import.meta.url).href, {
      type: "module",
    });
    worker.onmessage = (event: MessageEvent<Reply>) => {
      const reply = event.data;
      const job = this.#pending.get(reply.id);
      this.#pending.delete(reply.id);
      if (reply.kind === "done") job?.resolve(reply.result);
      else {
        job?.reject(
          reply.template ? new ChatTemplateError(reply.message) : new Error(reply.message),
        );
      }
    };
    worker.onerror = (event) => {
      event.preventDefault();
      this.#stop(new Error(`The tokenizer thread failed: ${event.message}`));
    };
    worker.postMessage(this.#init);
    this.#worker = worker;
    return worker;
  }

  #stop(error: Error): void {
    this.#worker?.terminate();
    this.#worker = undefined;
    for (const job of this.#pending.values()) job.reject(error);
    this.#pending.clear();
  }
}
