// Seeded randomness and run counts for the fuzz tests (GGUF headers, wire frames and hellos, HTTP
// bodies): CI-sized counts in `deno task test`, 10,000 each in `deno task fuzz`.

/**
 * Runs of one fuzz test: `ci` in `deno task test`, TANDEM_FUZZ_RUNS when that is larger
 * (`deno task fuzz` sets 10,000).
 */
export function fuzzRuns(ci: number): number {
  const text = Deno.env.get("TANDEM_FUZZ_RUNS");
  if (text === undefined) return ci;
  const runs = Number(text);
  if (!Number.isSafeInteger(runs) || runs < 1) {
    throw new RangeError(`Cannot use TANDEM_FUZZ_RUNS "${text}": expected a whole number ≥ 1`);
  }
  return Math.max(ci, runs);
}

/**
 * The seed of a fuzz test: `base` unless TANDEM_FUZZ_SEED is given, which is mixed in so that
 * every test still draws its own sequence. A failure message should name it to replay the run.
 */
export function fuzzSeed(base: number): number {
  const text = Deno.env.get("TANDEM_FUZZ_SEED");
  if (text === undefined) return base >>> 0;
  const extra = Number(text);
  if (!Number.isSafeInteger(extra)) {
    throw new RangeError(`Cannot use TANDEM_FUZZ_SEED "${text}": expected a whole number`);
  }
  return (base ^ Math.imul(extra, 0x9e3779b1)) >>> 0;
}

/** Uniforms in [0, 1) from a 32-bit seed (mulberry32): the same seed gives the same data. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Integer, choice and byte draws over one seeded stream. */
export class Random {
  readonly #next: () => number;

  constructor(seed: number) {
    this.#next = rng(seed);
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.#next() * n);
  }

  /** True with probability p. */
  chance(p: number): boolean {
    return this.#next() < p;
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)];
  }

  bytes(n: number): Uint8Array {
    return Uint8Array.from({ length: n }, () => this.int(256));
  }

  /** `bytes` with 1..3 bytes (among the first `within`, default all) set to random values. */
  mutate(bytes: Uint8Array, within = bytes.length): Uint8Array {
    const out = bytes.slice();
    for (let k = 1 + this.int(3); k > 0 && out.length > 0; k--) {
      out[this.int(Math.min(within, out.length))] = this.int(256);
    }
    return out;
  }
}
