// What the head reads from its model before any weight: the tokenizer, the chat template and the
// hyperparameters, each refusal naming the file and the metadata key at fault. Used by head.ts,
// and by tests/gguf_fuzz_test.ts to read mutants as the head does.

import { describeValue, type GgufModel } from "../../engine/gguf/gguf_model.ts";
import { readingFile } from "../../engine/gguf/model_errors.ts";
import { type HParams, modelHParams } from "../../engine/hparams.ts";
import { TextTokenizer } from "../tokenizer/tokenizer.ts";

export interface HeadModel {
  readonly tokenizer: TextTokenizer;
  /** tokenizer.chat_template: the chat routes build every prompt with it. */
  readonly template: string;
  readonly hp: HParams;
}

/** The tokenizer, chat template and hyperparameters of `model`, in the order the head needs them. */
export function readHeadModel(model: GgufModel): HeadModel {
  const tokenizer = readingFile(model.path, () => TextTokenizer.fromGguf(model.metadata));
  const template = model.metadata.get("tokenizer.chat_template");
  if (typeof template !== "string") {
    throw new SyntaxError(
      `Cannot serve "${model.path}": "tokenizer.chat_template" is ${describeValue(template)}, ` +
        `expected the chat template, which the chat routes need to build prompts`,
    );
  }
  return { tokenizer, template, hp: modelHParams(model) };
}
