// `deno task generate` end to end: the CLI's --json output equals the in-process engine, and the
// same command as the first stage of a two-stage chain (--layers 0:k --next) prints the same.

import assert from "node:assert/strict";
import { openGguf } from "../engine/gguf/read.ts";
import { openReferenceStage } from "../engine/reference/reference_stage.ts";
import { startWorker } from "./_workers.ts";
import { completeOnce, greedy } from "../lib/scheduler/complete.ts";
import { TextTokenizer } from "../lib/tokenizer/tokenizer.ts";
import { testModel } from "./_models.ts";

const ROOT = new URL("../", import.meta.url).pathname;

interface CliOutput {
  prompt_ids: number[];
  ids: number[];
  text: string;
}

async function runGenerate(args: string[]): Promise<CliOutput> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${ROOT}tools/generate.ts`, ...args, "--json"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `generate failed: ${stderr}`);
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

Deno.test("generate --json equals the in-process scheduler, unsplit and as a 2-stage chain", async () => {
  const path = await testModel({ arch: "qwen3next" });
  const prompt = "The quick brown fox";
  const model = await openGguf(path);
  const tokenizer = TextTokenizer.fromGguf(model.metadata);
  const ids = tokenizer.encode(prompt);
  const stage = await openReferenceStage(model, { first: 0, end: 4, slots: 1, ctx: 256 });
  const want = await completeOnce({ local: stage, tokenizer }, greedy(ids, { maxTokens: 10 }));
  stage.close();
  model.close();

  const common = ["--model", path, "--prompt", prompt, "--n", "10"];
  const unsplit = await runGenerate([...common, "--backend", "reference"]);
  assert.deepEqual(unsplit.prompt_ids, ids);
  assert.deepEqual(unsplit.ids, want.ids);
  assert.equal(unsplit.text, tokenizer.decode(want.ids));
  // The default backend is the GPU engine; on this F32 model its greedy ids equal the reference's.
  assert.deepEqual(await runGenerate([...common, "--allow-software-gpu"]), unsplit);

  const worker = await startWorker({ model: path, layers: "1:4", ctx: 256 });
  try {
    const split = await runGenerate([
      "--model",
      path,
      "--prompt-ids",
      ids.join(","),
      "--n",
      "10",
      "--layers",
      "0:1",
      "--next",
      worker.address,
      "--backend",
      "reference",
    ]);
    assert.deepEqual(split, unsplit);
  } finally {
    await worker.stop();
  }
});

Deno.test("generate rejects bad flags with a usage message and exit code 2", async () => {
  const path = await testModel({ arch: "qwen35" });
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${ROOT}tools/generate.ts`, "--model", path, "--prompt-ids", "1,x"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 2);
  assert.match(
    new TextDecoder().decode(out.stderr),
    /Cannot use --prompt-ids "1,x": expected comma-separated token ids/,
  );
});
