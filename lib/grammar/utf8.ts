// UTF-8 read one byte at a time: what a lead byte starts, and which code points a half-read
// character can still become. Used by grammar.ts (feeding text) and token_mask.ts (vocabulary walks).

/** A character whose first bytes have been read: its bits so far and the bytes it still needs. */
export interface Utf8Partial {
  readonly cp: number;
  readonly need: number;
  /** The smallest code point of its length (shorter encodings are overlong). */
  readonly min: number;
}

const MIN_BY_LENGTH = [0, 0, 0x80, 0x800, 0x10000];

/** Bytes a character starting with `b` takes (1..4), or 0 when `b` cannot start one. */
function utf8Length(b: number): number {
  return b < 0x80
    ? 1
    : b >= 0xc2 && b <= 0xdf
    ? 2
    : b >= 0xe0 && b <= 0xef
    ? 3
    : b >= 0xf0 && b <= 0xf4
    ? 4
    : 0;
}

/**
 * One more byte: the next partial character, the code point it completes (a number), or null
 * when the byte breaks UTF-8 (a bad lead or continuation byte, an overlong form, a surrogate).
 */
export function utf8Step(p: Utf8Partial | null, b: number): Utf8Partial | number | null {
  if (p === null) {
    const len = utf8Length(b);
    if (len <= 1) return len === 1 ? b : null;
    return { cp: b & (0x7f >> len), need: len - 1, min: MIN_BY_LENGTH[len] };
  }
  if ((b & 0xc0) !== 0x80) return null;
  const cp = (p.cp << 6) | (b & 0x3f);
  // 0xED 0xA0..0xBF starts a surrogate whatever follows: refused now, not at the last byte, so
  // a grammar never lets a token end in a character no byte can finish.
  if (p.need > 1) {
    const surrogate = p.min === 0x800 && cp >= 0xd800 >> 6 && cp <= 0xdfff >> 6;
    return surrogate ? null : { cp, need: p.need - 1, min: p.min };
  }
  return cp < p.min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff ? null : cp;
}

/** The code points [lo, hi] a partial character can still become (lo > hi: none). */
export function utf8Range(p: Utf8Partial): [number, number] {
  const shift = 6 * p.need;
  const lo = Math.max(p.cp << shift, p.min);
  const hi = Math.min((p.cp << shift) | ((1 << shift) - 1), 0x10ffff);
  return [lo, hi];
}
