// Tests for lib/tokenizer/{tokenizer_thread,tokenizer_worker,chat_prompt}.ts: the thread gives the
// ids an in-process tokenizer gives, counts past the limit without ids, and fails cleanly.

import assert from "node:assert/strict";
import { CHAT_TEMPLATE } from "../../tools/synth/qwen_chat_template.ts";
import { tinyTokenizer, vocabMetadata } from "../../tests/_tiny_tokenizer.ts";
import { chatPrompt, type ChatPromptInput } from "./chat_prompt.ts";
import { ChatTemplateError } from "./chat_template.ts";
import { TokenizerThread } from "./tokenizer_thread.ts";

const { vocab, tokenizer } = tinyTokenizer("qwen35");
const meta = vocabMetadata(vocab, "qwen35");

const CHAT: ChatPromptInput = {
  chat: {
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "What is the capital of Norway?" },
      { role: "assistant", content: "Oslo." },
      { role: "user", content: "And of Sweden?" },
    ],
  },
  prefill: "The capital",
};

Deno.test("the thread renders and tokenizes as the same code does in-process", async () => {
  const thread = await TokenizerThread.start(meta, CHAT_TEMPLATE);
  try {
    const got = await thread.chat(CHAT, 4096);
    const want = chatPrompt(tokenizer, CHAT_TEMPLATE, CHAT, 4096);
    assert.deepEqual([...got.ids], [...want.ids]);
    assert.equal(got.tokens, want.ids.length);
    assert.equal(got.historyTokens, want.historyTokens);
    assert.ok(got.historyTokens > 0 && got.historyTokens < got.tokens);
    const texts = await thread.texts(["Once upon a time", "", "<|im_start|>user"], 4096);
    assert.deepEqual(texts.parts.map((p) => [...p]), [
      tokenizer.encode("Once upon a time"),
      [],
      tokenizer.encode("<|im_start|>user"),
    ]);
    assert.equal(texts.tokens, texts.parts.reduce((n, p) => n + p.length, 0));
  } finally {
    thread.close();
  }
});

Deno.test("past the limit only a count comes back: exact while tokenized, else a lower bound", async () => {
  const thread = await TokenizerThread.start(meta, CHAT_TEMPLATE);
  try {
    const text = "words and more words, ".repeat(200);
    const n = tokenizer.encode(text).length;
    const over = await thread.texts([text], n - 1);
    assert.equal(over.parts.length, 0);
    assert.ok(over.tokens > n - 1 && over.tokens <= n, `${over.tokens} of ${n}`);
    const exact = await thread.texts([text], n);
    assert.equal(exact.tokens, n);
    // Far too long by its length alone: refused without tokenizing, with a true lower bound.
    const huge = "x".repeat(1_000_000);
    const bound = await thread.texts([huge], 100);
    assert.ok(bound.tokens > 100 && bound.tokens <= tokenizer.encode(huge).length);
    const chat = await thread.chat(
      { chat: { messages: [{ role: "user", content: huge }] } },
      100,
    );
    assert.equal(chat.ids.length, 0);
    assert.ok(chat.tokens > 100);
  } finally {
    thread.close();
  }
});

Deno.test("template errors come back as ChatTemplateError; a closed thread refuses work", async () => {
  const thread = await TokenizerThread.start(meta, "{{ raise_exception('no system role') }}");
  await assert.rejects(
    thread.chat(CHAT, 100),
    (e: unknown) => e instanceof ChatTemplateError && /no system role/.test(e.message),
  );
  const pending = thread.texts(["a ".repeat(200_000)], 1_000_000);
  thread.close();
  await assert.rejects(pending, /tokenizer thread was closed/);
  await assert.rejects(thread.texts(["a"], 10), /tokenizer thread was closed/);
});
