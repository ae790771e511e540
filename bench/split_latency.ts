// Decode tokens/s of one stream and of two at once through a split chain whose link is delayed by
// a fixed time each way (tests/_proxy.ts in its own process): what a link between boxes costs.
//
// Usage: deno run -A bench/split_latency.ts [--delays 0,1,5,20] [--rounds 5] [--tokens 64]
// On the tiny test model, the CPU reference engine in both stages: head layers 0:2 here, a worker
// process for 2:4 behind the proxy, two slots. Prints a Markdown table (docs/PERFORMANCE.md).

import {
  type Command,
  flag,
  type FlagTable,
  type FlagValues,
  listOf,
  runCommand,
  whole,
} from "../lib/cli.ts";
import { startTestHead, streamRates, tinyModel } from "../tests/_head.ts";
import { startProxyProcess } from "../tests/_proxy.ts";
import { startWorker } from "../tests/_workers.ts";

const SPLIT_LATENCY = {
  name: "Split latency",
  usage: "deno run -A bench/split_latency.ts",
  about: "Times one stream and two streams at once through a head and a worker whose link a " +
    "proxy delays by each of --delays ms each way; prints their tokens/s, median and best.",
  flags: {
    delays: flag(listOf(whole(0, 1000)), "one-way delays to time, ms", [0, 1, 5, 20]),
    rounds: flag(whole(1), "alternating rounds of one and two streams per delay", 5),
    tokens: flag(whole(1), "tokens per stream", 64),
  },
} satisfies Command<FlagTable>;

const CTX = 512;

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

async function run(flags: FlagValues<typeof SPLIT_LATENCY.flags>): Promise<void> {
  const model = await tinyModel();
  const worker = await startWorker({ model, layers: "2:4", slots: 2, ctx: CTX });
  const rows = [
    "| one-way delay | one stream, tok/s | two streams, tok/s | two ÷ one |",
    "| ------------- | ----------------- | ------------------ | --------- |",
  ];
  try {
    for (const delay of flags.delays) {
      const proxy = await startProxyProcess(worker.address, delay);
      const head = await startTestHead({
        layers: { first: 0, end: 2 },
        next: proxy.address,
        slots: 2,
        ctx: CTX,
        snapshots: 0,
      });
      try {
        const { one, two } = await streamRates(head.url, flags.rounds, flags.tokens);
        const [m1, m2, b1, b2] = [median(one), median(two), Math.max(...one), Math.max(...two)];
        rows.push(
          `| ${delay} ms | ${m1.toFixed(1)} (best ${b1.toFixed(1)}) | ${m2.toFixed(1)} (best ` +
            `${b2.toFixed(1)}) | ${(m2 / m1).toFixed(2)} (best ${(b2 / b1).toFixed(2)}) |`,
        );
        console.error(rows.at(-1));
      } finally {
        await head.close();
        await proxy.stop();
      }
    }
  } finally {
    await worker.stop();
  }
  console.log(rows.join("\n"));
}

if (import.meta.main) await runCommand(SPLIT_LATENCY, run);
