// The Dawn GPU provider: Google's Dawn through the npm package `webgpu` (a native addon).
// One of the two implementations behind engine/gpu/provider.ts; its readbacks are ~100x cheaper.
// TANDEM_DAWN_OPTIONS (e.g. "backend=vulkan") is passed to Dawn's create() (dawnOptions).

import type { GpuProvider } from "./provider.ts";

interface DawnModule {
  create(options: string[]): unknown;
  globals: Record<string, unknown>;
}

let loaded: Promise<GpuProvider> | undefined;

/**
 * Dawn device toggles the engine asks for. disable_lazy_clear_for_mapped_at_creation_buffer:
 * weights are filled mapped at creation (buffers.ts fillStorage writes every byte, padding
 * included), so zeroing them first is waste (the open of the bench model on the H200: 10.06 ->
 * 8.22 s in one run). Tint's bounds clamps stay: disable_robustness measured no faster there.
 */
export const DAWN_TOGGLES: readonly string[] = [
  "disable_lazy_clear_for_mapped_at_creation_buffer",
];

/**
 * The toggles under which Dawn lists subgroup matrices and f16 on NVIDIA's Vulkan driver (the
 * GPU box, 2026-12-06: /work/shared/device/README.md): allow_unsafe_apis unlocks experimental
 * features, vulkan_enable_f16_on_nvidia lifts Dawn's default block of f16 there, and cooperative
 * matrices need the Vulkan memory model. Set only under TANDEM_MMA=1, so that other runs are
 * today's Dawn exactly (the memory model changes every kernel's SPIR-V).
 */
export const DAWN_MMA_TOGGLES: readonly string[] = [
  "allow_unsafe_apis",
  "vulkan_enable_f16_on_nvidia",
  "use_vulkan_memory_model",
];

/**
 * Toggles the engine turns off. timestamp_quantization: Dawn rounds timestamp queries to 16.384
 * µs (a browser's guard against timing attacks), which hid every short kernel's time in the
 * profiles and kernel benches (a profile on the H100, 2026-12-06: get_rows 32.8 µs quantized,
 * 12.2 without). The engine reads timestamps only to time itself.
 */
export const DAWN_OFF_TOGGLES: readonly string[] = ["timestamp_quantization"];

/**
 * The options for Dawn's create() from TANDEM_DAWN_OPTIONS: comma-separated key=value pairs,
 * where a value may itself be a comma list (a piece without "=" continues the pair before), plus
 * enable-dawn-features=DAWN_TOGGLES (and DAWN_MMA_TOGGLES with `mma`) and
 * disable-dawn-features=DAWN_OFF_TOGGLES, each unless the variable sets that key itself.
 */
export function dawnOptions(env: string | undefined, mma = true): string[] {
  const options: string[] = [];
  for (const piece of (env ?? "").split(",")) {
    if (piece === "") continue;
    if (piece.includes("=") || !options.length) options.push(piece);
    else options[options.length - 1] += `,${piece}`;
  }
  if (!options.some((o) => o.startsWith("enable-dawn-features="))) {
    const toggles = mma ? [...DAWN_TOGGLES, ...DAWN_MMA_TOGGLES] : DAWN_TOGGLES;
    options.push(`enable-dawn-features=${toggles.join(",")}`);
  }
  if (!options.some((o) => o.startsWith("disable-dawn-features="))) {
    options.push(`disable-dawn-features=${DAWN_OFF_TOGGLES.join(",")}`);
  }
  return options;
}

/**
 * TANDEM_MMA=1 turns the tensor-core kernels on: DAWN_MMA_TOGGLES here, the subgroup-matrix feature
 * in engine/gpu/device.ts. Off by default: on the H100 the split-precision products (the only ones
 * that keep f32's accuracy) run no faster than the f32 tiles, and the expert products slower
 * (docs/PERFORMANCE-NOTES.md, "Tensor cores").
 */
export function subgroupMatrixWantedByEnv(): boolean {
  try {
    return Deno.env.get("TANDEM_MMA") === "1";
  } catch {
    return false;
  }
}

function envOptions(): string | undefined {
  try {
    return Deno.env.get("TANDEM_DAWN_OPTIONS");
  } catch {
    return undefined;
  }
}

/** Longest pause between two of Dawn's event polls while something waits on the GPU (ms). */
export const POLL_MAX_MS = 0.25;
/** First pause after the immediate first poll of a wait (ms); each later one doubles. */
export const POLL_MIN_MS = 0.02;
/** Longest pause while the awaited work's expected end is further off than FINE_BEFORE_MS. */
export const POLL_FAR_MS = 0.5;
/** Polls come every POLL_MIN_MS from this long before an expected end... */
export const FINE_BEFORE_MS = 0.05;
/** ...until this long after it. */
export const FINE_AFTER_MS = 0.15;

/**
 * When Dawn polls for GPU events. While any promise of Dawn's waits (mapAsync,
 * onSubmittedWorkDone, popErrorScope), its binding re-arms a fresh native setImmediate callback
 * after every poll, tens of thousands per second. Each callback carries a Node-API finalizer,
 * and Deno 2.9 deregisters those from a list with a linear search, so collecting them cost time
 * growing with the square of their number: the main thread went busy outside JavaScript for 0.1
 * to 16 s at a time (docs/PERFORMANCE.md, "Dawn's stalls"). Polling at once when a wait begins,
 * then after pauses doubling from POLL_MIN_MS to POLL_MAX_MS, keeps that garbage ~20x smaller
 * and adds at most POLL_MAX_MS to a wait. Where the caller says when the work should end
 * (expect), the pauses before it may grow to POLL_FAR_MS and the polls around it come every
 * POLL_MIN_MS: as few polls, and the end seen within ~POLL_MIN_MS instead of ~POLL_MAX_MS.
 */
export class PollPacer {
  #lastPoll = -Infinity;
  #pause = 0;
  #expected = -Infinity;

  /**
   * GPU work awaited from `now` should end at `at` (performance.now() ms). Of several in
   * flight, the earliest end not yet past counts.
   */
  expect(at: number, now: number): void {
    const past = this.#expected + FINE_AFTER_MS < now;
    this.#expected = past ? at : Math.min(this.#expected, at);
  }

  /** The pause (ms) before a poll that Dawn asks for at `now`. */
  next(now: number): number {
    // A request well after the last poll starts a new wait: its work may be done already.
    if (now - this.#lastPoll > 4 * POLL_MAX_MS) return this.#pause = 0;
    const fineFrom = this.#expected - FINE_BEFORE_MS;
    if (now >= fineFrom && now <= this.#expected + FINE_AFTER_MS) return this.#pause = POLL_MIN_MS;
    const doubled = Math.max(POLL_MIN_MS, 2 * this.#pause);
    const longest = now < fineFrom ? Math.min(POLL_FAR_MS, fineFrom - now) : POLL_MAX_MS;
    return this.#pause = Math.min(doubled, longest);
  }

  /** Records that a poll ran at `now`. */
  polled(now: number): void {
    this.#lastPoll = now;
  }
}

/** The pacer of this process's Dawn polls while pacing is on. */
let pacer: PollPacer | undefined;

/** Tells the pacer when the GPU work now awaited should end (a no-op while pacing is off). */
export function expectGpuDone(at: number): void {
  pacer?.expect(at, performance.now());
}

type Immediate = (callback: (...args: unknown[]) => void, ...args: unknown[]) => unknown;

/** Dawn's poll callbacks are unnamed native functions; everything else is left alone. */
export function isDawnPoll(callback: unknown): boolean {
  return typeof callback === "function" && callback.name === "" &&
    Function.prototype.toString.call(callback).endsWith("[native code] }");
}

/** setImmediate as it was before pacing, while pacing is on. */
let unpaced: Immediate | undefined;

/**
 * Turns the pacing of Dawn's polls (PollPacer) on or off for this process; on once Dawn loads.
 * bench/host_probe.ts turns it off to show what it prevents.
 */
export function paceDawnPolls(on: boolean): void {
  if (on === (unpaced !== undefined)) return;
  if (!on) {
    (globalThis as { setImmediate: unknown }).setImmediate = unpaced;
    unpaced = undefined;
    pacer = undefined;
    return;
  }
  const unpacedImmediate = globalThis.setImmediate as unknown as Immediate;
  unpaced = unpacedImmediate;
  const paces = new PollPacer();
  pacer = paces;
  const paced: Immediate = (callback, ...args) => {
    if (!isDawnPoll(callback)) return unpacedImmediate(callback, ...args);
    const due = performance.now() + paces.next(performance.now());
    // The pause is spent in turns of the event loop, not in a blocking wait: the loop reads its
    // sockets only every few dozen turns, so pauses that blocked it for up to POLL_MAX_MS a turn
    // made every socket read wait 10-40 ms while the GPU worked (a split's frames, a streamed
    // reply). A plain JavaScript callback a turn carries no finalizer, unlike Dawn's. The price:
    // the main thread keeps one core busy while the GPU works, as a spinning CUDA wait does.
    const turn = () => {
      if (performance.now() < due) {
        unpacedImmediate(turn);
        return;
      }
      paces.polled(performance.now());
      callback(...args);
    };
    return unpacedImmediate(turn);
  };
  // Keep what hangs off setImmediate (util.promisify's custom symbol) for node-style callers.
  for (const key of Reflect.ownKeys(unpacedImmediate)) {
    if (!Object.hasOwn(paced, key)) {
      Object.defineProperty(paced, key, Object.getOwnPropertyDescriptor(unpacedImmediate, key)!);
    }
  }
  (globalThis as { setImmediate: unknown }).setImmediate = paced;
}

async function load(): Promise<GpuProvider> {
  let mod: DawnModule;
  try {
    mod = await import("webgpu") as unknown as DawnModule;
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    const hint = /ffi|permission|NotCapable/i.test(why)
      ? "run with --allow-ffi or use --gpu=builtin"
      : "check that the npm package webgpu is installed for this platform or use --gpu=builtin";
    throw new Error(`Cannot start the Dawn provider: ${why}; ${hint}`);
  }
  // Dawn's objects (GPUBufferUsage, GPUShaderStage, ...) must be globals for code written
  // against the standard API; Deno's builtin ones are replaced only where Dawn defines them.
  Object.assign(globalThis, mod.globals);
  paceDawnPolls(true);
  return {
    name: "dawn",
    gpu: mod.create(dawnOptions(envOptions(), subgroupMatrixWantedByEnv())) as GPU,
    expectDone: expectGpuDone,
  };
}

/** Loads Dawn once per process; later calls share the same `GPU`. */
export function dawnProvider(): Promise<GpuProvider> {
  loaded ??= load();
  return loaded;
}
