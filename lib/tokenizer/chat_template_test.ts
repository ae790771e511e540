// Tests for lib/tokenizer/chat_template.ts: the variables a template sees and the errors it raises.
// The project's own template is tested in tools/synth/qwen_chat_template_test.ts.

import assert from "node:assert/strict";
import { renderChat } from "./chat_template.ts";

const VARIABLES = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|" +
  "{{ enable_thinking is defined }}|{{ tools is defined }}|{{ messages | length }}";

Deno.test("renderChat passes the HF / llama.cpp template variables", () => {
  const messages = [{ role: "user", content: "hi" }] as const;
  assert.equal(renderChat(VARIABLES, { messages }), "||false|false|false|1");
  assert.equal(
    renderChat(VARIABLES, {
      messages,
      tools: [{ type: "function", function: { name: "f" } }],
      addGenerationPrompt: true,
      enableThinking: false,
      bosToken: "<s>",
      eosToken: "</s>",
    }),
    "<s>|</s>|true|true|true|1",
  );
});

Deno.test("renderChat exposes message fields and content parts", () => {
  const template =
    "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}" +
    "{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}" +
    "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %};" +
    "{% endfor %}";
  const out = renderChat(template, {
    messages: [
      { role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ type: "function", function: { name: "f", arguments: { x: [1, "é"] } } }],
      },
    ],
  });
  assert.equal(out, 'user:[a][b];assistant:{"x": [1, "é"]};');
});

Deno.test("renderChat reuses a parsed template and switches when it changes", () => {
  const messages = [{ role: "user", content: "x" }] as const;
  assert.equal(renderChat("A{{ messages[0].content }}", { messages }), "Ax");
  assert.equal(renderChat("A{{ messages[0].content }}", { messages }), "Ax");
  assert.equal(renderChat("B{{ messages[0].content }}", { messages }), "Bx");
});

Deno.test("renderChat reports templates it cannot parse or render", () => {
  const messages = [{ role: "user", content: "x" }] as const;
  assert.throws(
    () => renderChat("{% if %}", { messages }),
    /^ChatTemplateError: Cannot parse the chat template: /,
  );
  assert.throws(
    () => renderChat("{{ messages[0].content.nosuchmethod() }}", { messages }),
    /^ChatTemplateError: Cannot render the chat template: /,
  );
});
