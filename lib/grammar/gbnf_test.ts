// Tests of lib/grammar/gbnf.ts: llama.cpp's GBNF syntax read into grammars (what they take whole,
// as a prefix, or not), and grammars refused with the reason and line.

import assert from "node:assert/strict";
import { parseGbnf } from "./gbnf.ts";

Deno.test("GBNF rules, strings, classes, groups and repetitions read as llama.cpp's", () => {
  const g = parseGbnf(String.raw`
# A yes/no answer, or a list of 1 to 3 small numbers.
root   ::= answer | "[" num ("," ws num){0,2} "]"
answer ::= ("yes" | "no") "!"?
num    ::= [1-9] [0-9]? | "0"
ws     ::= [ \t\n]*
`);
  const cases: Record<string, string> = {
    "yes": "complete",
    "no!": "complete",
    "[7]": "complete",
    "[10,  0,\t99]": "complete",
    "[1,2,3,4]": "invalid",
    "[01]": "invalid",
    "[1,": "partial",
    "maybe": "invalid",
  };
  for (const [text, verdict] of Object.entries(cases)) assert.equal(g.match(text), verdict, text);

  const escapes = parseGbnf(String.raw`root ::= "\x41\u00e9\n" [^"\\]+ "\""` + "\n");
  assert.equal(escapes.match('Aé\nxyz"'), "complete");
  assert.equal(escapes.match('Aé\n\\"'), "invalid");
  // A rule may continue after '|' on the next line, and its body may start on the next line.
  const spread = parseGbnf('root ::=\n  "a" |\n  "b" rest\nrest ::= "c"+\n');
  assert.equal(spread.match("bccc"), "complete");
  assert.equal(spread.match("a"), "complete");
  assert.equal(parseGbnf("root ::= .+\n").match("😀 anything"), "complete");
});

Deno.test("GBNF mistakes are refused with the rule or line", () => {
  const refused: [string, RegExp][] = [
    ['item ::= "x"\n', /no "root" rule/],
    ["root ::= missing\n", /rule "missing" is used but not defined/],
    ['root ::= "a"\nroot ::= "b"\n', /rule "root" is defined twice \(line 2\)/],
    ['root ::= root "a" | "b"\n', /rule "root" can reach itself without reading any text/],
    ['root ::= ("a"?)*\n', /can reach itself without reading any text/],
    ['root ::= "a\n', /unterminated string/],
    ["root ::= [a-\n", /unterminated character class|out of order/],
    ['root ::= "a"{3,1}\n', /repetition \{3,1\}/],
    ['root ::= "a"{20000}\n', /repetition \{20000,/],
    ["root ::= <[1234]>\n", /token references/],
    ['root ::= "x" item ::= "y"\n', /rule "item" must start on its own line/],
    ['root ::= "x" : "y"\n', /an unexpected ":"/],
    ['root ::= "a" b\nb ::= "b" b\n', /no text/],
  ];
  for (const [text, message] of refused) {
    assert.throws(() => parseGbnf(text), message, JSON.stringify(text));
  }
});
