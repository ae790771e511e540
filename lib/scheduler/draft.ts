// Speculative decoding's drafts and when to use them: tokens proposed on the head for the model to
// verify in one rewindable run (lib/scheduler/scheduler.ts), and the per-sequence gate that keeps
// drafting only while it pays.

import type { Kind } from "../cli.ts";

/** How a head drafts (--draft): never, while it pays ("auto"), or always, that many a step. */
export type DraftMode = "off" | "auto" | number;

/** Drafts a step under "auto": three verified with the token before them, four rows a run. */
export const AUTO_DRAFTS = 3;

/** Most drafts a step under a fixed --draft: a verify run is one run, within every stage's batch. */
export const MAX_DRAFTS = 15;

/** Drafts a step under `mode` (0 for "off"). */
export function draftsOf(mode: DraftMode): number {
  return mode === "off" ? 0 : mode === "auto" ? AUTO_DRAFTS : mode;
}

/**
 * Positions every stage keeps to rewind under `mode`: a step verifies its drafts and the token
 * before them.
 */
export function rewindFor(mode: DraftMode): number {
  const drafts = draftsOf(mode);
  return drafts ? drafts + 1 : 0;
}

/** The --draft flag's values (lib/cli.ts), for the head and the bench. */
export const DRAFT_MODE: Kind<DraftMode> = { value: "off|auto|N", parse: parseDraftMode };

/** Parses --draft: off, auto, or a whole number of drafts 1..MAX_DRAFTS. */
export function parseDraftMode(text: string): DraftMode {
  if (text === "off" || text === "auto") return text;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < 1 || n > MAX_DRAFTS) {
    // The flag parser names the flag and the value before it.
    throw new RangeError(`expected off, auto, or a whole number of drafts 1..${MAX_DRAFTS}`);
  }
  return n;
}

/**
 * Proposes up to `most` tokens to follow `history` (a sequence's prompt and generated tokens):
 * lookupDraft, or what a test or another drafter supplies.
 */
export type Drafter = (history: readonly number[], most: number) => number[];

/** Longest and shortest suffix a lookup matches (tokens). */
const MAX_NGRAM = 4;
const MIN_NGRAM = 2;
/** How far back a lookup searches, tokens: bounds its cost at a few thousand comparisons. */
const LOOKUP_WINDOW = 4096;

/**
 * Prompt lookup: where the sequence's last n tokens (n from MAX_NGRAM down to MIN_NGRAM) occurred
 * before, most recently first, the up to `most` tokens that followed them then. Code, quoted
 * documents and tool results repeat what the prompt holds, and a model continuing them greedily
 * often repeats it token for token. Empty when nothing matches.
 */
export function lookupDraft(tokens: readonly number[], most: number): number[] {
  const end = tokens.length;
  const from = Math.max(0, end - LOOKUP_WINDOW);
  for (let n = Math.min(MAX_NGRAM, end - 1); n >= MIN_NGRAM; n--) {
    // An earlier occurrence ending at i (exclusive) with at least one token after it.
    for (let i = end - 1; i - n >= from; i--) {
      let match = true;
      for (let j = 1; j <= n && match; j++) match = tokens[i - j] === tokens[end - j];
      if (match) return tokens.slice(i, Math.min(i + most, end));
    }
  }
  return [];
}

/** Weight of the newest observation in the gate's running means. */
const EMA = 0.25;
/**
 * Tokens a sequence decodes plainly after drafting stopped paying, before it tries again; each
 * pause that follows a losing try doubles it, up to MAX_DRAFT_BACKOFF (where drafts never pay,
 * a losing speculative step costs several plain ones), and a try that pays brings it back.
 */
export const DRAFT_BACKOFF = 32;
export const MAX_DRAFT_BACKOFF = 512;

/**
 * What drafting with the model's MTP head earned across a head's sequences (one per scheduler):
 * the pause its last losing try set and the one a next loss would set, or none since a try paid.
 * A sequence's gate starts from it, so where the head's drafts never pay (random weights; an MTP
 * head the model disagrees with) only the first sequences pay for finding that out, each later
 * one waiting as long as the last one learned before it tries; a try that pays lets the next
 * sequences draft at once. Prompt lookup's drafts depend on each prompt, so its gates start fresh.
 */
export class DraftRecord {
  /** Tokens a new sequence decodes plainly before its first try. */
  pause = 0;
  /** The pause a losing try sets. */
  backoff = DRAFT_BACKOFF;
}

/**
 * Whether one sequence drafts ("auto"): it compares the tokens a speculative step yields per ms
 * (accepted drafts plus the model's own token, over drafting, verifying and rewinding) with a
 * plain step's, both measured as the sequence goes, and stops drafting for DRAFT_BACKOFF tokens
 * when the speculative step yields less. It drafts only once a plain step has been measured: a
 * sequence drafting from its first token would have nothing to compare with. Made with the
 * head's DraftRecord, it starts paused and backed off as the record stands and keeps it current.
 */
export class DraftGate {
  #plainMsPerToken: number | undefined;
  #verifyTokensPerMs: number | undefined;
  readonly #record: DraftRecord | undefined;
  #pausedUntil: number;
  #backoff: number;
  /** Verify runs and the drafts they accepted, for the head's statistics. */
  verifies = 0;
  drafted = 0;
  accepted = 0;

  constructor(record?: DraftRecord) {
    this.#record = record;
    this.#pausedUntil = record?.pause ?? 0;
    this.#backoff = record?.backoff ?? DRAFT_BACKOFF;
  }

  /** Whether the sequence, having generated `generated` tokens, should draft its next step. */
  drafts(generated: number): boolean {
    return this.#plainMsPerToken !== undefined && generated >= this.#pausedUntil;
  }

  /**
   * Whether the sequence may draft again before it has generated `end` tokens (a try needs a
   * token after its drafts): where not, its runs can skip the MTP block.
   */
  reaches(end: number): boolean {
    return this.#pausedUntil < end - 1;
  }

  /** A plain step (or fused steps) took `ms` for `tokens` tokens. */
  plain(ms: number, tokens: number): void {
    this.#plainMsPerToken = mean(this.#plainMsPerToken, ms / tokens);
  }

  /**
   * A speculative step of `drafted` drafts took `ms` and the model accepted `accepted` of them,
   * after `generated` tokens; pauses drafting when it yields fewer tokens a ms than plain steps.
   */
  verified(ms: number, drafted: number, accepted: number, generated: number): void {
    this.verifies++;
    this.drafted += drafted;
    this.accepted += accepted;
    this.#verifyTokensPerMs = mean(this.#verifyTokensPerMs, (accepted + 1) / ms);
    const plain = this.#plainMsPerToken;
    if (plain === undefined) return;
    if (this.#verifyTokensPerMs * plain < 1) {
      const pause = this.#backoff;
      this.#pausedUntil = generated + pause;
      this.#backoff = Math.min(2 * pause, MAX_DRAFT_BACKOFF);
      // The next try starts from what it measures then.
      this.#verifyTokensPerMs = undefined;
      this.#remember(pause);
    } else {
      this.#backoff = DRAFT_BACKOFF;
      this.#remember(0);
    }
  }

  #remember(pause: number): void {
    if (!this.#record) return;
    this.#record.pause = pause;
    this.#record.backoff = this.#backoff;
  }
}

function mean(old: number | undefined, x: number): number {
  return old === undefined ? x : old + EMA * (x - old);
}
