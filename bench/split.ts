// A worker process (worker.ts) serving the last layers on loopback TCP, started for the split bench.
// bench/decode.ts puts it after an in-process stage of layers 0:k via lib/wire/remote_stage.ts.

export interface WorkerOptions {
  readonly model: string;
  readonly first: number;
  readonly end: number;
  readonly backend: string;
  readonly gpu: string;
  readonly slots: number;
  readonly ctx: number;
  /** How long the worker may take to open its layers and listen. */
  readonly startTimeoutS: number;
  /** Receives each line the worker logs. */
  readonly log: (line: string) => void;
}

export interface RunningWorker {
  /** host:port it listens on. */
  readonly address: string;
  /** Seconds from spawn until it listened (opening its layers is most of it). */
  readonly startSeconds: number;
  /** Stops it (SIGTERM, then SIGKILL after 10 s) and waits for it to exit. */
  stop(): Promise<void>;
}

const WORKER = new URL("../worker.ts", import.meta.url);

/** A port the OS calls free now; the worker binds it a moment later. */
function freePort(): number {
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = probe.addr as Deno.NetAddr;
  probe.close();
  return port;
}

/** Lines of a byte stream, passed to `onLine` as they arrive. */
async function readLines(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void) {
  let rest = "";
  for await (const text of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + text).split("\n");
    rest = lines.pop()!;
    for (const line of lines) onLine(line);
  }
  if (rest) onLine(rest);
}

/** Spawns worker.ts and resolves once it logs that it is listening. */
export async function startWorker(options: WorkerOptions): Promise<RunningWorker> {
  const port = freePort();
  const args = [
    "run",
    "-A",
    WORKER.pathname,
    "--model",
    options.model,
    "--layers",
    `${options.first}:${options.end}`,
    "--port",
    String(port),
    "--slots",
    String(options.slots),
    "--ctx",
    String(options.ctx),
    "--backend",
    options.backend,
    "--gpu",
    options.gpu,
  ];
  const child = new Deno.Command(Deno.execPath(), { args, stdout: "null", stderr: "piped" })
    .spawn();
  const started = performance.now();
  const tail: string[] = [];
  let listening: () => void = () => {};
  const ready = new Promise<void>((resolve) => listening = resolve);
  const lines = readLines(child.stderr, (line) => {
    options.log(line);
    tail.push(line);
    if (tail.length > 20) tail.shift();
    if (/ listening on /.test(line)) listening();
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    ready.then(() => "ready" as const),
    child.status.then((s) => `exited with code ${s.code}` as const),
    new Promise<string>((resolve) => {
      timer = setTimeout(
        () => resolve(`did not listen within ${options.startTimeoutS} s`),
        options.startTimeoutS * 1000,
      );
    }),
  ]);
  clearTimeout(timer);
  const startSeconds = (performance.now() - started) / 1000;
  async function stop(): Promise<void> {
    try {
      child.kill("SIGTERM");
    } catch {
      // Already exited: its status below resolves at once.
    }
    const killer = setTimeout(() => {
      try {
        child.kill("SIGKILL");
      } catch {
        // Exited between the two signals.
      }
    }, 10_000);
    await child.status;
    clearTimeout(killer);
    await lines;
  }
  if (outcome !== "ready") {
    await stop();
    throw new Error(
      `Cannot start the worker for layers ${options.first}:${options.end}: it ${outcome}; ` +
        `its last lines:\n${tail.join("\n")}`,
    );
  }
  return { address: `127.0.0.1:${port}`, startSeconds, stop };
}
