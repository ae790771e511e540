// How long each kernel variant takes to compile on a provider: a stage compiles every variant
// it uses when it opens, so this is the floor of a stage's (and a worker's) start-up time.
//
// Usage: deno run -A bench/compile_times.ts --help. Prints one line per variant as it compiles (so a stuck compile shows where), then the total.

import { openGpu } from "../engine/gpu/device.ts";
import { PROVIDER_CHOICES } from "../engine/gpu/provider.ts";
import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  oneOf,
  runCommand,
  switchFlag,
} from "../lib/cli.ts";
import { compileKernel } from "../engine/gpu/kernel.ts";
import { ATTENTION, ATTENTION_BLOCK } from "../engine/gpu/kernels/attention.ts";
import { ATTENTION_COMBINE } from "../engine/gpu/kernels/attention_combine.ts";
import { GATED_DELTA_NET } from "../engine/gpu/kernels/gated_delta_net.ts";
import { MUL_MAT, MUL_MAT_TYPES } from "../engine/gpu/kernels/mul_mat.ts";
import { decodeLayout, MUL_MAT_VEC } from "../engine/gpu/kernels/mul_mat_vec.ts";
import { typeName } from "../engine/quant/ggml_types.ts";

const COMPILE_TIMES = {
  name: "Compile times",
  usage: "deno run -A bench/compile_times.ts",
  about: "How long each kernel variant takes to compile on a provider.",
  flags: {
    gpu: flag(oneOf(PROVIDER_CHOICES), "the WebGPU provider", "builtin"),
    "allow-software-gpu": switchFlag("accept a software (CPU) adapter"),
  },
} satisfies Command<FlagTable>;

async function main(values: FlagValues<typeof COMPILE_TIMES.flags>): Promise<void> {
  const ctx = await openGpu({
    gpu: values.gpu,
    allowSoftware: values["allow-software-gpu"],
    log: (line) => console.log(line),
  });

  const jobs: [string, () => Promise<unknown>][] = [];
  for (const type of MUL_MAT_TYPES) {
    for (const id of [false, true]) {
      jobs.push([
        `mul_mat ${typeName(type)} tile${id ? " id" : ""}`,
        () => compileKernel(ctx, MUL_MAT, { type, id }),
      ]);
      const layout = decodeLayout(id ? 1024 : 2048, id);
      jobs.push([
        `mul_mat_vec ${typeName(type)}${id ? " id" : ""}`,
        () => compileKernel(ctx, MUL_MAT_VEC, { type, layout, id }),
      ]);
    }
  }
  for (const dh of [64, 128, 256]) {
    jobs.push([`attention dh ${dh}`, async () => {
      await compileKernel(ctx, ATTENTION, { dh, tq: 1 });
      await compileKernel(ctx, ATTENTION, { dh, tq: 4 });
      await compileKernel(ctx, ATTENTION_COMBINE, { dh, block: ATTENTION_BLOCK });
    }]);
  }
  for (const d of [64, 128]) {
    jobs.push([
      `gated_delta_net ${d}x${d}`,
      () => compileKernel(ctx, GATED_DELTA_NET, { dk: d, dv: d }),
    ]);
  }

  let total = 0;
  for (const [name, job] of jobs) {
    const start = performance.now();
    await job();
    const ms = performance.now() - start;
    total += ms;
    console.log(`${ms.toFixed(0).padStart(7)} ms  ${name}`);
  }
  console.log(
    `${total.toFixed(0).padStart(7)} ms  total, ${jobs.length} variants on ${ctx.provider}`,
  );
  ctx.device.destroy();
}

await runCommand(COMPILE_TIMES, main);
