// Counters the scheduler keeps while it runs: per-stage time and tokens, token totals, time to
// first token. lib/server/metrics.ts renders them as Prometheus text; /health reads them too.

/** Cumulative-bucket histogram in the Prometheus sense (upper bounds in seconds). */
export class Histogram {
  readonly bounds: readonly number[];
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(bounds: readonly number[]) {
    this.bounds = bounds;
    this.counts = bounds.map(() => 0);
  }

  observe(value: number): void {
    this.sum += value;
    this.count++;
    this.bounds.forEach((b, i) => {
      if (value <= b) this.counts[i]++;
    });
  }
}

/** Time one stage spent, split by phase; for a remote stage it includes the network. */
export class StageTimes {
  readonly layers: string;
  /** "local", or the next stage's address. */
  readonly where: string;
  prefillMs = 0;
  prefillTokens = 0;
  decodeMs = 0;
  decodeTokens = 0;
  errors = 0;

  constructor(layers: string, where: string) {
    this.layers = layers;
    this.where = where;
  }

  /**
   * A call of `tokens` positions took `ms`: generated tokens' rows ("decode": one step, fused
   * steps, a speculative step's verify run) or a prompt's.
   */
  record(ms: number, tokens: number, phase: "prompt" | "decode"): void {
    if (phase === "decode") {
      this.decodeMs += ms;
      this.decodeTokens += tokens;
    } else {
      this.prefillMs += ms;
      this.prefillTokens += tokens;
    }
  }

  /** Mean decode time per token, null before the first decode step. */
  get decodeMsPerToken(): number | null {
    return this.decodeTokens ? this.decodeMs / this.decodeTokens : null;
  }
}

export class SchedulerStats {
  readonly stages: readonly StageTimes[];
  readonly timeToFirstToken = new Histogram([
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
  ]);
  promptTokens = 0;
  cachedTokens = 0;
  outputTokens = 0;
  sequences = { finished: 0, cancelled: 0, failed: 0 };
  /** Sequences resumed after their next stage failed them (one per resumption). */
  resumes = 0;
  /** Speculative steps: verify runs, the drafts they verified and those the model accepted. */
  drafts = { verifies: 0, drafted: 0, accepted: 0 };

  constructor(stages: readonly StageTimes[]) {
    this.stages = stages;
  }
}
