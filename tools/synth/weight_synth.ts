// Seeded random tensor bytes for the model generator, made in chunks on worker threads when large.
// Called by tools/synth/generate_model.ts for each tensor it hands to the GGUF writer.

import type { GgufTensorPlan } from "../gguf/gguf_write.ts";
import { quantize, randomBlocks } from "./quantize.ts";
import { rowBytes } from "../../engine/quant/ggml_types.ts";
import { dequantize } from "../../engine/quant/dequant.ts";

/**
 * How values are drawn: N(a, b²), U(a, b), or −exp(U(a, b)) (ssm_a = −exp(A_log)); or made:
 * "identity" puts 1 at column r of row r (0 elsewhere), "rows-of" makes row r the row
 * (r − shift) mod rows of `source` (same row length), converted to this tensor's type.
 */
export type Init =
  | {
    readonly dist: "normal" | "uniform" | "neg-exp-uniform";
    readonly a: number;
    readonly b: number;
  }
  | { readonly dist: "identity" }
  | { readonly dist: "rows-of"; readonly source: SynthTensor; readonly shift: number };

export interface SynthTensor extends GgufTensorPlan {
  readonly init: Init;
}

/**
 * "quantize" draws floats and quantizes them (values close to what the floats say); "blocks"
 * writes random valid blocks of the right spread for zero-mean normal tensors (quantizing floats
 * runs at a few M values/s, far too slow for tens of GB) and draws floats for the rest.
 */
export type Synthesis = "quantize" | "blocks";

/**
 * Values per chunk, rounded down to whole rows. Each chunk has its own random stream, so the
 * bytes do not depend on how chunks are spread over threads; changing this changes every model.
 */
const CHUNK_VALUES = 1 << 18;
/** Jobs per worker for one tensor: small enough jobs that the workers finish together. */
const JOBS_PER_WORKER = 2;

/**
 * xoshiro128** seeded through a splitmix32-style mix of (seed, tensor name, chunk): independent
 * streams, so a tensor's values depend neither on the other tensors nor on the thread count.
 */
export class TensorRng {
  #s = new Uint32Array(4);
  #spare = NaN;

  constructor(seed: number, name: string, chunk: number) {
    let h = 0x811c9dc5 ^ (seed >>> 0);
    for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
    h ^= Math.imul(Math.floor(seed / 0x100000000) | 0, 0x85ebca6b);
    h = Math.imul(h ^ chunk, 0x01000193);
    for (let i = 0; i < 4; i++) {
      h = (h + 0x9e3779b9) | 0;
      let z = h;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      this.#s[i] = z ^ (z >>> 16);
    }
    if ((this.#s[0] | this.#s[1] | this.#s[2] | this.#s[3]) === 0) this.#s[0] = 1;
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    const s = this.#s;
    const r = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return r / 0x100000000;
  }

  /** Standard normal (Box–Muller; the second value of each pair is kept for the next call). */
  normal(): number {
    if (!Number.isNaN(this.#spare)) {
      const v = this.#spare;
      this.#spare = NaN;
      return v;
    }
    const r = Math.sqrt(-2 * Math.log(1 - this.uniform()));
    const phi = 2 * Math.PI * this.uniform();
    this.#spare = r * Math.sin(phi);
    return r * Math.cos(phi);
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** Drawn values of rows [r0, r0 + values.length / row) of a tensor with rows of `row`. */
function fill(values: Float32Array, init: Init, rng: TensorRng, row: number, r0: number): void {
  if (init.dist === "rows-of") throw new TypeError("Cannot draw rows copied from another tensor");
  if (init.dist === "identity") {
    values.fill(0);
    for (let r = r0; r < r0 + values.length / row && r < row; r++) values[(r - r0) * row + r] = 1;
    return;
  }
  const { a, b } = init;
  for (let i = 0; i < values.length; i++) {
    switch (init.dist) {
      case "normal":
        values[i] = a + b * rng.normal();
        break;
      case "uniform":
        values[i] = a + (b - a) * rng.uniform();
        break;
      case "neg-exp-uniform":
        values[i] = -Math.exp(a + (b - a) * rng.uniform());
        break;
    }
  }
}

/** Row length, row count and rows per chunk of a tensor. */
function geometry(t: SynthTensor): { row: number; rows: number; rowsPerChunk: number } {
  const row = t.shape[0];
  const rows = t.shape.slice(1).reduce((x, y) => x * y, 1);
  return { row, rows, rowsPerChunk: Math.max(1, Math.floor(CHUNK_VALUES / row)) };
}

export function chunkCount(t: SynthTensor): number {
  const { rows, rowsPerChunk } = geometry(t);
  return Math.ceil(rows / rowsPerChunk);
}

/** The bytes of chunks [first, first + count) of tensor `t`. */
export function tensorChunks(
  t: SynthTensor,
  seed: number,
  synthesis: Synthesis,
  first: number,
  count: number,
): Uint8Array<ArrayBuffer> {
  const { row, rows, rowsPerChunk } = geometry(t);
  const bytesPerRow = rowBytes(t.type, row);
  const r0 = first * rowsPerChunk;
  const r1 = Math.min(rows, (first + count) * rowsPerChunk);
  if (t.init.dist === "rows-of") return rowsOf(t, t.init, seed, synthesis, r0, r1);
  const out = new Uint8Array((r1 - r0) * bytesPerRow);
  const init = t.init;
  const blocks = synthesis === "blocks" && init.dist === "normal" && init.a === 0;
  const scratch = blocks ? undefined : new Float32Array(Math.min(rowsPerChunk, r1 - r0) * row);
  for (let c = first; c < first + count; c++) {
    const rng = new TensorRng(seed, t.name, c);
    const ra = c * rowsPerChunk;
    const rb = Math.min(rows, ra + rowsPerChunk);
    const dst = out.subarray((ra - r0) * bytesPerRow, (rb - r0) * bytesPerRow);
    if (scratch) {
      const values = scratch.subarray(0, (rb - ra) * row);
      fill(values, init, rng, row, ra);
      dst.set(quantize(t.type, values));
    } else if (init.dist === "normal") {
      randomBlocks(t.type, (rb - ra) * row, init.b, () => rng.uniform(), dst);
    }
  }
  return out;
}

/** Rows [r0, r1) of a "rows-of" tensor: its source's rows, made as the source makes them. */
function rowsOf(
  t: SynthTensor,
  init: { readonly source: SynthTensor; readonly shift: number },
  seed: number,
  synthesis: Synthesis,
  r0: number,
  r1: number,
): Uint8Array<ArrayBuffer> {
  const src = init.source;
  const { row, rows, rowsPerChunk } = geometry(src);
  if (row !== t.shape[0]) {
    throw new RangeError(
      `Cannot make "${t.name}" from "${src.name}": rows of ${row}, not ${t.shape[0]}`,
    );
  }
  const srcRow = rowBytes(src.type, row);
  const dstRow = rowBytes(t.type, row);
  const out = new Uint8Array((r1 - r0) * dstRow);
  // Runs of consecutive source rows: at most two, where the shift wraps.
  for (let r = r0; r < r1;) {
    const s0 = (((r - init.shift) % rows) + rows) % rows;
    const n = Math.min(r1 - r, rows - s0);
    const c0 = Math.floor(s0 / rowsPerChunk);
    const c1 = Math.floor((s0 + n - 1) / rowsPerChunk);
    const bytes = tensorChunks(src, seed, synthesis, c0, c1 - c0 + 1);
    const at = (s0 - c0 * rowsPerChunk) * srcRow;
    const run = bytes.subarray(at, at + n * srcRow);
    const made = src.type === t.type ? run : quantize(t.type, dequantize(src.type, run, n * row));
    out.set(made, (r - r0) * dstRow);
    r += n;
  }
  return out;
}

/** The bytes of a whole tensor, made on this thread. */
export function tensorData(t: SynthTensor, seed: number, synthesis: Synthesis): Uint8Array {
  return tensorChunks(t, seed, synthesis, 0, chunkCount(t));
}

interface ChunkJob {
  readonly id: number;
  readonly tensor: SynthTensor;
  readonly seed: number;
  readonly synthesis: Synthesis;
  readonly first: number;
  readonly count: number;
}

type ChunkReply =
  | { readonly id: number; readonly bytes: Uint8Array<ArrayBuffer> }
  | { readonly id: number; readonly error: string };

/** The message side of a worker's global scope, as serveChunkJobs needs it. */
interface WorkerScope {
  onmessage: ((e: MessageEvent<ChunkJob>) => void) | null;
  postMessage(message: ChunkReply, transfer: Transferable[]): void;
}

/** Worker side: answers each ChunkJob with its bytes (transferred) or the error's message. */
export function serveChunkJobs(scope: WorkerScope): void {
  scope.onmessage = ({ data: job }) => {
    try {
      const bytes = tensorChunks(job.tensor, job.seed, job.synthesis, job.first, job.count);
      scope.postMessage({ id: job.id, bytes }, [bytes.buffer]);
    } catch (e) {
      scope.postMessage({ id: job.id, error: e instanceof Error ? e.message : String(e) }, []);
    }
  };
}

/**
 * Worker threads that make tensors chunk by chunk. The workers run this module from a blob
 * module that imports it, which keeps the job protocol in one file.
 */
export class ChunkPool {
  readonly #workers: Worker[] = [];
  readonly #idle: Worker[] = [];
  readonly #queue: ChunkJob[] = [];
  readonly #pending = new Map<number, [(b: Uint8Array) => void, (e: Error) => void]>();
  readonly #url: string;
  #nextId = 0;

  constructor(size: number) {
    const source = `import { serveChunkJobs } from ${JSON.stringify(import.meta.url)};\n` +
      `serveChunkJobs(self);\n`;
    this.#url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
    for (let i = 0; i < size; i++) {
      const worker = new Worker(this.#url, { type: "module" });
      worker.onmessage = (e: MessageEvent<ChunkReply>) => this.#settle(worker, e.data);
      worker.onerror = (e) => {
        e.preventDefault();
        this.#failAll(new Error(`A weight-synthesis worker failed: ${e.message}`));
      };
      this.#workers.push(worker);
      this.#idle.push(worker);
    }
  }

  /** The bytes of tensor `t`, its chunks made in parallel. */
  async tensor(t: SynthTensor, seed: number, synthesis: Synthesis): Promise<Uint8Array> {
    const n = chunkCount(t);
    if (n === 1) return tensorChunks(t, seed, synthesis, 0, 1);
    const perJob = Math.ceil(n / (JOBS_PER_WORKER * this.#workers.length));
    const parts: Promise<Uint8Array>[] = [];
    for (let first = 0; first < n; first += perJob) {
      const count = Math.min(perJob, n - first);
      parts.push(this.#run({ id: this.#nextId++, tensor: t, seed, synthesis, first, count }));
    }
    const done = await Promise.all(parts);
    const out = new Uint8Array(done.reduce((s, p) => s + p.length, 0));
    let at = 0;
    for (const p of done) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  close(): void {
    for (const w of this.#workers) w.terminate();
    URL.revokeObjectURL(this.#url);
    this.#failAll(new Error("The weight-synthesis pool was closed with jobs pending"));
  }

  #run(job: ChunkJob): Promise<Uint8Array> {
    return new Promise((resolve, reject) => {
      this.#pending.set(job.id, [resolve, reject]);
      this.#queue.push(job);
      this.#dispatch();
    });
  }

  #dispatch(): void {
    while (this.#idle.length > 0 && this.#queue.length > 0) {
      this.#idle.pop()!.postMessage(this.#queue.shift()!);
    }
  }

  #settle(worker: Worker, reply: ChunkReply): void {
    const entry = this.#pending.get(reply.id);
    this.#pending.delete(reply.id);
    this.#idle.push(worker);
    this.#dispatch();
    if (!entry) return;
    if ("error" in reply) entry[1](new Error(`Cannot make tensor chunks: ${reply.error}`));
    else entry[0](reply.bytes);
  }

  #failAll(error: Error): void {
    for (const [, reject] of this.#pending.values()) reject(error);
    this.#pending.clear();
    this.#queue.length = 0;
  }
}
