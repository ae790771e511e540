// GET /metrics: Prometheus text for HTTP requests (counted here) and the scheduler's stats
// (tokens, time to first token, per-stage time per token, queue, slots, stage errors).

import type { LinkStatus } from "../scheduler/link.ts";
import type { Scheduler } from "../scheduler/scheduler.ts";
import type { Histogram } from "../scheduler/stats.ts";

/** Requests answered, by route and status. */
export class RequestCounter {
  readonly #counts = new Map<string, number>();

  count(route: string, status: number): void {
    const key = `${route}\u0000${status}`;
    this.#counts.set(key, (this.#counts.get(key) ?? 0) + 1);
  }

  entries(): { route: string; status: number; count: number }[] {
    return [...this.#counts].map(([key, count]) => {
      const [route, status] = key.split("\u0000");
      return { route, status: Number(status), count };
    });
  }
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function labels(pairs: Record<string, string | number>): string {
  const body = Object.entries(pairs).map(([k, v]) => `${k}="${escapeLabel(String(v))}"`);
  return body.length ? `{${body.join(",")}}` : "";
}

class Exposition {
  readonly lines: string[] = [];

  family(name: string, type: string, help: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }

  sample(name: string, value: number, pairs: Record<string, string | number> = {}): void {
    this.lines.push(`${name}${labels(pairs)} ${Number.isFinite(value) ? value : "NaN"}`);
  }

  histogram(name: string, h: Histogram): void {
    h.bounds.forEach((b, i) => this.sample(`${name}_bucket`, h.counts[i], { le: b }));
    this.sample(`${name}_bucket`, h.count, { le: "+Inf" });
    this.sample(`${name}_sum`, h.sum);
    this.sample(`${name}_count`, h.count);
  }
}

/** The exposition text (format 0.0.4). `link` is the next stage's status, if any. */
export function renderMetrics(
  requests: RequestCounter,
  scheduler: Scheduler,
  link: LinkStatus | undefined,
): string {
  const m = new Exposition();
  const s = scheduler.stats;
  m.family("tandem_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const e of requests.entries()) {
    m.sample("tandem_requests_total", e.count, { route: e.route, status: e.status });
  }
  m.family("tandem_prompt_tokens_total", "counter", "Prompt tokens of started sequences.");
  m.sample("tandem_prompt_tokens_total", s.promptTokens);
  m.family(
    "tandem_cached_prompt_tokens_total",
    "counter",
    "Prompt tokens restored from the prefix cache instead of computed.",
  );
  m.sample("tandem_cached_prompt_tokens_total", s.cachedTokens);
  m.family("tandem_generated_tokens_total", "counter", "Tokens generated.");
  m.sample("tandem_generated_tokens_total", s.outputTokens);
  m.family("tandem_sequences_total", "counter", "Sequences ended, by outcome.");
  for (const [outcome, n] of Object.entries(s.sequences)) {
    m.sample("tandem_sequences_total", n, { outcome });
  }
  m.family(
    "tandem_sequence_resumes_total",
    "counter",
    "Sequences resumed after the next stage failed them (replayed once it answered again).",
  );
  m.sample("tandem_sequence_resumes_total", s.resumes);
  m.family(
    "tandem_draft_tokens_total",
    "counter",
    "Speculative decoding (--draft): tokens drafted and verified, and those the model accepted.",
  );
  m.sample("tandem_draft_tokens_total", s.drafts.drafted, { outcome: "verified" });
  m.sample("tandem_draft_tokens_total", s.drafts.accepted, { outcome: "accepted" });
  m.family(
    "tandem_time_to_first_token_seconds",
    "histogram",
    "From admission to the first generated token (queue wait and prefill included).",
  );
  m.histogram("tandem_time_to_first_token_seconds", s.timeToFirstToken);
  m.family(
    "tandem_stage_decode_ms_per_token",
    "gauge",
    "Mean time per decode step in each stage; a remote stage's includes the network.",
  );
  for (const st of s.stages) {
    m.sample("tandem_stage_decode_ms_per_token", st.decodeMsPerToken ?? NaN, {
      stage: st.layers,
      where: st.where,
    });
  }
  const phases = [
    ["decode", (st: typeof s.stages[number]) => [st.decodeMs, st.decodeTokens]],
    ["prefill", (st: typeof s.stages[number]) => [st.prefillMs, st.prefillTokens]],
  ] as const;
  m.family("tandem_stage_seconds_total", "counter", "Time spent in each stage, by phase.");
  for (const st of s.stages) {
    for (const [phase, get] of phases) {
      m.sample("tandem_stage_seconds_total", get(st)[0] / 1000, { stage: st.layers, phase });
    }
  }
  m.family("tandem_stage_tokens_total", "counter", "Positions run through each stage, by phase.");
  for (const st of s.stages) {
    for (const [phase, get] of phases) {
      m.sample("tandem_stage_tokens_total", get(st)[1], { stage: st.layers, phase });
    }
  }
  m.family("tandem_stage_errors_total", "counter", "Failed calls to each stage.");
  for (const st of s.stages) m.sample("tandem_stage_errors_total", st.errors, { stage: st.layers });
  if (link) {
    const stage = `${link.first}:${link.end}`;
    m.family("tandem_stage_up", "gauge", "1 when the next stage answered its last call.");
    m.sample("tandem_stage_up", link.up ? 1 : 0, { stage, address: link.address });
    m.family("tandem_stage_rtt_ms", "gauge", "Round trip of the last one-position frame.");
    m.sample("tandem_stage_rtt_ms", link.lastRttMs ?? NaN, { stage, address: link.address });
  }
  m.family("tandem_queue_depth", "gauge", "Admitted requests waiting for a slot.");
  m.sample("tandem_queue_depth", scheduler.queued);
  m.family("tandem_slots_busy", "gauge", "Slots running a sequence.");
  m.sample("tandem_slots_busy", scheduler.busy);
  m.family("tandem_slots", "gauge", "Slots the head runs.");
  m.sample("tandem_slots", scheduler.slots);
  return m.lines.join("\n") + "\n";
}
