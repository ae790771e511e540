// The request checks every Stage makes before it touches state (slot, snapshot, run shape, input),
// so the GPU, reference and remote stages (engine/gpu, engine/reference, lib/wire) refuse alike.

import type { Stage, StageInput } from "./stage.ts";

/** Throws once the stage is closed. */
export function checkOpen(stage: Pick<Stage, "first" | "end">, closed: boolean): void {
  if (closed) {
    throw new TypeError(`Cannot use stage ${stage.first}..${stage.end}: it is closed`);
  }
}

export function checkSlot(stage: Pick<Stage, "slots">, slot: number): void {
  if (!Number.isInteger(slot) || slot < 0 || slot >= stage.slots) {
    throw new RangeError(
      `Cannot use slot ${slot}: this stage has ${stage.slots} slots (0..${stage.slots - 1})`,
    );
  }
}

/** `count` is the number of snapshot places the stage was opened with. */
export function checkSnapshot(idx: number, count: number): void {
  if (!Number.isInteger(idx) || idx < 0 || idx >= count) {
    throw new RangeError(
      `Cannot use snapshot ${idx}: this stage has ${count} snapshot places; open it with more snapshots`,
    );
  }
}

/**
 * Checks a run of positions [base, base+n) on `slot`, which has seen `pos` positions, and its
 * input: token ids (below `vocab`) on the first stage, n·nEmbd hidden values after it.
 */
export function checkRun(
  stage: Pick<Stage, "first" | "end" | "nEmbd" | "ctx" | "maxBatch">,
  slot: number,
  input: StageInput,
  n: number,
  base: number,
  pos: number,
  vocab: number,
): void {
  if (!Number.isInteger(n) || n < 1 || n > stage.maxBatch) {
    throw new RangeError(
      `Cannot run ${n} positions at once: this stage takes 1..${stage.maxBatch}; split the prefill into chunks`,
    );
  }
  if (!Number.isInteger(base) || base < 0 || (base !== 0 && base !== pos)) {
    throw new RangeError(
      `Cannot run slot ${slot} from position ${base}: the slot is at position ${pos}; continue from ${pos} or restart at 0`,
    );
  }
  if (base + n > stage.ctx) {
    throw new RangeError(
      `Cannot run positions ${base}..${
        base + n
      } of slot ${slot}: the context holds ${stage.ctx} positions`,
    );
  }
  if (stage.first === 0) {
    if (input.kind !== "ids") {
      throw new TypeError(
        `Cannot run the first stage on hidden rows: it embeds token ids; pass { kind: "ids" }`,
      );
    }
    if (input.ids.length !== n) {
      throw new RangeError(`Cannot run ${n} positions on ${input.ids.length} token ids`);
    }
    for (const id of input.ids) {
      if (id >= vocab) {
        throw new RangeError(`Cannot embed token id ${id}: the vocabulary has ${vocab} tokens`);
      }
    }
    return;
  }
  if (input.kind !== "hidden") {
    throw new TypeError(
      `Cannot run stage ${stage.first}..${stage.end} on token ids: it continues hidden rows; pass { kind: "hidden" }`,
    );
  }
  const D = stage.nEmbd;
  if (input.rows.length !== n * D) {
    throw new RangeError(
      `Cannot run ${n} positions on ${input.rows.length} hidden values: expected ${n}·${D}`,
    );
  }
}
