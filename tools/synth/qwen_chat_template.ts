// The Jinja chat template written into generated test models (tokenizer.chat_template).
// Rendered by lib/tokenizer/chat_template.ts here and by llama.cpp's minja for reference fixtures.

/**
 * ChatML in the style of Qwen3's template, using only common Jinja (macros, namespace, tojson,
 * string methods) so that @huggingface/jinja and minja agree:
 * - a system turn holds the system message and, with tools, a `# Tools` section listing each
 *   tool as JSON inside <tools></tools> and asking for calls as
 *   <tool_call>{"name": …, "arguments": …}</tool_call>;
 * - turns are `<|im_start|>role\n…<|im_end|>\n`; assistant tool calls follow the content as
 *   <tool_call> blocks; consecutive tool results share one user turn, each in <tool_response>;
 * - an assistant's `reasoning_content` (or a `<think>…</think>` prefix of its content) is rendered
 *   as `<think>\n…\n</think>\n\n` for turns after the last user message and dropped before it;
 * - `add_generation_prompt` opens an assistant turn, with an empty think block when
 *   `enable_thinking` is false.
 */
export const CHAT_TEMPLATE: string = String.raw`{%- macro text_of(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content %}
        {%- for part in content %}
            {%- if part.type == 'text' %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if has_system %}
        {{- text_of(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou can call functions to help with the request. ' }}
    {{- 'Their signatures are listed as JSON inside <tools></tools>:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nTo call a function, reply with a JSON object holding its name and ' }}
    {{- 'arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <arguments-as-json-object>}\n</tool_call>' }}
    {{- '<|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' + text_of(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user = -1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = text_of(message.content) %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > ns.last_user and reasoning.strip('\n') %}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- content }}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if content or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": ' + (call.function.name | tojson) + ', "arguments": ' }}
                {%- if call.function.arguments is string %}
                    {{- call.function.arguments }}
                {%- else %}
                    {{- call.function.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}`;
