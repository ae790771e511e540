// engine/gguf/model_errors.ts: a reader's refusal, which knows the key but not the file, is thrown
// again naming the file, as its own kind, keeping the reader's error as its cause.

import assert from "node:assert/strict";
import { namingFile, readingFile } from "./model_errors.ts";

Deno.test("a refusal is named by its file after its subject, of the same kind, with its cause", () => {
  const reader = new RangeError('Cannot read model hyperparameters: "a.b" is 0, expected 1..2');
  const named = namingFile(reader, "/m/q.gguf");
  assert.ok(named instanceof RangeError);
  assert.equal(
    named.message,
    'Cannot read model hyperparameters from "/m/q.gguf": "a.b" is 0, expected 1..2',
  );
  assert.equal(named.cause, reader);
  // The subject may hold a colon ("0:2"); the file goes before the first ": ".
  const layers = namingFile(new SyntaxError("Cannot open layers 0:2: no such layer"), "m.gguf");
  assert.ok(layers instanceof SyntaxError);
  assert.equal(layers.message, 'Cannot open layers 0:2 from "m.gguf": no such layer');
  const bare = namingFile(new TypeError("x is not a function"), "m.gguf") as Error;
  assert.equal(bare.message, 'Cannot use "m.gguf": x is not a function');
});

Deno.test("an error that names the file already, or is of its own class, is thrown as it is", () => {
  const already = new RangeError('Cannot load "t" from "m.gguf": shape [2], expected [4]');
  assert.equal(namingFile(already, "m.gguf"), already);
  class Own extends Error {}
  const own = new Own("Cannot go: why");
  assert.equal(namingFile(own, "m.gguf"), own);
  assert.equal(namingFile("text", "m.gguf"), "text");
  assert.equal(readingFile("m.gguf", () => 7), 7);
  assert.throws(
    () =>
      readingFile("m.gguf", () => {
        throw new SyntaxError('Cannot build the tokenizer: "k" is missing, expected texts');
      }),
    { name: "SyntaxError", message: /^Cannot build the tokenizer from "m\.gguf": "k" is missing/ },
  );
});
