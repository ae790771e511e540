// Tests for tools/synth/qwen_chat_template.ts: the prompts it renders (written out by hand) for plain
// chats, tools, tool calls and results, and thinking on/off; and how those prompts tokenize.

import assert from "node:assert/strict";
import { CHAT_TEMPLATE } from "./qwen_chat_template.ts";
import { type ChatInput, renderChat } from "../../lib/tokenizer/chat_template.ts";
import { tinyTokenizer } from "../../tests/_tiny_tokenizer.ts";

function render(input: ChatInput): string {
  return renderChat(CHAT_TEMPLATE, input);
}

const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
} as const;

const TOOLS_SYSTEM =
  "# Tools\n\nYou can call functions to help with the request. Their signatures " +
  "are listed as JSON inside <tools></tools>:\n<tools>\n" +
  '{"type": "function", "function": {"name": "get_weather", "description": ' +
  '"Current weather for a city", "parameters": {"type": "object", "properties": ' +
  '{"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n' +
  "To call a function, reply with a JSON object holding its name and arguments inside " +
  "<tool_call></tool_call> tags, one block per call:\n<tool_call>\n" +
  '{"name": <function-name>, "arguments": <arguments-as-json-object>}\n</tool_call><|im_end|>\n';

Deno.test("system, user and assistant turns in ChatML", () => {
  const prompt = render({
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello!" },
      { role: "user", content: [{ type: "text", text: "Two " }, { type: "text", text: "parts" }] },
    ],
    addGenerationPrompt: true,
  });
  assert.equal(
    prompt,
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
      "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nTwo parts<|im_end|>\n" +
      "<|im_start|>assistant\n",
  );
  // Without a generation prompt the text ends after the last turn; no system turn without one.
  assert.equal(
    render({ messages: [{ role: "user", content: "Hi" }] }),
    "<|im_start|>user\nHi<|im_end|>\n",
  );
});

Deno.test("tools are listed as JSON in the system turn, after the system message", () => {
  assert.equal(
    render({ messages: [{ role: "user", content: "Hi" }], tools: [WEATHER_TOOL] }),
    "<|im_start|>system\n" + TOOLS_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n",
  );
  assert.equal(
    render({
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
      tools: [WEATHER_TOOL],
    }),
    "<|im_start|>system\nBe brief.\n\n" + TOOLS_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n",
  );
});

Deno.test("tool calls follow the assistant content; consecutive results share a user turn", () => {
  const prompt = render({
    messages: [
      { role: "user", content: "Weather in Paris and Oslo?" },
      {
        role: "assistant",
        content: "Checking.",
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } },
          { type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } },
        ],
      },
      { role: "tool", tool_call_id: "1", content: "18°C, sunny" },
      { role: "tool", tool_call_id: "2", content: "4°C, snow" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ type: "function", function: { name: "x", arguments: {} } }],
      },
    ],
    tools: [WEATHER_TOOL],
    addGenerationPrompt: true,
  });
  assert.equal(
    prompt,
    "<|im_start|>system\n" + TOOLS_SYSTEM +
      "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n" +
      '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": ' +
      '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": ' +
      '{"city":"Oslo"}}\n</tool_call><|im_end|>\n' +
      "<|im_start|>user\n<tool_response>\n18°C, sunny\n</tool_response>\n<tool_response>\n" +
      "4°C, snow\n</tool_response><|im_end|>\n" +
      '<|im_start|>assistant\n<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>' +
      "<|im_end|>\n" +
      "<|im_start|>assistant\n",
  );
});

Deno.test("reasoning is rendered for the current turn only, from the field or inline tags", () => {
  const prompt = render({
    messages: [
      { role: "user", content: "a" },
      { role: "assistant", content: "A", reasoning_content: "old thoughts" },
      { role: "user", content: "b" },
      {
        role: "assistant",
        content: "",
        reasoning_content: "\nneed a tool\n",
        tool_calls: [
          { type: "function", function: { name: "f", arguments: {} } },
        ],
      },
      { role: "tool", content: "r" },
      { role: "assistant", content: "<think>\ninline\n</think>\n\nB" },
    ],
  });
  assert.equal(
    prompt,
    "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n" +
      "<|im_start|>user\nb<|im_end|>\n" +
      '<|im_start|>assistant\n<think>\nneed a tool\n</think>\n\n<tool_call>\n{"name": "f", ' +
      '"arguments": {}}\n</tool_call><|im_end|>\n' +
      "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n" +
      "<|im_start|>assistant\n<think>\ninline\n</think>\n\nB<|im_end|>\n",
  );
  // Inline reasoning of an earlier turn is removed along with its tags.
  assert.equal(
    render({
      messages: [
        { role: "user", content: "a" },
        { role: "assistant", content: "<think>x</think>A" },
        { role: "user", content: "b" },
      ],
    }),
    "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n" +
      "<|im_start|>user\nb<|im_end|>\n",
  );
});

Deno.test("enable_thinking false adds an empty think block to the generation prompt", () => {
  const messages = [{ role: "user", content: "Hi" }] as const;
  const open = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  assert.equal(render({ messages, addGenerationPrompt: true }), open);
  assert.equal(render({ messages, addGenerationPrompt: true, enableThinking: true }), open);
  assert.equal(
    render({ messages, addGenerationPrompt: true, enableThinking: false }),
    open + "<think>\n\n</think>\n\n",
  );
});

Deno.test("rendered prompts tokenize with the template's delimiters as special tokens", () => {
  const { vocab, tokenizer } = tinyTokenizer();
  const ids = tokenizer.encode(render({
    messages: [
      { role: "user", content: "Hi" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ type: "function", function: { name: "f", arguments: {} } }],
      },
    ],
    addGenerationPrompt: true,
    enableThinking: false,
  }));
  const s = vocab.specials;
  assert.deepEqual(ids.filter((id) => Object.values(s).includes(id)), [
    s["<|im_start|>"],
    s["<|im_end|>"],
    s["<|im_start|>"],
    s["<tool_call>"],
    s["</tool_call>"],
    s["<|im_end|>"],
    s["<|im_start|>"],
    s["<think>"],
    s["</think>"],
  ]);
});
