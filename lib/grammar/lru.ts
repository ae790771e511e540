// A bounded cache that drops its least recently used entry first: the grammar caches asked once a
// mask or a request (masks and class tokens per vocabulary, compiled request grammars) share it.

export class Lru<V> {
  readonly #entries = new Map<string, V>();
  readonly #capacity: number;

  constructor(capacity: number) {
    this.#capacity = capacity;
  }

  /** The value at `key`, now the most recently used; undefined when absent. */
  get(key: string): V | undefined {
    const hit = this.#entries.get(key);
    if (hit !== undefined) {
      this.#entries.delete(key);
      this.#entries.set(key, hit);
    }
    return hit;
  }

  /** Keeps `value` at `key`, dropping the least recently used entry when full. */
  set(key: string, value: V): void {
    this.#entries.delete(key);
    if (this.#entries.size >= this.#capacity) {
      this.#entries.delete(this.#entries.keys().next().value!);
    }
    this.#entries.set(key, value);
  }

  /** The value at `key`, built by `build` and kept when absent. */
  getOrBuild(key: string, build: () => V): V {
    let value = this.get(key);
    if (value === undefined) this.set(key, value = build());
    return value;
  }
}
