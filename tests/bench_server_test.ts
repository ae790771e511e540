// The bench's figures through the server (bench/server_bench.ts): a head process unsplit and one
// split over a worker, each answering timed /v1/messages and /completion streams, on a tiny model and the CPU
// reference; and prompts cut to a token budget with the model's own template.

import assert from "node:assert/strict";
import { benchServer, promptOfLength } from "../bench/server_bench.ts";
import { Deadline } from "../bench/measure.ts";
import { openGguf } from "../engine/gguf/read.ts";
import { PromptBuilder } from "../lib/server/prompt.ts";
import { TokenizerThread } from "../lib/tokenizer/tokenizer_thread.ts";
import { testModel } from "./_models.ts";

Deno.test("promptOfLength: the longest text whose chat prompt fits the budget", async () => {
  const model = await openGguf(await testModel({ arch: "qwen35moe" }));
  const thread = await TokenizerThread.start(
    model.metadata,
    model.metadata.get("tokenizer.chat_template") as string,
  );
  try {
    const prompts = new PromptBuilder(thread, 100);
    const build = async (text: string) =>
      (await prompts.build({
        messages: [{ role: "user", content: text }],
        tools: [],
        toolChoice: { type: "auto" },
        thinking: false,
      })).tokens;
    const { text, tokens, ids } = await promptOfLength(prompts, 100);
    assert.equal(await build(text), tokens);
    assert.equal(ids.length, tokens, "the ids /completion is timed with are the chat prompt's");
    assert.ok(tokens <= 100 && tokens > 90, `${tokens} tokens`);
    assert.ok(await build(`${text} the river`) > 100, "one more word would not fit");
  } finally {
    thread.close();
    model.close();
  }
});

Deno.test("benchServer: greedy and sampled replies timed through a head, unsplit and split", async () => {
  const path = await testModel({ arch: "qwen35moe" });
  const lines: string[] = [];
  const report = await benchServer({
    model: path,
    backend: "reference",
    gpu: "builtin",
    promptTokens: 40,
    maxTokens: 6,
    split: 2,
    runs: 2,
    deadline: new Deadline(120),
    log: (line) => lines.push(line),
  });
  assert.ok(report.promptTokens <= 40 && report.promptTokens > 30);
  assert.deepEqual(report.modes.map((m) => m.layers), ["0:4", "0:2 + 2:4"]);
  for (const mode of report.modes) {
    assert.equal(mode.error, undefined, mode.error);
    assert.ok(mode.startSeconds! > 0);
    assert.deepEqual(mode.routes?.map((r) => r.route), ["/v1/messages", "/completion"]);
    for (const { route, greedy, sampled } of mode.routes!) {
      for (const f of [greedy, sampled]) {
        assert.equal(f.ttft.timing?.seconds.length, 2, f.ttft.error);
        assert.ok(f.ttft.timing!.min > 0);
        assert.equal(f.ttft.tokens, report.promptTokens);
        if (route === "/completion") assert.ok(f.decode.timing!.median > 0);
        else assert.match(f.decode.error!, /^not measured on \/v1\/messages/);
      }
    }
  }
  assert.ok(
    lines.some((l) => /^server 0:2 \+ 2:4 \/completion greedy: first token \d+ ms/.test(l)),
  );
});
