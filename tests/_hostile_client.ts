// A Worker that sends hostile request bodies to a head and reports each answer; used by
// tests/http_event_loop_test.ts so that building and sending 30 MB bodies stays off the thread
// whose event loop (the in-process head's) is being timed.

/** One hostile request: where it goes and which body to build. */
export interface HostileCase {
  readonly path: string;
  readonly body: "chat" | "openai" | "count" | "completion" | "deep" | "values";
}

export interface HostileAnswer {
  readonly status: number;
  readonly text: string;
}

const MiB = 1 << 20;

function build(kind: HostileCase["body"]): string {
  const huge = () => "lorem ipsum dolor sit amet ".repeat(30 * MiB / 27);
  switch (kind) {
    case "chat":
      return JSON.stringify({
        model: "m",
        max_tokens: 4,
        messages: [{ role: "user", content: huge() }],
      });
    case "openai":
      return JSON.stringify({ model: "m", messages: [{ role: "user", content: huge() }] });
    case "count":
      return JSON.stringify({ model: "m", messages: [{ role: "user", content: huge() }] });
    case "completion":
      return JSON.stringify({ prompt: huge(), n_predict: 4 });
    case "deep":
      return "[".repeat(15 * MiB) + "]".repeat(15 * MiB);
    case "values":
      return `{"prompt":[${"1,".repeat(4_000_000)}1]}`;
  }
}

const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<{ url: string; cases: HostileCase[] }>) => void) | null;
  postMessage(message: HostileAnswer[]): void;
};

scope.onmessage = async (event) => {
  const { url, cases } = event.data;
  const bodies = cases.map((c) => new TextEncoder().encode(build(c.body)));
  const answers = await Promise.all(cases.map(async (c, i) => {
    const res = await fetch(`${url}${c.path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: bodies[i],
    });
    return { status: res.status, text: await res.text() };
  }));
  scope.postMessage(answers);
};
