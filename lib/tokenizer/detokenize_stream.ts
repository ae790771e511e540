// Generated ids → UTF-8-safe text deltas, holding back a character split across tokens.
// Sits between the scheduler's id stream and lib/server/events.ts.

import type { DecodeOptions, TextTokenizer } from "./tokenizer.ts";

/**
 * Turns token ids into text deltas. A token can end in the middle of a multi-byte character
 * (byte-level BPE splits emoji and CJK freely), so bytes of an unfinished character wait for the
 * next token; each emitted string is whole characters and never empty. Bytes that cannot become
 * UTF-8 come out as U+FFFD, and an unfinished character still pending at the end is flushed as one.
 *
 * @example
 * ```ts
 * const text = ReadableStream.from(ids).pipeThrough(new DetokenizeStream(tokenizer));
 * ```
 */
export class DetokenizeStream extends TransformStream<number, string> {
  constructor(tokenizer: Pick<TextTokenizer, "tokenBytes">, options: DecodeOptions = {}) {
    // Not ignoring the BOM would silently drop a U+FEFF the model writes first.
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    super({
      transform(id, controller) {
        const text = decoder.decode(tokenizer.tokenBytes(id, options), { stream: true });
        if (text) controller.enqueue(text);
      },
      flush(controller) {
        const text = decoder.decode();
        if (text) controller.enqueue(text);
      },
    });
  }
}
