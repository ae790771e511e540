// Tests of lib/scheduler/sequence.ts's text: generated ids become UTF-8-safe deltas on the token
// events (a character split across tokens waits for its last byte), flushed when it ends.

import assert from "node:assert/strict";
import { tinyTokenizer } from "../../tests/_tiny_tokenizer.ts";
import { Sequence } from "./sequence.ts";

/** A stand-in tokenizer whose token i is the i-th byte array. */
function piecesTokenizer(pieces: readonly number[][]) {
  return { tokenBytes: (id: number) => Uint8Array.from(pieces[id]) };
}

/** The non-empty text deltas a sequence emits for `ids`, ending at max_tokens after them. */
async function deltas(
  ids: readonly number[],
  tokenizer: ConstructorParameters<typeof Sequence>[2],
): Promise<string[]> {
  const sampling = { temperature: 0, topK: 0, topP: 1, seed: 0n };
  const seq = new Sequence("seq1", { prompt: [0], maxTokens: ids.length, sampling }, tokenizer);
  seq.begin(0, 0);
  for (const id of ids) seq.accept(id, { top: [], lse: 0 }, false, false);
  const events = await Array.fromAsync(seq.events);
  assert.equal(events.at(-1)?.type, "end");
  return events.flatMap((e) => e.type === "token" || e.type === "text" ? [e.text] : [])
    .filter((text) => text !== "");
}

Deno.test("a character split over tokens comes out once it is complete", async () => {
  // 😀 is F0 9F 98 80; 中 is E4 B8 AD.
  const t = piecesTokenizer([[0xf0, 0x9f], [0x98], [0x80, 0x41], [0xe4], [0xb8, 0xad, 0x42]]);
  assert.deepEqual(await deltas([0, 1, 2, 3, 4], t), ["😀A", "中B"]);
  assert.deepEqual(await deltas([0, 1, 2], t), ["😀A"]);
});

Deno.test("invalid bytes become U+FFFD and an unfinished character is flushed as one", async () => {
  const t = piecesTokenizer([[0x41], [0xff], [0xe2, 0x82], [0x42]]);
  assert.deepEqual(await deltas([0, 1, 3], t), ["A", "\uFFFD", "B"]);
  assert.deepEqual(await deltas([0, 2], t), ["A", "\uFFFD"]);
  // A broken sequence followed by ASCII: the replacement and the letter come out together.
  assert.deepEqual(await deltas([2, 3], t), ["\uFFFDB"]);
});

Deno.test("a leading BOM is kept", async () => {
  const t = piecesTokenizer([[0xef, 0xbb], [0xbf, 0x68]]);
  assert.deepEqual(await deltas([0, 1], t), ["\uFEFFh"]);
});

Deno.test("test-vocabulary deltas join to the text, each whole and non-empty", async () => {
  const { tokenizer } = tinyTokenizer();
  const text = "Emoji 🧑🏿‍🚀🇯🇵 and 中文：今天天气很好 — naïve e\u0301";
  const ids = tokenizer.encode(text);
  // The case only tests something if some token ends inside a character.
  assert.ok(ids.some((id) => tokenizer.decode([id]).includes("\uFFFD")));
  const out = await deltas(ids, tokenizer);
  assert.equal(out.join(""), text);
  assert.ok(out.every((d) => !d.includes("\uFFFD")));
  assert.ok(out.length > 1);
});
