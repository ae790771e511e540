// Which token prefixes have a snapshot on every stage, in which snapshot place: bounded, LRU.
// The scheduler saves at a conversation's history boundary and restores on the next turn.

/** Positions of snapshot state per slot that the default cache may hold (4 places at 8k). */
const DEFAULT_POSITIONS_PER_SLOT = 32768;

/**
 * The default number of snapshot places for `slots` slots of `ctx` positions: a place costs what
 * a slot costs (its state for `ctx` positions), so each slot gets up to four places while they
 * hold at most 32768 positions in all, and at least one (one conversation to come back to).
 * Head and worker both default to it, so a pair started with the same --ctx and --slots agree.
 */
export function defaultSnapshots(ctx: number, slots: number): number {
  return slots * Math.min(4, Math.max(1, Math.floor(DEFAULT_POSITIONS_PER_SLOT / ctx)));
}

/** A snapshot of the state after `tokens`, held at place `idx` on every stage. */
export interface CacheEntry {
  readonly idx: number;
  readonly tokens: readonly number[];
  /** The remote connection the worker's half was saved on; another one has lost it. */
  readonly epoch: number;
}

interface Slot {
  entry: CacheEntry;
  lastUse: number;
  pins: number;
}

function startsWith(prompt: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > prompt.length) return false;
  for (let i = 0; i < prefix.length; i++) if (prompt[i] !== prefix[i]) return false;
  return true;
}

/**
 * Snapshot places 0..capacity-1 and the prefixes they hold. A place being restored is pinned,
 * so it is never handed out for a new save at the same time.
 */
export class PrefixCache {
  readonly capacity: number;
  readonly #held = new Map<number, Slot>();
  /** Places handed out by reserve whose save has not finished. */
  readonly #reserved = new Set<number>();
  #clock = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  get size(): number {
    return this.#held.size;
  }

  /**
   * The longest cached prefix of `prompt` that leaves at least one token to run, pinned until
   * `release`. Entries from another remote epoch are dropped first: their worker half is gone.
   */
  lookup(prompt: readonly number[], epoch: number): CacheEntry | undefined {
    this.dropStale(epoch);
    let best: Slot | undefined;
    for (const slot of this.#held.values()) {
      const t = slot.entry.tokens;
      if (t.length < prompt.length && (!best || t.length > best.entry.tokens.length)) {
        if (startsWith(prompt, t)) best = slot;
      }
    }
    if (!best) return undefined;
    best.pins++;
    best.lastUse = ++this.#clock;
    return best.entry;
  }

  release(entry: CacheEntry): void {
    const slot = this.#held.get(entry.idx);
    if (slot?.entry === entry) slot.pins--;
  }

  /** True when exactly these tokens are cached (in `epoch`). */
  has(tokens: readonly number[], epoch: number): boolean {
    for (const { entry } of this.#held.values()) {
      if (entry.epoch === epoch && entry.tokens.length === tokens.length) {
        if (startsWith(tokens, entry.tokens)) return true;
      }
    }
    return false;
  }

  /**
   * A place to save into: a free one, else the least recently used unpinned one (evicted); it
   * stays reserved until insert or abandon. Undefined when every place is busy.
   */
  reserve(): number | undefined {
    let victim: number | undefined;
    for (let idx = 0; idx < this.capacity && victim === undefined; idx++) {
      if (!this.#held.has(idx) && !this.#reserved.has(idx)) victim = idx;
    }
    if (victim === undefined) {
      let oldest = Infinity;
      for (const [idx, slot] of this.#held) {
        if (slot.pins === 0 && slot.lastUse < oldest) {
          oldest = slot.lastUse;
          victim = idx;
        }
      }
      if (victim !== undefined) this.#held.delete(victim);
    }
    if (victim !== undefined) this.#reserved.add(victim);
    return victim;
  }

  /** Records a completed save into a reserved place. */
  insert(entry: CacheEntry): void {
    this.#reserved.delete(entry.idx);
    this.#held.set(entry.idx, { entry, lastUse: ++this.#clock, pins: 0 });
  }

  /** Gives back a reserved place whose save failed. */
  abandon(idx: number): void {
    this.#reserved.delete(idx);
  }

  clear(): void {
    for (const [idx, slot] of this.#held) if (slot.pins === 0) this.#held.delete(idx);
  }

  /** Drops the entries of remote epochs other than `epoch`: their worker half is gone. */
  dropStale(epoch: number): void {
    for (const [idx, slot] of this.#held) {
      if (slot.entry.epoch !== epoch && slot.pins === 0) this.#held.delete(idx);
    }
  }
}
