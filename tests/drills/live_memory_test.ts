// LiveMemory against a process whose worker holds or drops 8 MiB on request: what it holds is
// counted, in a worker too, and garbage is not.

import assert from "node:assert/strict";
import { INSPECTOR, LiveMemory } from "./live_memory.ts";
import { freePort } from "../_workers.ts";

const MAIN = `
const worker = new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });
const replies = new TransformStream<string, string>();
const writer = replies.writable.getWriter();
worker.onmessage = (e) => writer.write(e.data);
const reader = replies.readable.getReader();
worker.postMessage("ping");
await reader.read();
console.error("ready");
for await (const line of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
  for (const order of line.split("\\n").filter(Boolean)) {
    worker.postMessage(order);
    console.error((await reader.read()).value);
  }
}
worker.terminate();
`;

const WORKER = `
const kept: Uint8Array[] = [];
self.onmessage = (e: MessageEvent<string>) => {
  const bytes = new Uint8Array(8 << 20).fill(1);
  if (e.data === "keep") kept.push(bytes);
  self.postMessage(e.data + " done");
};
`;

Deno.test("LiveMemory counts what a worker holds after a collection, not its garbage", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/main.ts`, MAIN);
  await Deno.writeTextFile(`${dir}/worker.ts`, WORKER);
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read", `--inspect=127.0.0.1:${freePort()}`, `${dir}/main.ts`],
    stdin: "piped",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const lines = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  const waitFor = async (text: string) => {
    while (!log.includes(text)) {
      const { value, done } = await lines.read();
      if (done) throw new Error(`The process ended before printing ${text}:\n${log}`);
      log += value;
    }
  };
  const stdin = child.stdin.getWriter();
  const order = async (what: string) => {
    await stdin.write(new TextEncoder().encode(`${what}\n`));
    await waitFor(`${what} done`);
  };
  let memory: LiveMemory | undefined;
  try {
    await waitFor("ready");
    memory = await LiveMemory.connect(INSPECTOR.exec(log)![1]);
    for (let i = 0; memory.isolates < 2; i++) {
      if (i === 100) throw new Error("The inspector never attached to the worker");
      await new Promise((r) => setTimeout(r, 50));
    }
    const start = await memory.bytes();
    await order("drop");
    const dropped = await memory.bytes();
    await order("keep");
    const kept = await memory.bytes();
    assert.ok(Math.abs(dropped - start) < 1 << 20, `garbage counted: ${start} -> ${dropped}`);
    assert.ok(kept - dropped >= 8 << 20, `held bytes missed: ${dropped} -> ${kept}`);
    assert.ok(kept - dropped < 9 << 20, `more than the held bytes: ${dropped} -> ${kept}`);
  } finally {
    memory?.close();
    await stdin.close();
    await child.status;
    await lines.cancel();
    await Deno.remove(dir, { recursive: true });
  }
});
