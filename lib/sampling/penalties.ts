// A request's logit bias and repetition penalties as per-step logit changes for the last stage
// (engine/stage.ts LogitBias records): built on the head from the tokens so far, sent each run.

import { type LogitBias, MAX_BIAS_PAIRS, MAX_REPEAT } from "../../engine/stage.ts";

/** Most logit_bias entries a request may carry. */
export const MAX_LOGIT_BIAS = 1024;
/**
 * Longest penalty window, in tokens: bounds the distinct ids a window can name, so a step's
 * records (bias + two windows) stay well under MAX_BIAS_PAIRS.
 */
export const MAX_PENALTY_WINDOW = 1024;

export interface PenaltyOptions {
  /** Token id → bias added to its logit; engine/stage.ts BAN bans the token. */
  readonly logitBias?: ReadonlyMap<number, number>;
  /**
   * llama.cpp's repeat_penalty (1: off; within MAX_REPEAT of 1) over the last `repeatLastN`
   * tokens of prompt and output.
   */
  readonly repeat?: number;
  readonly repeatLastN?: number;
  /** Subtracted once from the logit of every token in the window (0: off). */
  readonly presence?: number;
  /** Subtracted from a token's logit once per occurrence in the window (0: off). */
  readonly frequency?: number;
  /** Tokens the presence and frequency window spans, counted back from the last. */
  readonly penaltyLastN?: number;
  /**
   * Whether that window runs over prompt and output ("context": llama.cpp) or the output alone
   * ("output": OpenAI's definition, as vLLM reads it).
   */
  readonly penaltyScope?: "context" | "output";
}

/** True when the options change no logit. */
export function noPenalties(o: PenaltyOptions): boolean {
  return (o.logitBias?.size ?? 0) === 0 && (o.repeat ?? 1) === 1 && !o.presence && !o.frequency;
}

/**
 * Tracks the tokens a sequence has seen and turns its options into the adjustments of the next
 * step: one entry per distinct id that any of them touches, sorted by id, values rounded to f32
 * (what the wire and the GPU carry, so split and unsplit runs see the same numbers).
 */
export class LogitAdjuster {
  readonly #bias: ReadonlyMap<number, number>;
  readonly #repeat: number;
  readonly #repeatLastN: number;
  readonly #presence: number;
  readonly #frequency: number;
  readonly #penaltyLastN: number;
  readonly #outputOnly: boolean;
  /** The tail of prompt + output the windows need (trimmed as it grows). */
  #tokens: number[];
  #outputs = 0;

  constructor(options: PenaltyOptions, prompt: readonly number[]) {
    this.#bias = options.logitBias ?? new Map();
    this.#repeat = options.repeat ?? 1;
    this.#repeatLastN = this.#repeat === 1 ? 0 : options.repeatLastN ?? 64;
    this.#presence = options.presence ?? 0;
    this.#frequency = options.frequency ?? 0;
    const penalised = this.#presence !== 0 || this.#frequency !== 0;
    this.#penaltyLastN = penalised ? options.penaltyLastN ?? MAX_PENALTY_WINDOW : 0;
    this.#outputOnly = options.penaltyScope === "output";
    if (!(this.#repeat >= 1 / MAX_REPEAT && this.#repeat <= MAX_REPEAT)) {
      throw new RangeError(
        `Cannot use a repeat penalty of ${this.#repeat}: expected ${1 / MAX_REPEAT}..${MAX_REPEAT}`,
      );
    }
    if (this.#bias.size > MAX_LOGIT_BIAS) {
      throw new RangeError(
        `Cannot bias ${this.#bias.size} tokens: at most ${MAX_LOGIT_BIAS} per request`,
      );
    }
    for (const [what, n] of [["repeat", this.#repeatLastN], ["penalty", this.#penaltyLastN]]) {
      if (!Number.isInteger(n) || (n as number) < 0 || (n as number) > MAX_PENALTY_WINDOW) {
        throw new RangeError(
          `Cannot use a ${what} window of ${n} tokens: expected 0..${MAX_PENALTY_WINDOW}`,
        );
      }
    }
    this.#tokens = prompt.slice(prompt.length - this.#window);
  }

  /** Whether every step gets the same changes: a bias alone, no penalty window. */
  get constant(): boolean {
    return this.#window === 0;
  }

  /** Tokens of history any window looks at. */
  get #window(): number {
    return Math.max(this.#repeatLastN, this.#penaltyLastN);
  }

  /** Records a generated token. */
  accept(id: number): void {
    this.#tokens.push(id);
    this.#outputs++;
    if (this.#tokens.length > 2 * this.#window) {
      this.#tokens = this.#tokens.slice(this.#tokens.length - this.#window);
    }
  }

  /** The logit changes for the step after the tokens seen so far. */
  adjustments(): LogitBias[] {
    const t = this.#tokens;
    const repeated = new Set(t.slice(Math.max(0, t.length - this.#repeatLastN)));
    let from = t.length - this.#penaltyLastN;
    if (this.#outputOnly) from = Math.max(from, t.length - this.#outputs);
    const counts = new Map<number, number>();
    for (let i = Math.max(0, from); i < t.length; i++) {
      counts.set(t[i], (counts.get(t[i]) ?? 0) + 1);
    }
    const ids = new Set([...this.#bias.keys(), ...repeated, ...counts.keys()]);
    const out: LogitBias[] = [];
    for (const id of [...ids].sort((a, b) => a - b)) {
      const count = counts.get(id) ?? 0;
      const a = {
        id,
        bias: Math.fround(this.#bias.get(id) ?? 0),
        repeat: Math.fround(repeated.has(id) ? this.#repeat : 1),
        subtract: Math.fround(count * this.#frequency + (count > 0 ? this.#presence : 0)),
      };
      if (a.bias !== 0 || a.repeat !== 1 || a.subtract !== 0) out.push(a);
    }
    if (out.length > MAX_BIAS_PAIRS) {
      throw new RangeError(
        `Cannot change ${out.length} logits: at most ${MAX_BIAS_PAIRS} per step`,
      );
    }
    return out;
  }
}
