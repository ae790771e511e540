// The streaming pieces on real streams: stop strings held across deltas, the <think>/<tool_call>
// parser, Anthropic events and their SSE bytes, keep-alive pings.

import assert from "node:assert/strict";
import { type SequenceEvent, StopMatcher } from "../scheduler/sequence.ts";
import { AnthropicEventStream } from "./events.ts";
import {
  collectReply,
  OutputStream,
  type ReplyEvent,
  thinkingSignature,
  type ToolSpec,
} from "./output.ts";
import { parseSse } from "../../tests/_head.ts";
import { SseStream } from "./sse.ts";

Deno.test("StopMatcher holds back a possible stop string and never releases text after it", () => {
  const m = new StopMatcher(["World", "\n\n"]);
  const out = ["Hel", "lo W", "or", "ld and more"].map((t) => m.push(t));
  assert.deepEqual(out.map((o) => o.text), ["Hel", "lo ", "", ""]);
  assert.deepEqual(out.map((o) => o.stop), [null, null, null, "World"]);
  const n = new StopMatcher(["abc"]);
  assert.deepEqual(n.push("xab"), { text: "x", stop: null });
  assert.deepEqual(n.push("d"), { text: "abd", stop: null });
  assert.deepEqual(n.push("ab"), { text: "", stop: null });
  assert.equal(n.flush(), "ab");
  // The earliest occurrence wins, whatever the list order.
  const first = new StopMatcher(["bc", "abcd"]);
  assert.deepEqual(first.push("xabcd"), { text: "x", stop: "abcd" });
});

const tools: ToolSpec[] = [{
  name: "get_weather",
  inputSchema: {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
  },
  schemaPath: "tools.0.input_schema",
}];

const usage = { promptTokens: 5, cachedTokens: 2, cacheWriteTokens: 0, outputTokens: 9 };

/** Feeds text deltas (split where given) through the parser; returns the reply events. */
async function parse(
  deltas: string[],
  options: { thinking?: boolean; startInThinking?: boolean; tools?: ToolSpec[] } = {},
): Promise<ReplyEvent[]> {
  let n = 0;
  const events: SequenceEvent[] = [
    { type: "start", promptTokens: 5, cachedTokens: 2, cacheWriteTokens: 0 },
    ...deltas.map((text, i): SequenceEvent => ({ type: "token", id: i, text })),
    { type: "end", reason: "end_turn", stopSequence: null, usage },
  ];
  return await Array.fromAsync(
    ReadableStream.from(events).pipeThrough(
      new OutputStream({
        tools: options.tools ?? tools,
        thinking: options.thinking ?? false,
        startInThinking: options.startInThinking,
        newToolId: () => `toolu_${n++}`,
        tokenBytes: (id) => Uint8Array.of(id),
      }),
    ),
  );
}

Deno.test("a <tool_call> split across deltas becomes one tool_use block; stop reason tool_use", async () => {
  const events = await parse([
    "Let me check.\n",
    "<tool",
    '_call>\n{"name": "get_weather", "argu',
    'ments": {"city": "Paris"}}\n</tool_',
    "call>\n",
  ]);
  const reply = await collectReply(ReadableStream.from(events));
  assert.deepEqual(reply.blocks, [
    { type: "text", text: "Let me check." },
    { type: "tool_use", id: "toolu_0", name: "get_weather", input: { city: "Paris" } },
  ]);
  assert.equal(reply.stopReason, "tool_use");
  assert.deepEqual(reply.usage, usage);
  const json = events.filter((e) => e.type === "delta" && e.kind === "input_json");
  assert.deepEqual(json.map((e) => e.type === "delta" && e.text), ['{"city":"Paris"}']);
});

Deno.test("bare JSON in prose is text; calls that break the schema or name no tool stay text", async () => {
  const prose = '{"name": "get_weather", "arguments": {"city": "Paris"}}';
  const plain = await collectReply(ReadableStream.from(await parse([prose])));
  assert.deepEqual(plain.blocks, [{ type: "text", text: prose }]);
  assert.equal(plain.stopReason, "end_turn");
  for (
    const body of [
      '{"name": "get_weather", "arguments": {"town": "Paris"}}',
      '{"name": "launch", "arguments": {}}',
      "not json",
    ]
  ) {
    const text = `<tool_call>\n${body}\n</tool_call>`;
    const reply = await collectReply(ReadableStream.from(await parse([text])));
    assert.deepEqual(reply.blocks, [{ type: "text", text: `<tool_call>${body}</tool_call>` }]);
    assert.equal(reply.stopReason, "end_turn");
  }
  const noTools = await collectReply(
    ReadableStream.from(await parse([`<tool_call>\n${prose}\n</tool_call>`], { tools: [] })),
  );
  assert.deepEqual(noTools.blocks, [{ type: "text", text: `<tool_call>\n${prose}\n</tool_call>` }]);
});

Deno.test("<think> opening the reply becomes a signed thinking block; later it is text", async () => {
  const reply = await collectReply(
    ReadableStream.from(
      await parse(["<th", "ink>\nPonder", " this\n</thi", "nk>\n\nAnswer."], {
        thinking: true,
      }),
    ),
  );
  assert.deepEqual(reply.blocks, [
    { type: "thinking", thinking: "Ponder this", signature: thinkingSignature("Ponder this") },
    { type: "text", text: "Answer." },
  ]);
  const opened = await collectReply(
    ReadableStream.from(await parse(["Deep thought</think>Done"], { startInThinking: true })),
  );
  assert.deepEqual(opened.blocks.map((b) => b.type), ["thinking", "text"]);
  const off = await collectReply(ReadableStream.from(await parse(["<think>x</think>y"])));
  assert.deepEqual(off.blocks, [{ type: "text", text: "<think>x</think>y" }]);
  const late = await collectReply(
    ReadableStream.from(await parse(["Hi <think>x</think>"], { thinking: true })),
  );
  assert.deepEqual(late.blocks, [{ type: "text", text: "Hi <think>x</think>" }]);
});

Deno.test("Anthropic events come out in order as named SSE frames", async () => {
  const replies = await parse([
    "<think>hm</think>Sure",
    ' <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
  ], { thinking: true });
  const bytes = await Array.fromAsync(
    ReadableStream.from(replies)
      .pipeThrough(new AnthropicEventStream({ id: "msg_1", model: "m", requestId: "req_1" }))
      .pipeThrough(new SseStream()),
  );
  const text = new TextDecoder().decode(
    bytes.reduce((a, b) => new Uint8Array([...a, ...b]), new Uint8Array()),
  );
  assert.ok(text.startsWith('event: message_start\ndata: {"type":"message_start","message":{'));
  const frames = parseSse(text);
  assert.deepEqual(frames.map((f) => f.event), [
    "message_start",
    "ping",
    "content_block_start",
    "content_block_delta",
    "content_block_delta",
    "content_block_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
  ]);
  const data = frames.map((f) => JSON.parse(f.data));
  assert.deepEqual(data[0].message.usage, {
    input_tokens: 3,
    output_tokens: 0,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 2,
  });
  assert.deepEqual(data[2].content_block, { type: "thinking", thinking: "", signature: "" });
  assert.equal(data[4].delta.type, "signature_delta");
  assert.deepEqual(data[9].content_block, {
    type: "tool_use",
    id: "toolu_0",
    name: "get_weather",
    input: {},
  });
  assert.deepEqual(data[10].delta, { type: "input_json_delta", partial_json: '{"city":"Oslo"}' });
  assert.deepEqual(data[12].delta, { stop_reason: "tool_use", stop_sequence: null });
  assert.equal(data[12].usage.output_tokens, 9);
});

Deno.test("an error after the start is an `event: error` frame with the error body", async () => {
  const events: SequenceEvent[] = [
    { type: "start", promptTokens: 4, cachedTokens: 0, cacheWriteTokens: 0 },
    { type: "token", id: 1, text: "Par" },
    { type: "error", error: new Error("boom") },
  ];
  const frames = parseSse(
    new TextDecoder().decode(
      (await Array.fromAsync(
        ReadableStream.from(events)
          .pipeThrough(
            new OutputStream({
              tools: [],
              thinking: false,
              newToolId: () => "x",
              tokenBytes: (id) => Uint8Array.of(id),
            }),
          )
          .pipeThrough(new AnthropicEventStream({ id: "msg_2", model: "m", requestId: "req_9" }))
          .pipeThrough(new SseStream()),
      )).reduce((a, b) => new Uint8Array([...a, ...b]), new Uint8Array()),
    ),
  );
  assert.deepEqual(frames.slice(-3).map((f) => f.event), [
    "content_block_delta",
    "content_block_stop",
    "error",
  ]);
  assert.deepEqual(JSON.parse(frames.at(-1)!.data), {
    type: "error",
    error: { type: "api_error", message: "Internal error: boom" },
    request_id: "req_9",
  });
});

Deno.test("token log-probabilities come as logprobs events before the text they carry", async () => {
  const probs = {
    logprob: -0.5,
    top: [{ id: 7, logprob: -0.5, logit: 3 }, { id: 9, logprob: -1.25, logit: 2.25 }],
  };
  const events: SequenceEvent[] = [
    { type: "start", promptTokens: 4, cachedTokens: 0, cacheWriteTokens: 0 },
    { type: "token", id: 7, text: "Hi", probs },
    { type: "end", reason: "end_turn", stopSequence: null, usage },
  ];
  const out = await Array.fromAsync(
    ReadableStream.from(events).pipeThrough(
      new OutputStream({
        tools: [],
        thinking: false,
        newToolId: () => "x",
        tokenBytes: (id) => Uint8Array.of(id, id),
      }),
    ),
  );
  assert.deepEqual(out.map((e) => e.type), [
    "start",
    "logprobs",
    "block_start",
    "delta",
    "block_stop",
    "end",
  ]);
  assert.deepEqual(out[1], {
    type: "logprobs",
    tokens: [{
      bytes: Uint8Array.of(7, 7),
      logprob: -0.5,
      top: [{ bytes: Uint8Array.of(7, 7), logprob: -0.5 }, {
        bytes: Uint8Array.of(9, 9),
        logprob: -1.25,
      }],
    }],
  });
});

Deno.test("a failure inside the output parser ends the reply with an error event", async () => {
  let cancelled = false;
  const source = new ReadableStream<SequenceEvent>({
    start(controller) {
      controller.enqueue({ type: "start", promptTokens: 4, cachedTokens: 0, cacheWriteTokens: 0 });
      controller.enqueue({ type: "token", id: 1, text: "a", probs: { logprob: 0, top: [] } });
      controller.enqueue({ type: "token", id: 2, text: "b" });
    },
    cancel: () => {
      cancelled = true;
    },
  });
  const out = await Array.fromAsync(
    source.pipeThrough(
      new OutputStream({
        tools: [],
        thinking: false,
        newToolId: () => "x",
        tokenBytes: () => {
          throw new RangeError("no such token");
        },
      }),
    ),
  );
  assert.deepEqual(out.map((e) => e.type), ["start", "error"]);
  assert.match(out[1].type === "error" ? out[1].error.message : "", /no such token/);
  assert.ok(cancelled, "the generation behind it is cancelled");
});

Deno.test("SseStream sends keep-alive frames only while the stream is silent", async () => {
  const source = new ReadableStream<{ data: string }>({
    async start(controller) {
      controller.enqueue({ data: "a" });
      await new Promise((r) => setTimeout(r, 300));
      controller.enqueue({ data: "b" });
      controller.close();
    },
  });
  const chunks = await Array.fromAsync(
    source.pipeThrough(new SseStream({ keepAlive: { everyMs: 40, message: { comment: "ping" } } }))
      .pipeThrough(new TextDecoderStream()),
  );
  const text = chunks.join("");
  assert.ok(text.startsWith("data: a\n\n: ping\n\n"), text);
  assert.ok(text.endsWith("data: b\n\n"));
  const pings = text.split(": ping").length - 1;
  // About six in 300 ms of silence at one per 40 ms; a stalled test machine may fire fewer.
  assert.ok(pings >= 1 && pings <= 8, text);
  assert.deepEqual(parseSse(text), [{ event: null, data: "a" }, { event: null, data: "b" }]);
});
