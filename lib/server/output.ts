// Sequence events → content blocks: plain text, <think> reasoning and <tool_call> tool calls.
// Sits between lib/scheduler/sequence.ts and the API encoders (events.ts, openai.ts).

import type { SequenceEvent, StopReason, Usage } from "../scheduler/sequence.ts";
import { type ApiError, toApiError } from "./api_error.ts";
import { isObject, type Json, type JsonObject } from "./fields.ts";
import { schemaError } from "../grammar/json_schema.ts";

export interface ToolSpec {
  readonly name: string;
  readonly description?: string;
  readonly inputSchema: JsonObject;
  /** Where the schema sits in the request, for errors ("tools.0.input_schema"). */
  readonly schemaPath: string;
}

export type BlockStart =
  | { readonly type: "text" }
  | { readonly type: "thinking" }
  | { readonly type: "tool_use"; readonly id: string; readonly name: string };

export type ReplyStopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use";

/** A generated token's bytes and log-probability, with the best candidates' (OpenAI logprobs). */
export interface TokenLogprob {
  readonly bytes: Uint8Array;
  readonly logprob: number;
  readonly top: readonly { readonly bytes: Uint8Array; readonly logprob: number }[];
}

export type ReplyEvent =
  | {
    readonly type: "start";
    readonly promptTokens: number;
    readonly cachedTokens: number;
    readonly cacheWriteTokens: number;
  }
  | { readonly type: "block_start"; readonly index: number; readonly block: BlockStart }
  | {
    readonly type: "delta";
    readonly index: number;
    readonly kind: "text" | "thinking" | "input_json";
    readonly text: string;
  }
  /** `signature` closes a thinking block (clients need one to send the block back). */
  | { readonly type: "block_stop"; readonly index: number; readonly signature?: string }
  /** Log-probabilities of the tokens whose text the following deltas carry. */
  | { readonly type: "logprobs"; readonly tokens: readonly TokenLogprob[] }
  | {
    readonly type: "end";
    readonly stopReason: ReplyStopReason;
    readonly stopSequence: string | null;
    readonly usage: Usage;
  }
  | { readonly type: "error"; readonly error: ApiError };

export interface OutputOptions {
  /** Tools whose <tool_call> blocks become tool_use blocks; empty: calls stay text. */
  readonly tools: readonly ToolSpec[];
  /** A <think> opening the reply becomes a thinking block. */
  readonly thinking: boolean;
  /** The prompt ends inside an open <think> (the template opened it). */
  readonly startInThinking?: boolean;
  /** Makes a tool_use id. */
  readonly newToolId: () => string;
  /** A token's bytes, for log-probabilities (the tokenizer's tokenBytes). */
  readonly tokenBytes: (id: number) => Uint8Array;
  readonly log?: (line: string) => void;
}

const TOOL_OPEN = "<tool_call>";
const TOOL_CLOSE = "</tool_call>";
const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

/** How many chars at the end of `text` could begin one of `markers`. */
function partialMarker(text: string, markers: readonly string[]): number {
  let keep = 0;
  for (const m of markers) {
    for (let n = Math.min(m.length - 1, text.length); n > keep; n--) {
      if (text.endsWith(m.slice(0, n))) {
        keep = n;
        break;
      }
    }
  }
  return keep;
}

function trailingSpace(text: string): number {
  return text.length - text.trimEnd().length;
}

/** An opaque, stable signature for a thinking block's text (FNV-1a, 64-bit). */
export function thinkingSignature(text: string): string {
  let h = 0xcbf29ce484222325n;
  for (const byte of new TextEncoder().encode(text)) {
    h = BigInt.asUintN(64, (h ^ BigInt(byte)) * 0x100000001b3n);
  }
  return `tandem-${h.toString(16).padStart(16, "0")}`;
}

/**
 * A tool call's JSON (`{"name": …, "arguments": {…}}`) checked against the tools: the call, or
 * why it is not one. Arguments given as a JSON string are parsed.
 */
export function parseToolCall(
  body: string,
  tools: readonly ToolSpec[],
): { name: string; input: JsonObject } | { error: string } {
  let call: unknown;
  try {
    call = JSON.parse(body);
  } catch (e) {
    return { error: `its body is not JSON: ${(e as Error).message}` };
  }
  if (!isObject(call) || typeof call.name !== "string") {
    return { error: `its body has no "name" string` };
  }
  const tool = tools.find((t) => t.name === call.name);
  if (!tool) return { error: `it names "${call.name}", which is not one of the request's tools` };
  let input: Json | undefined = call.arguments ?? call.parameters ?? {};
  if (typeof input === "string") {
    try {
      input = JSON.parse(input) as Json;
    } catch (e) {
      return { error: `its arguments string is not JSON: ${(e as Error).message}` };
    }
  }
  if (!isObject(input)) return { error: `its arguments are not an object` };
  const problem = schemaError(input, tool.inputSchema);
  if (problem) return { error: `its arguments do not fit the input_schema: ${problem}` };
  return { name: tool.name, input };
}

type Mode = "text" | "thinking" | "tool";

/** The state machine behind OutputStream: push text, get events. */
export class OutputParser {
  readonly #options: OutputOptions;
  readonly #emit: (event: ReplyEvent) => void;
  #mode: Mode;
  /** Text not yet turned into events (a possible marker start, trailing spaces). */
  #pending = "";
  #tool = "";
  #open: { index: number; kind: "text" | "thinking"; text: string } | undefined;
  #blocks = 0;
  /** Nothing but whitespace came so far (a <think> may still open the reply). */
  #atStart = true;
  #stripLeading = false;
  #toolUses = 0;

  constructor(options: OutputOptions, emit: (event: ReplyEvent) => void) {
    this.#options = options;
    this.#emit = emit;
    this.#mode = options.startInThinking ? "thinking" : "text";
    this.#stripLeading = !!options.startInThinking;
  }

  push(text: string): void {
    this.#pending += text;
    this.#drain(false);
  }

  /** Flushes everything held and closes the open block. */
  finish(): void {
    this.#drain(true);
    if (this.#mode === "tool") {
      this.#text(TOOL_OPEN + this.#tool);
      this.#tool = "";
      this.#mode = "text";
    }
    this.#closeBlock();
  }

  end(reason: StopReason, stopSequence: string | null, usage: Usage): void {
    this.finish();
    const ended = reason === "end_turn" || reason === "constraint";
    const stopReason: ReplyStopReason = ended
      ? (this.#toolUses > 0 ? "tool_use" : "end_turn")
      : reason;
    this.#emit({ type: "end", stopReason, stopSequence, usage });
  }

  #markers(): string[] {
    if (this.#mode === "thinking") return [THINK_CLOSE];
    if (this.#mode === "tool") return [TOOL_CLOSE];
    const markers = [];
    if (this.#options.tools.length > 0) markers.push(TOOL_OPEN);
    if (this.#options.thinking && this.#atStart) markers.push(THINK_OPEN);
    return markers;
  }

  #drain(final: boolean): void {
    while (true) {
      const markers = this.#markers();
      let at = -1;
      let marker = "";
      for (const m of markers) {
        const i = this.#pending.indexOf(m);
        if (i !== -1 && (at === -1 || i < at)) {
          at = i;
          marker = m;
        }
      }
      if (at === -1) break;
      const before = this.#pending.slice(0, at);
      if (marker === THINK_OPEN && before.trim() !== "") {
        // Reasoning only counts when it opens the reply; later it is text.
        this.#atStart = false;
        continue;
      }
      this.#pending = this.#pending.slice(at + marker.length);
      this.#onMarker(before, marker);
    }
    if (this.#mode === "tool") {
      const keep = final ? 0 : partialMarker(this.#pending, [TOOL_CLOSE]);
      this.#tool += this.#pending.slice(0, this.#pending.length - keep);
      this.#pending = this.#pending.slice(this.#pending.length - keep);
      return;
    }
    // Hold a possible marker start and the whitespace before it (dropped at a block change).
    let held = 0;
    if (!final) {
      const p = this.#pending;
      held = partialMarker(p, this.#markers());
      held += trailingSpace(p.slice(0, p.length - held));
    }
    const out = this.#pending.slice(0, this.#pending.length - held);
    this.#pending = this.#pending.slice(this.#pending.length - held);
    if (final && this.#open === undefined && out.trim() === "") return;
    this.#content(out);
  }

  #onMarker(before: string, marker: string): void {
    switch (marker) {
      case TOOL_OPEN:
        this.#content(before.trimEnd());
        this.#mode = "tool";
        this.#tool = "";
        return;
      case THINK_OPEN:
        this.#closeBlock();
        this.#mode = "thinking";
        this.#stripLeading = true;
        return;
      case THINK_CLOSE:
        this.#content(before.trimEnd());
        this.#closeBlock();
        this.#mode = "text";
        this.#atStart = false;
        this.#stripLeading = true;
        return;
      case TOOL_CLOSE:
        this.#tool += before;
        this.#mode = "text";
        this.#finishTool();
    }
  }

  #finishTool(): void {
    const body = this.#tool.trim();
    this.#tool = "";
    const call = parseToolCall(body, this.#options.tools);
    if ("error" in call) {
      this.#options.log?.(`a <tool_call> stays text: ${call.error}`);
      this.#text(TOOL_OPEN + body + TOOL_CLOSE);
      return;
    }
    this.#closeBlock();
    const index = this.#blocks++;
    const id = this.#options.newToolId();
    this.#emit({ type: "block_start", index, block: { type: "tool_use", id, name: call.name } });
    this.#emit({ type: "delta", index, kind: "input_json", text: JSON.stringify(call.input) });
    this.#emit({ type: "block_stop", index });
    this.#toolUses++;
    this.#atStart = false;
    this.#stripLeading = true;
  }

  /** Text in the current mode (thinking or text). */
  #content(text: string): void {
    if (this.#mode === "thinking") this.#delta("thinking", text);
    else this.#text(text);
  }

  #text(text: string): void {
    this.#delta("text", text);
  }

  #delta(kind: "text" | "thinking", raw: string): void {
    let text = raw;
    if (this.#stripLeading) {
      text = text.trimStart();
      if (!text) return;
      this.#stripLeading = false;
    }
    if (!text) return;
    if (kind === "text" && text.trim()) this.#atStart = false;
    if (this.#open?.kind !== kind) {
      this.#closeBlock();
      const index = this.#blocks++;
      this.#open = { index, kind, text: "" };
      this.#emit({ type: "block_start", index, block: { type: kind } });
    }
    this.#open.text += text;
    this.#emit({ type: "delta", index: this.#open.index, kind, text });
  }

  #closeBlock(): void {
    const open = this.#open;
    if (!open) return;
    this.#open = undefined;
    this.#emit(
      open.kind === "thinking"
        ? { type: "block_stop", index: open.index, signature: thinkingSignature(open.text) }
        : { type: "block_stop", index: open.index },
    );
  }
}

/**
 * Sequence events → reply events (TransformStream around OutputParser). Anything that fails
 * here ends the reply with an error event, and the generation with it.
 */
export class OutputStream extends TransformStream<SequenceEvent, ReplyEvent> {
  constructor(options: OutputOptions) {
    let parser: OutputParser;
    const handle = (
      event: SequenceEvent,
      controller: TransformStreamDefaultController<ReplyEvent>,
    ) => {
      switch (event.type) {
        case "start":
          controller.enqueue(event);
          return;
        case "token":
          if (event.probs) {
            const bytes = options.tokenBytes;
            controller.enqueue({
              type: "logprobs",
              tokens: [{
                bytes: bytes(event.id),
                logprob: event.probs.logprob,
                top: event.probs.top.map((c) => ({ bytes: bytes(c.id), logprob: c.logprob })),
              }],
            });
          }
          parser.push(event.text);
          return;
        case "text":
          parser.push(event.text);
          return;
        case "end":
          parser.end(event.reason, event.stopSequence, event.usage);
          return;
        case "error":
          parser.finish();
          controller.enqueue({ type: "error", error: toApiError(event.error) });
      }
    };
    super({
      start(controller) {
        parser = new OutputParser(options, (e) => controller.enqueue(e));
      },
      transform(event, controller) {
        try {
          handle(event, controller);
        } catch (e) {
          controller.enqueue({ type: "error", error: toApiError(e) });
          controller.terminate();
        }
      },
    });
  }
}

export type ReplyBlock =
  | { readonly type: "text"; text: string }
  | { readonly type: "thinking"; thinking: string; signature: string }
  | { readonly type: "tool_use"; readonly id: string; readonly name: string; input: JsonObject };

/** A whole reply, for non-streaming responses. */
export interface Reply {
  readonly blocks: ReplyBlock[];
  /** Per generated token, when log-probabilities were asked for. */
  readonly logprobs: readonly TokenLogprob[];
  readonly stopReason: ReplyStopReason;
  readonly stopSequence: string | null;
  readonly usage: Usage;
}

/**
 * Reads reply events to the end. Throws the ApiError of an error event, or a CancelledError-like
 * Error when the stream closed without an end (the client went away).
 */
export async function collectReply(events: ReadableStream<ReplyEvent>): Promise<Reply> {
  const blocks: ReplyBlock[] = [];
  const logprobs: TokenLogprob[] = [];
  const json = new Map<number, string>();
  for await (const e of events) {
    switch (e.type) {
      case "logprobs":
        logprobs.push(...e.tokens);
        break;
      case "block_start":
        blocks[e.index] = e.block.type === "text"
          ? { type: "text", text: "" }
          : e.block.type === "thinking"
          ? { type: "thinking", thinking: "", signature: "" }
          : { type: "tool_use", id: e.block.id, name: e.block.name, input: {} };
        break;
      case "delta": {
        const b = blocks[e.index];
        if (b.type === "text") b.text += e.text;
        else if (b.type === "thinking") b.thinking += e.text;
        else json.set(e.index, (json.get(e.index) ?? "") + e.text);
        break;
      }
      case "block_stop": {
        const b = blocks[e.index];
        if (b.type === "thinking") b.signature = e.signature ?? "";
        if (b.type === "tool_use") b.input = JSON.parse(json.get(e.index) ?? "{}");
        break;
      }
      case "end":
        return {
          blocks,
          logprobs,
          stopReason: e.stopReason,
          stopSequence: e.stopSequence,
          usage: e.usage,
        };
      case "error":
        throw e.error;
    }
  }
  throw new Error("The reply ended early: its client went away");
}
