// Sets of Unicode code points as sorted inclusive ranges: the terminals of lib/grammar/grammar.ts
// and the transitions of lib/grammar/regex.ts.

export const MAX_CODE_POINT = 0x10ffff;

/** Inclusive ranges [lo0, hi0, lo1, hi1, …], sorted, disjoint and not adjacent. */
export class CharSet {
  private constructor(readonly ranges: readonly number[]) {}

  static readonly EMPTY = new CharSet([]);
  static readonly ANY = new CharSet([0, MAX_CODE_POINT]);

  static of(...codePoints: number[]): CharSet {
    return CharSet.fromRanges(codePoints.flatMap((c) => [c, c]));
  }

  static range(lo: number, hi: number): CharSet {
    return CharSet.fromRanges([lo, hi]);
  }

  /** Normalises any list of inclusive ranges (unsorted, overlapping) into a set. */
  static fromRanges(list: readonly number[]): CharSet {
    const pairs: [number, number][] = [];
    for (let i = 0; i < list.length; i += 2) {
      if (list[i] <= list[i + 1]) pairs.push([list[i], list[i + 1]]);
    }
    pairs.sort((a, b) => a[0] - b[0]);
    const out: number[] = [];
    for (const [lo, hi] of pairs) {
      const n = out.length;
      if (n && lo <= out[n - 1] + 1) out[n - 1] = Math.max(out[n - 1], hi);
      else out.push(lo, hi);
    }
    return new CharSet(out);
  }

  get empty(): boolean {
    return this.ranges.length === 0;
  }

  has(cp: number): boolean {
    const r = this.ranges;
    let lo = 0;
    let hi = r.length / 2 - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (cp < r[2 * mid]) hi = mid - 1;
      else if (cp > r[2 * mid + 1]) lo = mid + 1;
      else return true;
    }
    return false;
  }

  /** The code points in every one of `sets` (all of them when there are none). */
  static common(sets: readonly CharSet[]): CharSet {
    // One set is itself (mask walks ask for one pattern's at every character).
    if (sets.length === 1) return sets[0];
    return sets.reduce((a, b) => a.union(b.negate()), CharSet.EMPTY).negate();
  }

  equals(other: CharSet): boolean {
    const r = this.ranges;
    return r.length === other.ranges.length && r.every((x, i) => x === other.ranges[i]);
  }

  /** Whether some code point in [lo, hi] is in the set. */
  meets(lo: number, hi: number): boolean {
    const r = this.ranges;
    for (let i = 0; i < r.length; i += 2) {
      if (r[i] > hi) return false;
      if (r[i + 1] >= lo) return true;
    }
    return false;
  }

  union(other: CharSet): CharSet {
    return CharSet.fromRanges([...this.ranges, ...other.ranges]);
  }

  /** The code points 0..MAX_CODE_POINT not in this set. */
  negate(): CharSet {
    const out: number[] = [];
    let next = 0;
    for (let i = 0; i < this.ranges.length; i += 2) {
      if (this.ranges[i] > next) out.push(next, this.ranges[i] - 1);
      next = this.ranges[i + 1] + 1;
    }
    if (next <= MAX_CODE_POINT) out.push(next, MAX_CODE_POINT);
    return new CharSet(out);
  }

  /** The fewest bytes any member takes in UTF-8. */
  minUtf8Bytes(): number {
    const first = this.ranges[0];
    return first < 0x80 ? 1 : first < 0x800 ? 2 : first < 0x10000 ? 3 : 4;
  }
}
