// A head started with --draft (lib/scheduler/draft.ts) over HTTP: greedy replies, streamed and
// buffered, are the bytes a head without drafting sends, and /metrics counts the drafts; a file
// with an MTP block drafts with it.

import assert from "node:assert/strict";
import { backendTest, metric, parseSse, post, startTestHead, streamedText } from "./_head.ts";
import { testModel } from "./_models.ts";

const ask = (content: string, stream = false) => ({
  model: "anything",
  max_tokens: 24,
  temperature: 0,
  stream,
  messages: [{ role: "user", content }],
});

backendTest(
  "a head that drafts replies as one that does not, streamed and buffered",
  async (engine) => {
    const prompt = "one two three one two three one two three one two";
    const replies = async (draft: "off" | 3) => {
      const head = await startTestHead({ ...engine, slots: 1, draft });
      try {
        const buffered = await (await post(`${head.url}/v1/messages`, ask(prompt))).json();
        const streamed = streamedText(
          parseSse(await (await post(`${head.url}/v1/messages`, ask(prompt, true))).text()),
        );
        const metrics = await (await fetch(`${head.url}/metrics`)).text();
        return { text: buffered.content[0].text, streamed, metrics };
      } finally {
        await head.close();
      }
    };
    const plain = await replies("off");
    const drafted = await replies(3);
    assert.equal(drafted.text, plain.text);
    assert.equal(drafted.streamed, plain.text);
    // Drafts come only where the reply repeats the conversation; every one counted is verified.
    const verified = metric(drafted.metrics, 'tandem_draft_tokens_total{outcome="verified"}');
    const accepted = metric(drafted.metrics, 'tandem_draft_tokens_total{outcome="accepted"}');
    assert.ok(accepted <= verified);
    assert.equal(metric(plain.metrics, 'tandem_draft_tokens_total{outcome="verified"}'), 0);
  },
);

backendTest(
  "a head on a file with an MTP block drafts with it: a predictable model keeps every draft",
  async (engine) => {
    const model = await testModel({
      arch: "qwen35moe",
      quant: "q8_0",
      mtp: true,
      predictable: true,
    });
    const reply = async (draft: "off" | 3) => {
      const head = await startTestHead({ ...engine, model, slots: 1, draft });
      try {
        const body = await (await post(`${head.url}/v1/messages`, ask("count with me"))).json();
        return {
          text: body.content[0].text,
          metrics: await (await fetch(`${head.url}/metrics`)).text(),
          lines: head.lines,
        };
      } finally {
        await head.close();
      }
    };
    const plain = await reply("off");
    const drafted = await reply(3);
    assert.equal(drafted.text, plain.text);
    // The reply counts up from the prompt's last token, which nothing before it repeats: these
    // drafts are the MTP head's, and it is always right.
    const verified = metric(drafted.metrics, 'tandem_draft_tokens_total{outcome="verified"}');
    const accepted = metric(drafted.metrics, 'tandem_draft_tokens_total{outcome="accepted"}');
    assert.ok(verified > 0 && accepted === verified, `${accepted} of ${verified} kept`);
    assert.ok(drafted.lines.some((l) => l.includes("drafts 3 (the MTP head)")), "logged as such");
  },
);
