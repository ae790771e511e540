// The live JavaScript memory of a Deno process started with --inspect, read through its inspector:
// each isolate (the main thread and every Web Worker) is fully collected, then measured.
//
// Resident size alone cannot tell a leak from V8 growing its heap in steps; after a full
// collection what is left is what the program holds, so growth there is a leak.

/** The inspector's address, as `deno --inspect` prints it on stderr. */
export const INSPECTOR = /Debugger listening on (ws:\/\/\S+)/;

interface Reply {
  readonly id?: number;
  readonly method?: string;
  readonly params?: {
    readonly sessionId?: string;
    readonly message?: string;
  };
  readonly result?: { readonly result?: { readonly value?: unknown } };
  readonly error?: { readonly message?: string };
}

/** A connection to one process's inspector, attached to its Web Workers as they start. */
export class LiveMemory {
  readonly #socket: WebSocket;
  readonly #workers = new Set<string>();
  readonly #pending = new Map<string, PromiseWithResolvers<Reply>>();
  #next = 0;

  private constructor(socket: WebSocket) {
    this.#socket = socket;
    socket.onmessage = (e) => this.#receive(JSON.parse(String(e.data)) as Reply, "");
    socket.onclose = () => {
      for (const p of this.#pending.values()) p.reject(new Error("The inspector closed"));
      this.#pending.clear();
    };
  }

  /** Connects to `url` (INSPECTOR's capture) and asks to be attached to every worker. */
  static async connect(url: string): Promise<LiveMemory> {
    const socket = new WebSocket(url);
    const opened = Promise.withResolvers<void>();
    socket.onopen = () => opened.resolve();
    socket.onerror = () => opened.reject(new Error(`Cannot connect to the inspector at ${url}`));
    await opened.promise;
    const memory = new LiveMemory(socket);
    await memory.#call("", "NodeWorker.enable", { waitForDebuggerOnStart: false });
    return memory;
  }

  /** Isolates measured: the main thread and the workers attached so far. */
  get isolates(): number {
    return 1 + this.#workers.size;
  }

  /**
   * Bytes the process's isolates hold after a full collection of each: V8's used heap plus the
   * external memory (array buffers) its objects keep alive.
   */
  async bytes(): Promise<number> {
    let total = 0;
    for (const session of ["", ...this.#workers]) {
      await this.#call(session, "HeapProfiler.collectGarbage", {});
      const reply = await this.#call(session, "Runtime.evaluate", {
        expression: "JSON.stringify(Deno.memoryUsage())",
        returnByValue: true,
      });
      const usage = JSON.parse(String(reply.result?.result?.value)) as {
        heapUsed: number;
        external: number;
      };
      total += usage.heapUsed + usage.external;
    }
    return total;
  }

  close(): void {
    this.#socket.close();
  }

  #receive(reply: Reply, session: string): void {
    if (reply.method === "NodeWorker.attachedToWorker") {
      this.#workers.add(reply.params!.sessionId!);
    } else if (reply.method === "NodeWorker.detachedFromWorker") {
      this.#workers.delete(reply.params!.sessionId!);
    } else if (reply.method === "NodeWorker.receivedMessageFromWorker") {
      this.#receive(JSON.parse(reply.params!.message!) as Reply, reply.params!.sessionId!);
    } else if (reply.id !== undefined) {
      const key = `${session}:${reply.id}`;
      const pending = this.#pending.get(key);
      this.#pending.delete(key);
      if (reply.error) pending?.reject(new Error(`Inspector: ${reply.error.message}`));
      else pending?.resolve(reply);
    }
  }

  /**
   * Sends `method` to the main isolate (session "") or, wrapped, to a worker's session; its
   * reply. A wrapper the inspector refuses (the worker has gone) fails the call.
   */
  #call(session: string, method: string, params: unknown): Promise<Reply> {
    const id = ++this.#next;
    const pending = Promise.withResolvers<Reply>();
    this.#pending.set(`${session}:${id}`, pending);
    const message = JSON.stringify({ id, method, params });
    if (session === "") {
      this.#socket.send(message);
      return pending.promise;
    }
    const wrapperId = ++this.#next;
    const wrapper = Promise.withResolvers<Reply>();
    this.#pending.set(`:${wrapperId}`, wrapper);
    wrapper.promise.catch((e) => pending.reject(e));
    this.#socket.send(JSON.stringify({
      id: wrapperId,
      method: "NodeWorker.sendMessageToWorker",
      params: { sessionId: session, message },
    }));
    return pending.promise;
  }
}
