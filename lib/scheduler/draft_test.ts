// Tests of lib/scheduler/draft.ts: prompt lookup, the --draft values and the gate's decisions.

import assert from "node:assert/strict";
import {
  DRAFT_BACKOFF,
  DraftGate,
  DraftRecord,
  lookupDraft,
  MAX_DRAFT_BACKOFF,
  MAX_DRAFTS,
  parseDraftMode,
  rewindFor,
} from "./draft.ts";

Deno.test("lookupDraft proposes what followed the latest earlier occurrence of the longest suffix", () => {
  // "7 8 9" occurred twice before; the latest is followed by 4 5.
  const tokens = [7, 8, 9, 1, 2, 3, 7, 8, 9, 4, 5, 6, 0, 7, 8, 9];
  assert.deepEqual(lookupDraft(tokens, 2), [4, 5]);
  assert.deepEqual(lookupDraft(tokens, 8), [4, 5, 6, 0, 7, 8, 9]);
  // The 4-gram "0 7 8 9" never occurred before, so the lookup falls back to 3 tokens; a lone
  // token matches nothing (MIN_NGRAM is 2).
  assert.deepEqual(lookupDraft([1, 2, 9, 1, 2], 3), [9, 1, 2]);
  assert.deepEqual(lookupDraft([5, 1, 6, 1], 3), []);
  assert.deepEqual(lookupDraft([], 3), []);
  assert.deepEqual(lookupDraft([4, 4], 3), []);
});

Deno.test("--draft takes off, auto or 1..MAX_DRAFTS, and every stage keeps drafts + 1 positions", () => {
  assert.equal(parseDraftMode("off"), "off");
  assert.equal(parseDraftMode("auto"), "auto");
  assert.equal(parseDraftMode("5"), 5);
  for (const bad of ["0", `${MAX_DRAFTS + 1}`, "2.5", "-1", "on", ""]) {
    assert.throws(() => parseDraftMode(bad), /expected off, auto, or a whole number of drafts/);
  }
  assert.equal(rewindFor("off"), 0);
  assert.equal(rewindFor("auto"), 4);
  assert.equal(rewindFor(2), 3);
});

Deno.test("the draft gate pauses drafting while verify runs yield fewer tokens a ms than plain steps", () => {
  const gate = new DraftGate();
  assert.ok(!gate.drafts(0), "a plain step first: the cost drafting must beat");
  gate.plain(10, 1);
  assert.ok(gate.drafts(1), "then drafts until it knows better");
  // Three drafts kept of three: 4 tokens in 14 ms beat 1 in 10.
  gate.verified(14, 3, 3, 5);
  assert.ok(gate.drafts(9));
  // None kept, again and again: 1 token in 14 ms loses against 1 in 10 once the running mean
  // has fallen below it (the eighth such run, at 17 tokens), and it pauses for DRAFT_BACKOFF.
  let generated = 10;
  while (gate.drafts(generated)) gate.verified(14, 3, 0, generated++);
  assert.equal(generated, 18);
  assert.ok(!gate.drafts(17 + DRAFT_BACKOFF - 1));
  assert.ok(gate.drafts(17 + DRAFT_BACKOFF));
  // Each losing try after a pause pauses twice as long, up to MAX_DRAFT_BACKOFF.
  let at = 17 + DRAFT_BACKOFF;
  for (const pause of [64, 128, 256, MAX_DRAFT_BACKOFF, MAX_DRAFT_BACKOFF]) {
    gate.verified(14, 3, 0, at);
    assert.ok(!gate.drafts(at + pause - 1) && gate.drafts(at + pause), `paused ${pause}`);
    at += pause;
  }
  // A try that pays brings the pause back to DRAFT_BACKOFF, once losing tries drag the running
  // mean down again (the eighth).
  gate.verified(14, 3, 3, at);
  let next = at + 1;
  while (gate.drafts(next)) gate.verified(14, 3, 0, next++);
  assert.equal(next - at - 1, 8);
  assert.ok(!gate.drafts(next - 1 + DRAFT_BACKOFF - 1) && gate.drafts(next - 1 + DRAFT_BACKOFF));
  assert.deepEqual([gate.verifies, gate.drafted, gate.accepted], [9 + 5 + 1 + 8, 69, 6]);
});

Deno.test("a head's draft record starts each sequence where drafting last stood", () => {
  const record = new DraftRecord();
  // The head's first sequence loses every try: it pauses 32, 64 and 128 tokens.
  const first = new DraftGate(record);
  first.plain(10, 1);
  let at = 1;
  for (const pause of [DRAFT_BACKOFF, 64, 128]) {
    assert.ok(first.drafts(at));
    first.verified(14, 3, 0, at);
    assert.ok(!first.drafts(at + pause - 1) && first.drafts(at + pause), `paused ${pause}`);
    at += pause;
  }
  // The next sequence waits what the first learned last before its own first try, and a loss
  // there pauses it twice as long.
  const second = new DraftGate(record);
  second.plain(10, 1);
  assert.ok(!second.drafts(127) && second.drafts(128));
  second.verified(14, 3, 0, 128);
  assert.ok(!second.drafts(128 + 255) && second.drafts(128 + 256));
  // A try that pays, in any sequence, lets the next ones draft after their first plain step.
  second.verified(10, 3, 3, 400);
  const third = new DraftGate(record);
  assert.ok(!third.drafts(0));
  third.plain(10, 1);
  assert.ok(third.drafts(1));
  third.verified(14, 3, 0, 1);
  assert.ok(!third.drafts(1 + DRAFT_BACKOFF - 1) && third.drafts(1 + DRAFT_BACKOFF));
});
