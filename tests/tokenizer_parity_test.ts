// Our tokenizer against llama.cpp's recorded tokenization of a text corpus (tests/fixtures/tokenizer.json).
// Checks lib/tokenizer/tokenizer.ts on a qwen2 and a qwen35 pre-tokenizer model, both directions.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import {
  readFixture,
  TOKENIZER_FIXTURE,
  type TokenizerFixture,
} from "../tools/fixtures/fixture_format.ts";
import { testModel } from "./_models.ts";
import { checkModelHash } from "./_parity.ts";

const fixture = await readFixture<TokenizerFixture>(TOKENIZER_FIXTURE);

Deno.test("tokenizer fixture covers the qwen2 and qwen35 pre-tokenizers", () => {
  assert.deepEqual(fixture.models.map((m) => m.pre).sort(), [
    "qwen2",
    "qwen35",
  ]);
  for (const m of fixture.models) {
    assert.equal(m.cases.length, fixture.corpus.length);
  }
});

for (const recorded of fixture.models) {
  Deno.test(`tokenizer parity with llama.cpp: ${recorded.pre}`, async () => {
    const path = await testModel(recorded.spec);
    await checkModelHash(
      recorded,
      path,
      `${TOKENIZER_FIXTURE} (${recorded.pre})`,
    );
    const model = await openGguf(path);
    let tokenizer: TextTokenizer;
    try {
      assert.equal(model.metadata.get("tokenizer.ggml.pre"), recorded.pre);
      tokenizer = TextTokenizer.fromGguf(model.metadata);
    } finally {
      model.close();
    }
    const wrong: string[] = [];
    fixture.corpus.forEach((text, i) => {
      const { ids, text: detokenized } = recorded.cases[i];
      const ours = tokenizer.encode(text);
      if (JSON.stringify(ours) !== JSON.stringify(ids)) {
        wrong.push(
          `encode ${JSON.stringify(text)}: ours [${ours}], llama.cpp [${ids}]`,
        );
      }
      const back = tokenizer.decode(ids);
      if (back !== detokenized) {
        wrong.push(
          `decode [${ids}]: ours ${JSON.stringify(back)}, llama.cpp ${JSON.stringify(detokenized)}`,
        );
      }
    });
    assert.deepEqual(
      wrong,
      [],
      `${wrong.length} of ${2 * fixture.corpus.length} cases differ`,
    );
  });
}
