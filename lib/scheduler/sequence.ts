// One request's generation state: prompt, limits, sampler, stop conditions and its event stream.
// The scheduler feeds it the last stage's output per step; lib/server reads its events.

import type { LastOutput, LogitAdjust, LogitBias } from "../../engine/stage.ts";
import { LogitAdjuster, noPenalties, type PenaltyOptions } from "../sampling/penalties.ts";
import { sampleToken, speculativeToken, SplitMix64 } from "../sampling/sample.ts";
import type { TextTokenizer } from "../tokenizer/tokenizer.ts";

export interface SamplingOptions {
  /** 0 is greedy: the last stage's argmax, exactly. */
  readonly temperature: number;
  /** Candidates the last stage returns and the sampler draws from. */
  readonly topK: number;
  readonly topP: number;
  /** Drops candidates below minP times the best one's probability (0: off). */
  readonly minP?: number;
  /** The top-p and min-p cuts keep at least this many candidates. */
  readonly minKeep?: number;
  readonly seed: bigint;
  /** Logit bias and repetition penalties, applied to the full logits on the last stage. */
  readonly penalties?: PenaltyOptions;
}

/**
 * Restricts which tokens may come next (a grammar). Its mask travels with each step to the last
 * stage, which applies it to the logits, so the greedy id and every candidate already fit.
 */
export interface TokenConstraint {
  /**
   * The tokens allowed next (bit i & 31 of word i >> 5) when `remaining` tokens may still be
   * generated, this one included. Asynchronous: working it out may take long enough that it lets
   * the event loop turn meanwhile.
   */
  mask(remaining: number): Promise<Uint32Array>;
  accept(id: number): void;
  /** The grammar is complete: generation ends here. */
  readonly done: boolean;
}

export interface SequenceRequest {
  readonly prompt: readonly number[];
  /**
   * Tokens of the conversation history at the start of the prompt: the state there is
   * snapshotted for the next turn, which starts with the same tokens.
   */
  readonly cacheBoundary?: number;
  /** False: the prefix cache is neither read nor written for this request. Default true. */
  readonly cache?: boolean;
  readonly maxTokens: number;
  readonly stop?: readonly string[];
  readonly sampling: SamplingOptions;
  readonly constraint?: TokenConstraint;
  /**
   * Report each generated token's log-probability and those of this many best candidates
   * (0: the token's own only); undefined: none.
   */
  readonly logprobs?: number;
  /** Ids that end generation (they are output); default the tokenizer's end-of-generation ids. */
  readonly stopIds?: ReadonlySet<number>;
  readonly signal?: AbortSignal;
}

export type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "constraint";

export interface Usage {
  readonly promptTokens: number;
  /** Prompt tokens restored from the prefix cache instead of being computed. */
  readonly cachedTokens: number;
  /** Prompt tokens computed here and then written into the prefix cache. */
  readonly cacheWriteTokens: number;
  readonly outputTokens: number;
}

/** The last stage's candidates for one generated token and its normaliser. */
export type Candidates = Pick<LastOutput, "top" | "lse">;

/**
 * Log-probabilities of a generated token and of the best candidates, from the last stage's
 * logits and their log-sum-exp over the whole vocabulary (after the run's adjustments).
 */
export interface TokenProbs {
  readonly logprob: number;
  /** The best candidates, descending, with the logit each came from. */
  readonly top: readonly {
    readonly id: number;
    readonly logprob: number;
    readonly logit: number;
  }[];
}

export type SequenceEvent =
  | {
    readonly type: "start";
    readonly promptTokens: number;
    readonly cachedTokens: number;
    readonly cacheWriteTokens: number;
  }
  | {
    readonly type: "token";
    readonly id: number;
    /** Text this token releases: whole characters, minus any possible start of a stop string. */
    readonly text: string;
    readonly probs?: TokenProbs;
  }
  /** Held-back text released at the end (an unfinished character, a stop string's start). */
  | { readonly type: "text"; readonly text: string }
  | {
    readonly type: "end";
    readonly reason: StopReason;
    readonly stopSequence: string | null;
    readonly usage: Usage;
  }
  | { readonly type: "error"; readonly error: unknown };

/** Thrown inside the scheduler when a sequence's client has gone. */
export class CancelledError extends Error {
  override name = "CancelledError";
}

/**
 * Finds stop strings in streamed text. Text that could still turn into a stop string is held
 * back, so text after (or inside) a stop string is never released.
 */
export class StopMatcher {
  readonly #stops: readonly string[];
  #held = "";

  constructor(stops: readonly string[]) {
    this.#stops = stops.filter((s) => s.length > 0);
  }

  /** The text safe to release, and the stop string when one completed. */
  push(text: string): { text: string; stop: string | null } {
    const buffer = this.#held + text;
    let at = -1;
    let stop: string | null = null;
    for (const s of this.#stops) {
      const i = buffer.indexOf(s);
      if (i !== -1 && (at === -1 || i < at)) {
        at = i;
        stop = s;
      }
    }
    if (stop !== null) {
      this.#held = "";
      return { text: buffer.slice(0, at), stop };
    }
    let keep = 0;
    for (const s of this.#stops) {
      for (let n = Math.min(s.length - 1, buffer.length); n > keep; n--) {
        if (buffer.endsWith(s.slice(0, n))) {
          keep = n;
          break;
        }
      }
    }
    this.#held = buffer.slice(buffer.length - keep);
    return { text: buffer.slice(0, buffer.length - keep), stop: null };
  }

  /** Held text, released when generation ends for another reason. */
  flush(): string {
    const held = this.#held;
    this.#held = "";
    return held;
  }
}

/**
 * A sequence from admission to its end. The scheduler calls begin, then pick/accept per
 * generated token, then finish or fail; each call turns into events on `events`.
 */
export class Sequence {
  readonly id: string;
  readonly request: SequenceRequest;
  readonly events: ReadableStream<SequenceEvent>;
  readonly #tokenizer: Pick<TextTokenizer, "tokenBytes">;
  readonly #rng: SplitMix64;
  readonly #adjuster: LogitAdjuster | undefined;
  readonly #stop: StopMatcher;
  readonly #decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  readonly #abort = new AbortController();
  #controller!: ReadableStreamDefaultController<SequenceEvent>;
  readonly #admittedAt = performance.now();
  #firstTokenMs: number | null = null;
  #outcome: StopReason | "error" | "cancelled" | null = null;
  #cachedTokens = 0;
  #cacheWriteTokens = 0;
  #outputTokens = 0;
  #ended = false;

  constructor(id: string, request: SequenceRequest, tokenizer: Pick<TextTokenizer, "tokenBytes">) {
    this.id = id;
    this.request = request;
    this.#tokenizer = tokenizer;
    this.#rng = new SplitMix64(request.sampling.seed);
    const penalties = request.sampling.penalties;
    this.#adjuster = penalties && !noPenalties(penalties)
      ? new LogitAdjuster(penalties, request.prompt)
      : undefined;
    this.#stop = new StopMatcher(request.stop ?? []);
    this.events = new ReadableStream<SequenceEvent>({
      start: (controller) => {
        this.#controller = controller;
      },
      cancel: () => this.cancel(),
    });
    const onAbort = () => this.cancel();
    request.signal?.addEventListener("abort", onAbort, { once: true });
    // The request's signal outlives the sequence: stop listening once it is over, so that only a
    // client going away while it runs counts.
    this.#abort.signal.addEventListener(
      "abort",
      () => request.signal?.removeEventListener("abort", onAbort),
      { once: true },
    );
    if (request.signal?.aborted) this.cancel();
  }

  /** Aborted when the client goes away (or the sequence ended): the scheduler stops it. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  get ended(): boolean {
    return this.#ended;
  }

  get outputTokens(): number {
    return this.#outputTokens;
  }

  /** Prompt tokens the prefix cache supplied. */
  get cachedTokens(): number {
    return this.#cachedTokens;
  }

  /** Milliseconds from admission to the first generated token; null before it. */
  get firstTokenMs(): number | null {
    return this.#firstTokenMs;
  }

  /** How it ended: a stop reason, an error, its client leaving; null while it runs. */
  get outcome(): StopReason | "error" | "cancelled" | null {
    return this.#outcome;
  }

  /** Ends the sequence at its next step; its events stream closes without an end event. */
  cancel(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#outcome = "cancelled";
    this.#abort.abort(new CancelledError(`Sequence ${this.id} was cancelled by its client`));
    try {
      this.#controller.close();
    } catch (e) {
      if (!(e instanceof TypeError)) throw e; // The reader cancelled the stream itself.
    }
  }

  /** Throws CancelledError when the client has gone. */
  checkCancelled(): void {
    if (this.#abort.signal.aborted) throw this.#abort.signal.reason;
  }

  /** Whether the last stage changes logits for this sequence (so no step may skip it). */
  get adjusting(): boolean {
    return this.#adjuster !== undefined;
  }

  /**
   * The logit changes every step of this sequence gets where they do not change with its tokens
   * (none, or a logit_bias and bans alone), for a stage that runs its steps itself
   * (Stage.decodeFused); undefined where penalties make each step's own.
   */
  stepBias(): LogitBias[] | undefined {
    if (!this.#adjuster) return [];
    return this.#adjuster.constant ? this.#adjuster.adjustments() : undefined;
  }

  /** Candidates to ask the last stage for at each step. */
  topk(vocabSize: number, maxTopk: number): number {
    const { logprobs, sampling } = this.request;
    // A greedy token's own logit is the top candidate's: asking for one is enough.
    const probs = logprobs === undefined ? 0 : Math.max(logprobs, 1);
    const wanted = Math.max(sampling.temperature > 0 ? sampling.topK : 0, probs);
    return Math.min(wanted, vocabSize, maxTopk);
  }

  /**
   * The logit adjustments of the step whose token will sit at position `pos` of a context of
   * `ctx`: the penalties' records and the constraint's mask, sized for the tokens that may still
   * follow.
   */
  async adjust(pos: number, ctx: number): Promise<LogitAdjust | undefined> {
    const { constraint, maxTokens } = this.request;
    const bias = this.#adjuster?.adjustments();
    if (!constraint) return bias ? { bias } : undefined;
    const remaining = Math.min(maxTokens - this.#outputTokens, ctx - pos + 1);
    return { mask: await constraint.mask(remaining), ...(bias ? { bias } : {}) };
  }

  /**
   * Prefill starts after `cachedTokens` restored tokens; the next `cacheWriteTokens` are to be
   * written into the prefix cache (the end event says whether they were).
   */
  begin(cachedTokens: number, cacheWriteTokens: number): void {
    this.#cachedTokens = cachedTokens;
    this.#emit({
      type: "start",
      promptTokens: this.request.prompt.length,
      cachedTokens,
      cacheWriteTokens,
    });
  }

  /** The prefix cache now holds the state after the first `tokens` prompt tokens. */
  cacheWritten(tokens: number): void {
    this.#cacheWriteTokens = tokens - this.#cachedTokens;
  }

  /** The next token from the last stage's output (adjusted by `adjust`) for the final position. */
  pick(greedy: number, top: LastOutput["top"]): number {
    return sampleToken(greedy, top, this.request.sampling, this.#rng);
  }

  /**
   * The next `n` draws of this sequence's stream, for a stage that samples its next n tokens
   * itself (Stage.decodeFused): the draws pick() would take for them, one a token.
   */
  draws(n: number): Uint32Array {
    return Uint32Array.from({ length: n }, () => this.#rng.nextU32());
  }

  /**
   * The token at a speculative step's position whose draft is `draft`, from its greedy id and
   * candidates, with this sequence's sampler and stream (lib/sampling/sample.ts
   * speculativeToken): the draft, kept, or another token in its place.
   */
  pickDrafted(
    draft: number,
    greedy: number,
    top: LastOutput["top"],
  ): { readonly id: number; readonly kept: boolean } {
    return speculativeToken(draft, greedy, top, this.request.sampling, this.#rng);
  }

  /**
   * Records a generated token and emits its text; returns false when generation must stop
   * (the sequence has then ended with its stop reason). `eog` says the id ends generation.
   */
  accept(id: number, out: Candidates, eog: boolean, contextFull: boolean): boolean {
    this.#firstTokenMs ??= performance.now() - this.#admittedAt;
    this.#outputTokens++;
    const { constraint, maxTokens, logprobs } = this.request;
    constraint?.accept(id);
    this.#adjuster?.accept(id);
    const probs = logprobs === undefined ? undefined : this.#probs(id, out, logprobs);
    if (eog) {
      this.#emit({ type: "token", id, text: "", probs });
      this.#finish("end_turn", null);
      return false;
    }
    const piece = this.#decoder.decode(this.#tokenizer.tokenBytes(id, { specials: false }), {
      stream: true,
    });
    const { text, stop } = this.#stop.push(piece);
    this.#emit({ type: "token", id, text, probs });
    if (stop !== null) this.#finish("stop_sequence", stop);
    else if (constraint?.done) this.#finish("constraint", null);
    else if (this.#outputTokens >= maxTokens || contextFull) this.#finish("max_tokens", null);
    else return true;
    return false;
  }

  /** Ends with an error event (after the tokens already sent). */
  fail(error: unknown): void {
    if (this.#ended) return;
    this.#outcome = "error";
    this.#emit({ type: "error", error });
    this.#close();
  }

  #finish(reason: StopReason, stopSequence: string | null): void {
    this.#outcome = reason;
    if (reason !== "stop_sequence") {
      const rest = this.#stop.push(this.#decoder.decode()).text + this.#stop.flush();
      if (rest) this.#emit({ type: "text", text: rest });
    }
    this.#emit({
      type: "end",
      reason,
      stopSequence,
      usage: {
        promptTokens: this.request.prompt.length,
        cachedTokens: this.#cachedTokens,
        cacheWriteTokens: this.#cacheWriteTokens,
        outputTokens: this.#outputTokens,
      },
    });
    this.#close();
  }

  #close(): void {
    this.#ended = true;
    this.#abort.abort(new CancelledError(`Sequence ${this.id} has ended`));
    this.#controller.close();
  }

  #emit(event: SequenceEvent): void {
    if (!this.#ended) this.#controller.enqueue(event);
  }

  #probs(id: number, { top, lse }: Candidates, n: number): TokenProbs {
    const chosen = top.find((c) => c.id === id);
    return {
      logprob: chosen ? chosen.logit - lse : -Infinity,
      top: top.slice(0, n).map((c) => ({ id: c.id, logprob: c.logit - lse, logit: c.logit })),
    };
  }
}
