// A vocabulary of real-model size for grammar mask benches and tests: the qwen35moe-35b preset's
// tokens with its unused fillers (no bytes) turned into text tokens of a real vocabulary's kinds.

import { PRESETS } from "../tools/synth/presets.ts";
import vocabCorpus from "../tools/synth/vocab_corpus.txt" with { type: "text" };
import { buildVocab, type Vocab } from "../tools/synth/vocab.ts";
import { byteLevelEncode, preTokenize } from "../lib/tokenizer/pre_tokenize.ts";
import { TextTokenizer, TokenType } from "../lib/tokenizer/tokenizer.ts";
import { rng } from "./_fuzz.ts";
import { vocabMetadata } from "./_tiny_tokenizer.ts";

/** Code-like pieces a real vocabulary holds many tokens of (quotes, escapes, newlines, braces). */
const CODE_PIECES = [
  '"',
  '",',
  '":',
  "\\",
  "\\n",
  "\n",
  "\n\n",
  "  ",
  "{",
  "}",
  "(",
  ")",
  ":",
  ".",
];

/**
 * `count` distinct texts drawn with `seed`: word pieces of the synthetic corpus (most of them, as
 * in a real vocabulary), CJK and Cyrillic runs, and code pieces joined to words.
 */
function fillerTexts(count: number, seed: number, known: Set<string>): string[] {
  const random = rng(seed);
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)];
  const words = [...new Set(preTokenize(vocabCorpus, "qwen2"))].filter((w) => w.length > 1);
  const out: string[] = [];
  for (let tries = 0; out.length < count; tries++) {
    if (tries > count * 50) {
      throw new RangeError(`Cannot draw ${count} distinct filler tokens from the corpus`);
    }
    const kind = random();
    let text: string;
    if (kind < 0.7) {
      const word = pick(words);
      const start = random() < 0.6 ? 0 : Math.floor(random() * (word.length - 1));
      text = word.slice(start, start + 2 + Math.floor(random() * 9));
      if (random() < 0.3) text = text.toUpperCase();
      if (random() < 0.2) text += pick(words);
    } else if (kind < 0.85) {
      const base = random() < 0.7 ? 0x4e00 : 0x0430;
      const span = base === 0x4e00 ? 0x5000 : 32;
      const n = 1 + Math.floor(random() * 3);
      text = String.fromCodePoint(
        ...Array.from({ length: n }, () => base + Math.floor(random() * span)),
      );
    } else {
      text = pick(CODE_PIECES) + (random() < 0.5 ? pick(words) : pick(CODE_PIECES));
    }
    const spelled = byteLevelEncode(text);
    if (known.has(spelled)) continue;
    known.add(spelled);
    out.push(spelled);
  }
  return out;
}

/** The qwen35moe-35b vocabulary (248,320 tokens), its fillers made text tokens, with `seed`. */
export function bigVocab(seed = 1): Vocab {
  const vocab = buildVocab(PRESETS["qwen35moe-35b"].vocab);
  const fillers = vocab.types.flatMap((t, id) => (t === TokenType.Unused ? [id] : []));
  const texts = fillerTexts(fillers.length, seed, new Set(vocab.tokens));
  const tokens = [...vocab.tokens];
  const types = [...vocab.types];
  fillers.forEach((id, i) => {
    tokens[id] = texts[i];
    types[id] = TokenType.Normal;
  });
  return { ...vocab, tokens, types };
}

/** A tokenizer of bigVocab(seed). */
export function bigTokenizer(seed = 1): TextTokenizer {
  return TextTokenizer.fromGguf(vocabMetadata(bigVocab(seed), "qwen35"));
}
