// Tests for lib/server/json_body.ts: bodies across slice boundaries parse as JSON.parse does, and
// deep nesting, too many values, bad UTF-8, empty and oversize bodies are refused before parsing.

import assert from "node:assert/strict";
import { ApiError } from "./api_error.ts";
import { MAX_JSON_DEPTH, MAX_JSON_VALUES, readJsonBody } from "./json_body.ts";

const MiB = 1 << 20;

function post(body: string | Uint8Array<ArrayBuffer>): Request {
  return new Request("http://head.test/v1/messages", { method: "POST", body });
}

async function refusal(body: string | Uint8Array<ArrayBuffer>, limit = 32 * MiB) {
  const e = await readJsonBody(post(body), limit).then(() => undefined, (e) => e);
  assert.ok(e instanceof ApiError, `expected an ApiError, got ${e}`);
  return e;
}

Deno.test("bodies whose strings, escapes and characters straddle slice boundaries parse unchanged", async () => {
  // Each filler puts the interesting bytes right at the 1 MiB slice boundary; the brackets after
  // them are still string text, and would be too deep if an escape were taken for the string's end.
  const brackets = "[".repeat(MAX_JSON_DEPTH + 1);
  const tricky = ['\\"', "\\\\", '\\\\\\"', "é", "漢", "😀", "]}[{,:", "\\u0041"];
  for (const t of tricky) {
    for (let shift = -6; shift <= 2; shift++) {
      const head = '{"a":"';
      const filler = "x".repeat(MiB - head.length + shift);
      const text = `${head}${filler}${t}${brackets}","b":[1,{"c":"]"}],"d":"\\\\"}`;
      assert.deepEqual(await readJsonBody(post(text), 32 * MiB), JSON.parse(text), `${t} ${shift}`);
    }
  }
});

Deno.test("nesting past the limit and too many values are 400s naming the limit", async () => {
  const deep = "[".repeat(MAX_JSON_DEPTH + 1) + "]".repeat(MAX_JSON_DEPTH + 1);
  assert.match((await refusal(deep)).message, new RegExp(`deeper than ${MAX_JSON_DEPTH} levels`));
  const ok = `{"a":${"[".repeat(MAX_JSON_DEPTH - 1)}${"]".repeat(MAX_JSON_DEPTH - 1)}}`;
  assert.ok(await readJsonBody(post(ok), MiB));
  const many = `{"a":[${"0,".repeat(MAX_JSON_VALUES)}0]}`;
  assert.match(
    (await refusal(many)).message,
    new RegExp(`more than ${MAX_JSON_VALUES} JSON values`),
  );
  // Brackets, commas and colons inside strings are text, not structure.
  const quoted = JSON.stringify({ a: "[{,:".repeat(MAX_JSON_VALUES) });
  assert.deepEqual(await readJsonBody(post(quoted), 32 * MiB), JSON.parse(quoted));
});

Deno.test("bad UTF-8, empty, oversize and non-object bodies are refused", async () => {
  const badUtf8 = Uint8Array.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]);
  assert.match((await refusal(badUtf8)).message, /not UTF-8/);
  assert.match((await refusal("")).message, /has no body/);
  const big = await refusal(JSON.stringify({ a: "x".repeat(2000) }), 1000);
  assert.equal(big.status("anthropic"), 413);
  assert.match((await refusal("[1]")).message, /must be a JSON object, got an array/);
  assert.match((await refusal('{"a": ')).message, /not valid JSON/);
});
