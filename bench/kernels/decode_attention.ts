// Kernel bench of a decode step's attention (engine/gpu/kernels/attention.ts: pass 1 + combine)
// at several positions and of its DeltaNet recurrence (gated_delta_net.ts), on the bench model's
// head shapes: every dispatch timed in a pass of its own (DispatchProfiler, as bench/profile.ts
// times a step), then the steps back to back in one pass (as a decode step runs them); also one
// prefill call of attention, from position 0 or deep in a long prompt (--prefill-at), with the
// TFLOPS its scores and weighted sums make, checked first: every token of the call must get the
// bits its own decode step gives it, so a variant of the kernel timed here is also a right one.
//
//   deno run -A bench/kernels/decode_attention.ts --gpu dawn [--positions 512,4096] [--out r.json]
//   deno run -A bench/kernels/decode_attention.ts --gpu dawn --prefill 256 --prefill-at 30720

import { type GpuContext, openGpu } from "../../engine/gpu/device.ts";
import { GpuMemory, readBuffer } from "../../engine/gpu/buffers.ts";
import {
  createStepTimer,
  ParamArena,
  StepEncoder,
  type StepTimer,
} from "../../engine/gpu/encoder.ts";
import { attention, attentionPartialFloats } from "../../engine/gpu/kernels/attention.ts";
import { gatedDeltaNet } from "../../engine/gpu/kernels/gated_delta_net.ts";
import { DispatchProfiler } from "../../engine/gpu/profiler.ts";
import { PROVIDER_CHOICES } from "../../engine/gpu/provider.ts";
import { f32ToF16 } from "../../engine/quant/f16.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  runCommand,
  switchFlag,
  text,
  whole,
} from "../../lib/cli.ts";
import { rng } from "../../tests/_fuzz.ts";
import { BENCH_MODEL } from "./bench_shapes.ts";

/** Uniforms in [-1, 1) from a seed. */
function seeded(seed: number): () => number {
  const r = rng(seed);
  return () => 2 * r() - 1;
}

function randomF32(n: number, r: () => number): Float32Array<ArrayBuffer> {
  return Float32Array.from({ length: n }, r);
}

/** `n` f16 values in [-1, 1), packed two a u32 word as the KV cache holds them. */
function randomF16Words(n: number, r: () => number): Uint32Array<ArrayBuffer> {
  const words = new Uint32Array(n / 2);
  for (let i = 0; i < words.length; i++) words[i] = f32ToF16(r()) | (f32ToF16(r()) << 16);
  return words;
}

/** One timed row: a kernel variant's mean µs per dispatch in one scenario. */
export interface KernelTime {
  readonly scenario: string;
  readonly kernel: string;
  readonly dispatches: number;
  readonly us: number;
}

/**
 * Submits `record` (`steps` steps) once untimed (pipelines built, caches warm), then `runs` times
 * profiled: the mean µs per dispatch of each kernel over the timed runs; then `runs` times in one
 * pass: the median µs per step of the whole span.
 */
async function profile(
  ctx: GpuContext,
  arena: ParamArena,
  profiler: DispatchProfiler,
  timer: StepTimer,
  scenario: string,
  runs: number,
  steps: number,
  record: (enc: StepEncoder) => void,
): Promise<KernelTime[]> {
  const warm = new StepEncoder(ctx, arena);
  record(warm);
  warm.submit();
  await ctx.device.queue.onSubmittedWorkDone();
  const sums = new Map<string, { n: number; ns: number }>();
  for (let i = 0; i < runs; i++) {
    const enc = new StepEncoder(ctx, arena);
    record(enc);
    enc.submit(undefined, profiler);
    for (const d of (await profiler.collect()).dispatches) {
      const s = sums.get(d.kernel) ?? { n: 0, ns: 0 };
      s.n++;
      s.ns += d.endNs - d.startNs;
      sums.set(d.kernel, s);
    }
  }
  const spans: number[] = [];
  for (let i = 0; i < runs; i++) {
    const enc = new StepEncoder(ctx, arena);
    record(enc);
    enc.submit(timer);
    const ns = new BigUint64Array(await readBuffer(ctx, timer.resolve, 0, 16));
    spans.push(Number(ns[1] - ns[0]) / 1000 / steps);
  }
  spans.sort((a, b) => a - b);
  return [
    ...[...sums].map(([kernel, s]) => ({
      scenario,
      kernel,
      dispatches: s.n,
      us: s.ns / s.n / 1000,
    })),
    { scenario, kernel: "step, back to back", dispatches: runs * steps, us: spans[runs >> 1] },
  ];
}

/**
 * How many of the `n`-token prefill call's outputs (from position `pos0`) differ in their bits
 * from what each token's decode step computes alone: attention's batch invariance, 0 when right.
 */
async function differingFromDecode(
  ctx: GpuContext,
  arena: ParamArena,
  att: Parameters<typeof attention>[1] & { readonly o: GPUBuffer },
  call: (tokens: number, pos0: number) => Parameters<typeof attention>[2],
  n: number,
  pos0: number,
): Promise<number> {
  const { hq, dh, qStrideT } = call(n, pos0);
  const bytes = n * hq * dh * 4;
  const together = new StepEncoder(ctx, arena);
  attention(together, att, call(n, pos0));
  together.submit();
  const inCall = new Uint32Array(await readBuffer(ctx, att.o, 0, bytes));
  const alone = new StepEncoder(ctx, arena);
  for (let t = 0; t < n; t++) {
    attention(alone, att, { ...call(1, pos0 + t), qOffset: t * qStrideT, oOffset: t * hq * dh });
  }
  alone.submit();
  const each = new Uint32Array(await readBuffer(ctx, att.o, 0, bytes));
  return inCall.reduce((k, bits, i) => k + (bits === each[i] ? 0 : 1), 0);
}

const DECODE_ATTENTION = {
  name: "Decode attention bench",
  usage: "deno run -A bench/kernels/decode_attention.ts",
  about: "Times a decode step's attention and DeltaNet kernels on the bench model's head shapes.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "auto"),
    positions: flag(text("P,..."), "positions a decode step attends from", "512,4096"),
    prefill: flag(whole(0), "tokens of the timed prefill call (0: none)", 512),
    "prefill-at": flag(whole(0), "position of the prefill call's first token", 0),
    steps: flag(whole(1), "decode steps a timed submit records", 20),
    runs: flag(whole(1), "timed submits per scenario", 3),
    out: flag(text("FILE"), "write every result here as JSON"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof DECODE_ATTENTION.flags>): Promise<void> {
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });
  const mem = new GpuMemory(ctx);
  const arena = new ParamArena(mem, 16);
  const profiler = new DispatchProfiler(ctx);
  const timer = createStepTimer(mem)!;
  const p = BENCH_MODEL;
  const r = seeded(7);
  const positions = values.positions.split(",").map(Number);
  const prefillAt = values["prefill-at"];
  const ctxLen = Math.max(...positions, prefillAt + values.prefill) + 1;
  const { Hq: hq, Hkv: hkv, Dh: dh } = p;
  const qRow = hq * 2 * dh;
  const maxBatch = Math.max(1, values.prefill);
  const att = {
    q: mem.upload("q", randomF32(maxBatch * qRow, r)),
    kc: mem.upload("k cache", randomF16Words(ctxLen * hkv * dh, r)),
    vc: mem.upload("v cache", randomF16Words(ctxLen * hkv * dh, r)),
    part: mem.storage("partials", 4 * attentionPartialFloats({ hq, dh, ctx: ctxLen, maxBatch })),
    o: mem.storage("o", maxBatch * hq * dh * 4),
  };
  const call = (tokens: number, pos0: number) => ({
    tokens,
    hq,
    hkv,
    dh,
    pos0,
    qStrideT: qRow,
    qStrideH: 2 * dh,
    gateOffset: dh,
    oStrideT: hq * dh,
  });
  const results: KernelTime[] = [];
  const measure = async (
    scenario: string,
    steps: number,
    runs: number,
    step: (enc: StepEncoder) => void,
  ) => {
    const rows = await profile(ctx, arena, profiler, timer, scenario, runs, steps, (enc) => {
      for (let s = 0; s < steps; s++) step(enc);
    });
    for (const row of rows) {
      console.log(`${row.scenario} | ${row.kernel} | ${row.dispatches} | ${row.us.toFixed(1)} µs`);
    }
    results.push(...rows);
  };
  for (const pos of positions) {
    await measure(`decode attention @${pos}`, values.steps, values.runs, (enc) => {
      attention(enc, att, call(1, pos));
    });
  }
  if (values.prefill) {
    const n = values.prefill;
    const scenario = `prefill attention ${n} @${prefillAt}`;
    const differ = await differingFromDecode(ctx, arena, att, call, n, prefillAt);
    if (differ) {
      throw new Error(
        `${scenario}: ${differ} of ${
          n * hq * dh
        } outputs differ from each token's decode step alone; the kernel is wrong, its time is not worth taking`,
      );
    }
    console.log(`${scenario}: the call's ${n * hq * dh} outputs have each token's decode bits`);
    await measure(scenario, 1, values.runs, (enc) => {
      attention(enc, att, call(n, prefillAt));
    });
    // Each (query, position, head) takes dh fmas for its score and dh for its share of V.
    const pairs = n * prefillAt + (n * (n + 1)) / 2;
    const step = results.findLast((row) => row.scenario === scenario)!;
    console.log(`${scenario}: ${(4 * dh * hq * pairs / step.us / 1e6).toFixed(2)} TFLOPS`);
  }
  const { Nk: nk, Nv: nv, Dk: dk, Dv: dv, C } = p;
  const dn = {
    u: mem.upload("u", randomF32(C, r)),
    ba: mem.upload("ba", randomF32(2 * nv, r)),
    z: mem.upload("z", randomF32(nv * dv, r)),
    p: mem.upload("params", randomF32(2 * nv + dv, r)),
    state: mem.upload("state", randomF32(nv * dk * dv, r)),
    y: mem.storage("y", nv * dv * 4),
  };
  await measure("decode deltanet", values.steps, values.runs, (enc) => {
    gatedDeltaNet(enc, dn, {
      nk,
      nv,
      dk,
      dv,
      tokens: 1,
      interleave: false,
      uStrideT: C,
      baStrideT: 2 * nv,
      zOffset: 0,
      zStrideT: nv * dv,
      yStrideT: nv * dv,
      eps: 1e-6,
    });
  });
  if (values.out) {
    await Deno.writeTextFile(
      values.out,
      JSON.stringify({ device: ctx.summary, provider: ctx.provider, results }, null, 1),
    );
  }
  profiler.destroy();
  mem.destroy();
  ctx.device.destroy();
}

await runCommand(DECODE_ATTENTION, main);
