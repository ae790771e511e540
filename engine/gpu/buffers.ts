// GPU buffers: creation with 4-byte padding, uploads, readbacks, and GpuMemory, the one owner
// of everything a stage allocates. Used by the weight loader (engine/gpu/gpu_weights.ts), the
// stage's state and activations (engine/gpu/gpu_stage.ts), the encoder's arena, and tests.

import type { GpuContext } from "./device.ts";

/** A window of a buffer as a binding sees it. */
export interface BufferSlice {
  readonly buffer: GPUBuffer;
  readonly offset: number;
  readonly size: number;
}
export type BufferRef = GPUBuffer | BufferSlice;

/** True for a slice (a GPUBuffer has no `buffer` property). */
export function isSlice(ref: BufferRef): ref is BufferSlice {
  return "buffer" in ref;
}

const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

/** Rounds up to a multiple of 4 (copy and binding granularity), at least 16 bytes. */
export function paddedSize(bytes: number): number {
  return Math.max(16, Math.ceil(bytes / 4) * 4);
}

/** GPU memory as the start-up log and `deno task plan` print it: GiB from 1 GiB, else MiB. */
export function formatBytes(n: number): string {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;
}

/** paddedSize(bytes), refused when the device cannot hold a buffer that large. */
function checkedSize(ctx: GpuContext, label: string, bytes: number): number {
  const size = paddedSize(bytes);
  if (size > ctx.limits.maxBufferSize) {
    throw new RangeError(
      `Cannot create GPU buffer "${label}" of ${size} bytes: the device allows ${ctx.limits.maxBufferSize}; use a smaller context or fewer slots`,
    );
  }
  return size;
}

/** A zero-filled storage buffer of at least `bytes` bytes. */
export function createStorage(ctx: GpuContext, label: string, bytes: number): GPUBuffer {
  return ctx.device.createBuffer({ label, size: checkedSize(ctx, label, bytes), usage: STORAGE });
}

const dummies = new WeakMap<GPUDevice, GPUBuffer[]>();

/**
 * The `index`-th 16-byte storage buffer for bindings a kernel variant does not use. Writable
 * bindings of one dispatch need distinct dummies: Dawn rejects aliased writable bindings.
 */
export function dummyStorage(ctx: GpuContext, index = 0): GPUBuffer {
  let list = dummies.get(ctx.device);
  if (!list) {
    list = [];
    dummies.set(ctx.device, list);
  }
  list[index] ??= createStorage(ctx, `unused binding ${index}`, 16);
  return list[index];
}

/** Writes `data` at byte `offset`, padding a ragged tail with zeros to 4 bytes. */
export function writeBytes(
  ctx: GpuContext,
  buffer: GPUBuffer,
  offset: number,
  data: ArrayBufferView,
): void {
  const bytes = new Uint8Array(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  if (bytes.length % 4 === 0) {
    ctx.device.queue.writeBuffer(buffer, offset, bytes);
    return;
  }
  const padded = new Uint8Array(Math.ceil(bytes.length / 4) * 4);
  padded.set(bytes);
  ctx.device.queue.writeBuffer(buffer, offset, padded);
}

/** Bytes handed to a fill at a time while streaming data into a buffer. */
export const FILL_PIECE_BYTES = 64 * 1024 * 1024;

/** Writes `dst.length` bytes of a buffer's content, starting at byte `offset` of it, into `dst`. */
export type Fill = (dst: Uint8Array<ArrayBuffer>, offset: number) => Promise<void>;

/**
 * Host memory the builtin provider streams buffers through: two pieces, so that the next one
 * is filled (a file read, off the main thread) while the last is copied by writeBuffer. One per
 * load, dropped with it.
 */
export class FillStaging {
  readonly #pieces: Uint8Array<ArrayBuffer>[] = [];

  piece(i: number): Uint8Array<ArrayBuffer> {
    this.#pieces[i % 2] ??= new Uint8Array(FILL_PIECE_BYTES);
    return this.#pieces[i % 2];
  }
}

/** How fillStorage sizes and streams a buffer. */
export interface FillOptions {
  /** Zero bytes kept after the content (e.g. for kernels that read a word past a row). */
  readonly padding?: number;
  /** Reused host pieces for the builtin provider; one fill at a time may use them. */
  readonly staging?: FillStaging;
  /** Hears of the bytes of each piece filled. */
  readonly onPiece?: (bytes: number) => void;
  /** Fill the buffer mapped at creation (default: on Dawn) or through writeBuffer. */
  readonly mapped?: boolean;
  /** Largest piece (default FILL_PIECE_BYTES, which `staging` holds); tests use small ones. */
  readonly pieceBytes?: number;
}

/**
 * A storage buffer of `bytes` bytes of content (then zeros) that `fill` writes, piece by piece.
 * On Dawn the buffer is mapped at creation and filled in place, so a file read lands in the
 * mapping with no other copy (2.3 GB/s on the H200 box, against 0.9 for reading into fresh
 * arrays and writeBuffer). Deno's builtin provider did not fill 2 GiB that way in 55 s there, so
 * it fills two reused host pieces (`staging`) and writes them, reading the next piece while the
 * last is copied (1.5 GB/s).
 */
export async function fillStorage(
  ctx: GpuContext,
  label: string,
  bytes: number,
  fill: Fill,
  options: FillOptions = {},
): Promise<GPUBuffer> {
  const size = checkedSize(ctx, label, bytes + (options.padding ?? 0));
  const mapped = options.mapped ?? ctx.provider === "dawn";
  const pieceBytes = Math.min(options.pieceBytes ?? FILL_PIECE_BYTES, FILL_PIECE_BYTES);
  const buffer = ctx.device.createBuffer({ label, size, usage: STORAGE, mappedAtCreation: mapped });
  try {
    if (mapped) {
      const view = new Uint8Array(buffer.getMappedRange());
      for (let at = 0; at < bytes; at += pieceBytes) {
        const len = Math.min(pieceBytes, bytes - at);
        await fill(view.subarray(at, at + len), at);
        options.onPiece?.(len);
      }
      // The tail is zeroed here: Dawn is asked not to clear mapped-at-creation buffers
      // (engine/gpu/dawn.ts DAWN_TOGGLES), so nothing else writes it.
      view.fill(0, bytes);
      buffer.unmap();
      return buffer;
    }
    const staging = options.staging ?? new FillStaging();
    const piece = (i: number) =>
      staging.piece(i).subarray(0, Math.min(pieceBytes, bytes - i * pieceBytes));
    const count = Math.ceil(bytes / pieceBytes);
    let next = count > 0 ? fill(piece(0), 0) : undefined;
    try {
      for (let i = 0; i < count; i++) {
        await next;
        next = i + 1 < count ? fill(piece(i + 1), (i + 1) * pieceBytes) : undefined;
        writeBytes(ctx, buffer, i * pieceBytes, piece(i));
        options.onPiece?.(piece(i).length);
      }
    } finally {
      // A failure leaves the read ahead running into `staging`: let it land before it is reused.
      await next?.catch(() => {});
    }
    return buffer;
  } catch (e) {
    buffer.destroy();
    throw e;
  }
}

/** A storage buffer holding `data` (zero-padded). */
export function uploadStorage(ctx: GpuContext, label: string, data: ArrayBufferView): GPUBuffer {
  const buffer = createStorage(ctx, label, data.byteLength);
  writeBytes(ctx, buffer, 0, data);
  return buffer;
}

/** A mappable buffer for reading results back, sized to a multiple of 4. */
export function createReadback(ctx: GpuContext, label: string, bytes: number): GPUBuffer {
  return ctx.device.createBuffer({
    label,
    size: paddedSize(bytes),
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
}

/** Maps a readback buffer and copies out `bytes` bytes; leaves it unmapped for reuse. */
export async function mapRead(buffer: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
  await buffer.mapAsync(GPUMapMode.READ, 0, paddedSize(bytes));
  const copy = buffer.getMappedRange(0, paddedSize(bytes)).slice(0, bytes);
  buffer.unmap();
  return copy;
}

/** Reads `bytes` bytes of `src` from `offset` (one copy, one submit, one map). For tests/tools. */
export async function readBuffer(
  ctx: GpuContext,
  src: GPUBuffer,
  offset: number,
  bytes: number,
): Promise<ArrayBuffer> {
  const staging = createReadback(ctx, `read ${src.label}`, bytes);
  const enc = ctx.device.createCommandEncoder();
  enc.copyBufferToBuffer(src, offset, staging, 0, paddedSize(bytes));
  ctx.device.queue.submit([enc.finish()]);
  try {
    return await mapRead(staging, bytes);
  } finally {
    staging.destroy();
  }
}

/**
 * The owner of a stage's GPU allocations: weights, activations, per-slot state, snapshots,
 * readbacks, the params arena and timers are all created here and destroyed together by
 * destroy(), so nothing a stage made can outlive it or be freed twice.
 */
export class GpuMemory {
  readonly ctx: GpuContext;
  readonly #owned = new Set<GPUBuffer | GPUQuerySet>();

  constructor(ctx: GpuContext) {
    this.ctx = ctx;
  }

  /** A zero-filled storage buffer (createStorage), owned here. */
  storage(label: string, bytes: number): GPUBuffer {
    return this.#own(createStorage(this.ctx, label, bytes));
  }

  /** A storage buffer that `fill` writes piece by piece (fillStorage), owned here. */
  async fill(label: string, bytes: number, fill: Fill, options?: FillOptions): Promise<GPUBuffer> {
    return this.#own(await fillStorage(this.ctx, label, bytes, fill, options));
  }

  /** A storage buffer holding `data` (zero-padded), owned here. */
  upload(label: string, data: ArrayBufferView): GPUBuffer {
    return this.#own(uploadStorage(this.ctx, label, data));
  }

  /** A readback buffer (createReadback), owned here. */
  readback(label: string, bytes: number): GPUBuffer {
    return this.#own(createReadback(this.ctx, label, bytes));
  }

  /** Any other buffer (uniforms, query resolves), owned here. */
  buffer(desc: GPUBufferDescriptor): GPUBuffer {
    return this.#own(this.ctx.device.createBuffer(desc));
  }

  querySet(desc: GPUQuerySetDescriptor): GPUQuerySet {
    return this.#own(this.ctx.device.createQuerySet(desc));
  }

  /** Bytes of the buffers owned now. */
  get bytes(): number {
    let n = 0;
    for (const b of this.#owned) if ("size" in b) n += b.size;
    return n;
  }

  /** Destroys one allocation before the rest (a buffer replaced by a larger one). */
  free(b: GPUBuffer | GPUQuerySet): void {
    if (this.#owned.delete(b)) b.destroy();
  }

  /** Destroys everything owned; the memory can be reused afterwards. */
  destroy(): void {
    for (const b of this.#owned) b.destroy();
    this.#owned.clear();
  }

  #own<T extends GPUBuffer | GPUQuerySet>(b: T): T {
    this.#owned.add(b);
    return b;
  }
}
