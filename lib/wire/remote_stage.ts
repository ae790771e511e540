// "The rest of the chain" as a Stage: layers [first, nLayer) served by a worker behind a Peer.
// Composed after a local stage by generate, the head, and middle workers (stage_server.ts).

import type { GgufModel } from "../../engine/gguf/gguf_model.ts";
import {
  greedyCount,
  type LastOutput,
  type Stage,
  type StageInput,
  type StageOutput,
  type StageRunOptions,
  type StageShape,
  type TopEntry,
} from "../../engine/stage.ts";
import {
  checkCandidates,
  checkLogits,
  checkRewindable,
  checkRows,
  checkSlot,
} from "../../engine/stage_checks.ts";
import type { HelloInfo } from "./frame.ts";
import { type ChainExpectation, modelFingerprint } from "./hello.ts";
import { connectPeer, type Peer, type PeerOptions, StageUnavailableError } from "./peer.ts";

/**
 * A sequence or snapshot from an earlier connection: the worker has lost it (it keeps no state
 * across connections), though the current connection is fine. Restart the sequence at base 0.
 */
export class LostStateError extends StageUnavailableError {
  override name = "LostStateError";
}

/**
 * Connects lazily (on first use, and again after any failure). The worker keeps no state across
 * connections, so every connection is an epoch: a sequence started, or a snapshot saved, in an
 * earlier epoch is refused here with a StageUnavailableError instead of failing on the worker,
 * and the caller restarts that sequence at base 0.
 */
export class RemoteStage implements Stage {
  readonly address: string;
  readonly first: number;
  readonly end: number;
  readonly nLayer: number;
  readonly nEmbd: number;
  readonly slots: number;
  readonly ctx: number;
  /** Any length fits: a run is cut into frames of the worker's own limit. */
  readonly maxBatch: number;
  /** What this side saves into; the hello guarantees the chain has at least as many. */
  readonly snapshots: number;
  /** What this side rewinds; the hello guarantees the chain keeps at least as many positions. */
  readonly maxRewind: number;
  readonly #want: ChainExpectation;
  readonly #options: PeerOptions;
  readonly #slotEpoch: Int32Array;
  readonly #snapshotEpoch = new Map<number, number>();
  readonly #lostListeners: ((failure: StageUnavailableError) => void)[] = [];
  #peer: Peer | undefined;
  #connecting: Promise<Peer> | undefined;
  #epoch = 0;
  #closed = false;

  constructor(address: string, want: ChainExpectation, options: PeerOptions = {}) {
    this.address = address;
    this.first = want.first;
    this.end = want.nLayer;
    this.nLayer = want.nLayer;
    this.nEmbd = want.nEmbd;
    this.slots = want.slots;
    this.ctx = want.ctx;
    this.maxBatch = want.ctx;
    this.snapshots = want.snapshots;
    this.maxRewind = want.maxRewind;
    this.#want = want;
    this.#options = options;
    this.#slotEpoch = new Int32Array(want.slots).fill(-1);
  }

  /** Number of connections made so far; remote state belongs to the current one. */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Whether the chain's last stage drafts with the model's MTP block, as the current connection's
   * hello says (false while there is none).
   */
  get drafts(): boolean {
    return this.#peer?.info.drafts ?? false;
  }

  /** The live connection's hello, connecting if there is none. */
  async connect(): Promise<HelloInfo> {
    return (await this.#live()).info;
  }

  /**
   * Calls `listener` whenever the live connection ends by itself (the worker died, restarted,
   * failed a request or stopped answering), at once, even while no request is pending; not when
   * this side disconnects.
   */
  onLost(listener: (failure: StageUnavailableError) => void): void {
    this.#lostListeners.push(listener);
  }

  /** Drops the live connection; the next call opens a new one (and a new epoch). */
  disconnect(): void {
    const peer = this.#peer;
    this.#peer = undefined;
    peer?.close();
  }

  /**
   * PING through the whole chain behind the worker, connecting if there is no connection. No
   * PONG within `timeoutMs` (default: the reply timeout) ends the connection.
   */
  async ping(timeoutMs?: number): Promise<void> {
    await (await this.#live()).ping(timeoutMs);
  }

  async run(
    slot: number,
    input: StageInput,
    n: number,
    base: number,
    options: StageRunOptions = {},
  ): Promise<StageOutput> {
    if (input.kind !== "hidden" || input.rows.length !== n * this.nEmbd) {
      throw new TypeError(
        `Cannot run layers ${this.first}..${this.end} remotely: expected ${n}·${this.nEmbd} ` +
          `hidden values, got ${input.kind === "hidden" ? input.rows.length : "token ids"}`,
      );
    }
    checkSlot(this, slot);
    const logits = checkLogits(options);
    // Every frame of a run carries the run's kind of rows, whatever its own length.
    const kind = checkRows(options, n);
    // A rewindable run fits one frame: maxRewind ≤ the worker's maxBatch (checkOpenOptions).
    checkRewindable(this, options, n);
    const every = checkCandidates(options, n);
    const peer = await this.#live();
    if (base !== 0) this.#requireCurrent(this.#slotEpoch[slot], `slot ${slot}'s sequence`);
    this.#slotEpoch[slot] = this.#epoch;
    const ids = new Uint32Array(greedyCount(logits, n));
    let top: readonly TopEntry[] = [];
    let lse = NaN;
    let tops: LastOutput["tops"];
    const chunk = peer.info.maxBatch;
    if (every && n > chunk) {
      throw new RangeError(
        `Cannot return every position's candidates of ${n} positions over the wire: the worker takes ${chunk} a frame`,
      );
    }
    // Chunks before the last need logits only where every position's are wanted.
    const before = { logits: logits === "all" ? "all" : "none", rows: kind } as const;
    for (let at = 0; at < n; at += chunk) {
      const m = Math.min(chunk, n - at);
      const last = at + m === n;
      const rows = input.rows.subarray(at * this.nEmbd, (at + m) * this.nEmbd);
      // The tokens go along where the chain's last stage drafts (it embeds them), unless the run
      // skips its MTP block: a RUN without them does (engine/stage_checks.ts runsMtp).
      const tokens = peer.info.drafts && options.mtp !== false
        ? input.ids?.subarray(at, at + m)
        : undefined;
      const reply = await peer.run(
        slot,
        rows,
        m,
        base + at,
        last ? { ...options, rows: kind } : before,
        tokens,
      );
      ids.set(reply.ids, logits === "all" ? at : 0);
      if (last) ({ top, lse, tops } = reply);
    }
    return { kind: "ids", ids, top, lse, ...(tops ? { tops } : {}) };
  }

  async save(slot: number, idx: number): Promise<void> {
    checkSlot(this, slot);
    const peer = await this.#live();
    this.#requireCurrent(this.#slotEpoch[slot], `slot ${slot}'s sequence`);
    await peer.save(slot, idx);
    this.#snapshotEpoch.set(idx, this.#epoch);
  }

  async restore(slot: number, idx: number): Promise<number> {
    checkSlot(this, slot);
    const peer = await this.#live();
    this.#requireCurrent(this.#snapshotEpoch.get(idx) ?? -1, `snapshot ${idx}`);
    const position = await peer.restore(slot, idx);
    this.#slotEpoch[slot] = this.#epoch;
    return position;
  }

  async rewind(slot: number, pos: number): Promise<void> {
    checkSlot(this, slot);
    const peer = await this.#live();
    this.#requireCurrent(this.#slotEpoch[slot], `slot ${slot}'s sequence`);
    await peer.rewind(slot, pos);
  }

  /**
   * The drafts of the chain's last stage (Stage.draft), where its hello says it drafts with the
   * model's MTP block; none otherwise. Its runs must have carried their token ids (input.ids).
   */
  async draft(slot: number, id: number, k: number): Promise<Uint32Array> {
    checkSlot(this, slot);
    const peer = await this.#live();
    this.#requireCurrent(this.#slotEpoch[slot], `slot ${slot}'s sequence`);
    if (!peer.info.drafts || k === 0) return new Uint32Array();
    return await peer.draft(slot, id, Math.min(k, peer.info.maxBatch));
  }

  close(): void {
    this.#closed = true;
    this.disconnect();
  }

  #requireCurrent(epoch: number, what: string): void {
    if (epoch !== this.#epoch) {
      throw new LostStateError(
        this.address,
        epoch < 0
          ? `${what} was never started on it; start the sequence at base 0`
          : `${what} was lost when the connection was re-established; restart it at base 0`,
      );
    }
  }

  async #live(): Promise<Peer> {
    if (this.#closed) {
      throw new StageUnavailableError(this.address, "this remote stage was closed");
    }
    if (this.#peer && !this.#peer.closed) return this.#peer;
    this.#connecting ??= connectPeer(this.address, this.#want, this.#options)
      .then((peer) => {
        if (this.#closed) {
          peer.close();
          throw new StageUnavailableError(this.address, "this remote stage was closed");
        }
        this.#peer = peer;
        this.#epoch++;
        peer.ended.then((failure) => {
          // After disconnect or close, #peer is no longer this one: nothing was lost.
          if (this.#peer !== peer) return;
          for (const listener of this.#lostListeners) listener(failure);
        });
        return peer;
      })
      .finally(() => {
        this.#connecting = undefined;
      });
    return await this.#connecting;
  }
}

/** The RemoteStage for the layers after `local`: the worker at `address` must serve the rest. */
export function remoteStageAfter(
  address: string,
  local: StageShape,
  fingerprint: Uint8Array,
  options: PeerOptions = {},
): RemoteStage {
  return new RemoteStage(address, {
    first: local.end,
    nLayer: local.nLayer,
    nEmbd: local.nEmbd,
    slots: local.slots,
    ctx: local.ctx,
    snapshots: local.snapshots,
    maxRewind: local.maxRewind,
    fingerprint,
  }, options);
}

export interface ConnectRemoteOptions extends PeerOptions {
  /** The stage this process runs just before the remote part. */
  readonly local: StageShape;
  /** The model the local stage was opened from: its fingerprint must match the worker's. */
  readonly model: GgufModel;
}

/**
 * A RemoteStage for the layers after `local`, connected once now so that a wrong worker fails
 * at start-up; later connections are lazy.
 */
export async function connectRemoteStage(
  address: string,
  options: ConnectRemoteOptions,
): Promise<RemoteStage> {
  const { local, model, ...peerOptions } = options;
  const remote = remoteStageAfter(address, local, await modelFingerprint(model), peerOptions);
  await remote.connect();
  return remote;
}
