// Tests of lib/grammar/regex.ts: the patterns it runs match what ECMAScript's RegExp matches, the
// constructs it cannot run are refused by name, and hostile patterns stay linear or are refused.

import assert from "node:assert/strict";
import { compilePattern, MAX_NFA_STATES, PatternError } from "./regex.ts";

const unit = () => 1;

/** Strings over a small alphabet, every length up to `max`, plus some longer and odd ones. */
function samples(alphabet: string, max: number): string[] {
  const out = [""];
  let level = [""];
  for (let n = 1; n <= max; n++) {
    level = level.flatMap((s) => [...alphabet].map((c) => s + c));
    out.push(...level);
  }
  return [...out, "2024-02-30", "a\nb", "é😀", "x".repeat(40), "ab-12_Z"];
}

Deno.test("patterns match exactly what RegExp(pattern, 'u').test matches", () => {
  const cases: [string, string][] = [
    ["^a+b?$", "ab"],
    ["ab|ba", "ab"],
    ["^(ab)*$", "ab"],
    ["a{2,3}", "ab"],
    ["^a{2}$|^b{1,}$", "ab"],
    ["^[a-c]{1,2}[^a]$", "abcd"],
    ["^\\d+(\\.\\d{1,2})?$", "1.2"],
    ["^\\w\\s?\\W$", "a -"],
    ["[^\\d]", "a1"],
    ["^.$", "a\n"],
    ["^(?:a|bc)+$", "abc"],
    ["^(?<x>a)b?$", "ab"],
    ["x*?y", "xy"],
    ["^[\\u0041-\\x43]$", "ABCD"],
    ["^\\u{1F600}$", "a"],
    ["^[-a]$", "a-b"],
    ["^$", "a"],
    ["", "a"],
  ];
  for (const [source, alphabet] of cases) {
    const ours = compilePattern(source, unit);
    const theirs = new RegExp(source, "u");
    for (const s of samples(alphabet, 4)) {
      assert.equal(ours.test(s), theirs.test(s), `${source} on ${JSON.stringify(s)}`);
    }
  }
});

Deno.test("constructs outside the supported syntax are refused with what they are", () => {
  const refused: [string, RegExp][] = [
    ["(a)\\1", /backreferences/],
    ["a(?=b)", /lookahead and lookbehind/],
    ["(?<!a)b", /lookahead and lookbehind/],
    ["\\bword", /word-boundary/],
    ["\\p{L}", /property escapes/],
    ["a(^b)", /'\^' and '\$' are supported only at the start and end/],
    ["a$b", /'\^' and '\$' are supported only at the start and end/],
    ["(", /a missing '\)'/],
    ["a)", /an unmatched '\)'/],
    ["[b-a]", /out of order/],
    ["a{3,1}", /out of order/],
    ["a**", /a quantifier after a quantifier/],
    ["a{", /a lone '\{'/],
    ["{", /an unexpected '\{'/],
    ["\\q", /an unknown escape '\\q'/],
    ["[\\d-z]", /a class escape/],
  ];
  for (const [source, message] of refused) {
    assert.throws(() => compilePattern(source, unit), (e) => {
      assert.ok(e instanceof PatternError, `${source}: ${e}`);
      assert.match(e.message, message, source);
      return true;
    });
  }
});

Deno.test("hostile patterns run in linear time or are refused by size", () => {
  // Catastrophic backtracking for RegExp; a few states here.
  const p = compilePattern("^(.+)+\\u0000$", unit);
  const t0 = performance.now();
  assert.equal(p.test("a".repeat(20_000)), false);
  assert.equal(p.test("a".repeat(20_000) + "\u0000"), true);
  assert.ok(performance.now() - t0 < 2000, "linear in the text");
  assert.ok(p.states.length < 32);
  // A pattern whose DFA would need 2^20 states stops at the bound instead of growing.
  const wide = compilePattern("^[ab]*a[ab]{19}$", unit);
  let x = 1;
  const bit = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 16) & 1;
  const text = Array.from({ length: 300_000 }, () => (bit() ? "a" : "b")).join("");
  assert.throws(() => wide.test(text), /more than 65536 state sets/);
  for (const source of ["((a{100}){100}){100}", "a{5000}", "(a|b){1000}(c{10}){10}"]) {
    assert.throws(
      () => compilePattern(source, unit),
      new RegExp(`at most ${MAX_NFA_STATES} are supported`),
      source,
    );
  }
});

Deno.test("step, meets and distance drive generation: prefixes, ranges and shortest completions", () => {
  const p = compilePattern("^ab{2,}c$", unit);
  let set = p.start;
  assert.equal(p.distance(set), 4);
  assert.ok(p.meets(set, 0x61, 0x61) && !p.meets(set, 0x62, 0x7a));
  assert.deepEqual(p.lengthsAfter(set, 0x61, 0x61), [3, Infinity]);
  assert.deepEqual(p.lengthsAfter(set, 0x62, 0x7a), [Infinity, -Infinity], "it reads no b-z");
  set = p.step(set, 0x61);
  assert.equal(p.distance(set), 3);
  assert.equal(p.step(set, 0x63), 0, "a dead prefix leaves no state");
  set = p.step(p.step(set, 0x62), 0x62);
  assert.equal(p.distance(set), 1);
  assert.ok(!p.accepts(set));
  assert.ok(p.accepts(p.step(set, 0x63)));
  // The cost function weighs characters: here a 'c' costs 5.
  const weighted = compilePattern("^ab{2,}c$", (s) => s.has(0x63) ? 5 : 1);
  assert.equal(weighted.distance(weighted.start), 8);
});

Deno.test("lengths: fewest and most characters to a match, through loops and long chains", () => {
  const cases: [string, number, number][] = [
    ["^[a-z]{2,8}$", 2, 8],
    ["^ab{2,}c$", 4, Infinity],
    ["abc", 3, Infinity],
    ["^(a*)*b?$", 0, Infinity],
    ["^(ab|abcd)-$", 3, 5],
    ["^a{1300}$", 1300, 1300],
  ];
  for (const [source, fewest, most] of cases) {
    const p = compilePattern(source, unit);
    assert.deepEqual(p.lengths(p.start), [fewest, most], source);
  }
  const p = compilePattern("^(x|ab{3,})$", unit);
  assert.deepEqual(p.lengths(p.step(p.start, 0x78)), [0, 0]);
  assert.deepEqual(p.lengthsAfter(p.start, 0x61, 0x61), [3, Infinity]);
  assert.deepEqual(p.lengths(0), [Infinity, -Infinity], "the dead state never matches");
  assert.equal(p.slack, 4, "the most any live state still lacks");
});
