"""The chat templates rowgrove ships for its tiny model: ChatML (Qwen2.5-style), Qwen3-style and
Llama-3-style, as Jinja that `transformers`' `apply_chat_template` runs unchanged.

Why three: the gateway's continuation logic must work for a template that is prefix-stable
(ChatML, Llama-3: rendering a conversation is a string prefix of rendering its extension at every
assistant-turn boundary) and for one that rewrites history (Qwen3 drops the `<think>` reasoning of
assistant turns before the last user query), so tests run on all three.

One assistant-message body for every template (what the model samples after the generation
prompt, before its end-of-turn token), so `rowgrove.toolcalls` parses all three the same way:

    [<think>\\n{reasoning}\\n</think>\\n\\n]{content}[\\n if content]<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>[\\n<tool_call>…]

Tool calls are hermes-style `<tool_call>` blocks in every template (Llama-3 included; real Llama
3.1 uses bare JSON, rowgrove keeps one format so one parser serves all). `arguments` given as a
JSON string (OpenAI wire format) is written as is; given as a mapping it is written with
`tojson` (json.dumps, ensure_ascii=False), which is what `toolcalls.format_tool_call` produces.
Message content may be a string, null, or a list of `{"type": "text", "text": ...}` parts. An
unknown role raises (`raise_exception`), it never renders silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateSpec:
    """A chat template and the tokens the engine needs from it.

    `end_of_turn` is the token the model samples to end its turn; `bos` is the text the template
    writes first (None when it writes none).
    """

    name: str
    jinja: str
    end_of_turn: str
    bos: str | None


# Macros shared by all three templates: content flattening and the assistant body.
_MACROS = r"""
{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}{{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}{{- part.text -}}
            {%- else -%}{{- raise_exception('unsupported content part type ' ~ part.type ~ ': only text parts can be rendered') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_tool_calls(tool_calls, content) -%}
    {%- for tool_call in tool_calls -%}
        {%- if tool_call.function is defined -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
        {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {{- '<tool_call>\n{"name": ' + (tool_call.name | tojson) + ', "arguments": ' -}}
        {%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}
        {%- else -%}{{- tool_call.arguments | tojson -}}
        {%- endif -%}
        {{- '}\n</tool_call>' -}}
    {%- endfor -%}
{%- endmacro -%}
{%- macro render_tools_block(tools) -%}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" -}}
{%- endmacro -%}
"""

# ChatML, Qwen2.5-style: default system prompt, tools in the system block, consecutive tool
# messages grouped into one user turn of <tool_response> blocks. Reasoning is always kept.
_CHATML = _MACROS + r"""
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = render_content(messages[0].content) -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system_text = 'You are a helpful assistant.' -%}
    {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\n' + system_text -}}
{%- if tools -%}{{- '\n\n' + render_tools_block(tools) -}}{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in rest -%}
    {%- if message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if message.reasoning_content -%}
            {{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- if message.tool_calls -%}{{- render_tool_calls(message.tool_calls, content) -}}{%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role ' ~ (message.role | tojson) ~ ': use system, user, assistant or tool') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# Qwen3-style: no default system prompt; reasoning (`reasoning_content`, or a `<think>` block at
# the start of content) is kept only on assistant turns after the last real user query, as the
# real Qwen3 template does; `enable_thinking=false` makes the generation prompt close an empty
# think block.
_QWEN3 = _MACROS + r"""
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = render_content(messages[0].content) -%}
    {%- set rest = messages[1:] -%}
    {%- set has_system = true -%}
{%- else -%}
    {%- set system_text = '' -%}
    {%- set rest = messages -%}
    {%- set has_system = false -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}{{- system_text + '\n\n' -}}{%- endif -%}
    {{- render_tools_block(tools) + '<|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query_index=rest | length) -%}
{%- for message in rest[::-1] -%}
    {%- set index = (rest | length) - 1 - loop.index0 -%}
    {%- if ns.last_query_index == (rest | length) and message.role == 'user' -%}
        {%- set text = render_content(message.content) -%}
        {%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
            {%- set ns.last_query_index = index -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if ns.last_query_index == (rest | length) -%}{%- set ns.last_query_index = -1 -%}{%- endif -%}
{%- for message in rest -%}
    {%- if message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > ns.last_query_index and reasoning -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- if message.tool_calls -%}{{- render_tool_calls(message.tool_calls, content) -}}{%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role ' ~ (message.role | tojson) ~ ': use system, user, assistant or tool') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""

# Llama-3-style: every message is its own header-delimited turn (so the template is prefix-stable
# even between consecutive tool results); tool results use role `ipython` (role `tool` accepted
# and rendered as `ipython`, as Llama 3.1 does); tools go into the system turn.
_LLAMA3 = _MACROS + r"""
{{- '<|begin_of_text|>' -}}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = render_content(messages[0].content) -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system_text = '' -%}
    {%- set rest = messages -%}
{%- endif -%}
{%- if system_text or tools -%}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' + system_text -}}
    {%- if tools -%}
        {%- if system_text -%}{{- '\n\n' -}}{%- endif -%}
        {{- render_tools_block(tools) -}}
    {%- endif -%}
    {{- '<|eot_id|>' -}}
{%- endif -%}
{%- for message in rest -%}
    {%- if message.role == 'user' or message.role == 'system' -%}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + render_content(message.content) + '<|eot_id|>' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- if message.reasoning_content -%}
            {{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- if message.tool_calls -%}{{- render_tool_calls(message.tool_calls, content) -}}{%- endif -%}
        {{- '<|eot_id|>' -}}
    {%- elif message.role == 'tool' or message.role == 'ipython' -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + render_content(message.content) + '<|eot_id|>' -}}
    {%- else -%}
        {{- raise_exception('unknown role ' ~ (message.role | tojson) ~ ': use system, user, assistant, tool or ipython') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""


# Qwen2-VL-style: ChatML as above, with each image part written as Qwen2-VL's chat template writes
# it, `<|vision_start|><|image_pad|><|vision_end|>` (one `<|image_pad|>`, which the processor then
# expands to one pad per merged patch of that image), and text parts written as they are.
_IMAGE_PART = (
    "{%- elif part.type == 'image' or part.type == 'image_url' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}\n"
)
_MACROS_VL = _MACROS.replace(
    "{%- if part.type == 'text' -%}{{- part.text -}}\n",
    "{%- if part.type == 'text' -%}{{- part.text -}}\n" + _IMAGE_PART,
).replace("only text parts can be rendered", "only text and image parts can be rendered")
_CHATML_VL = _MACROS_VL + _CHATML[len(_MACROS):]


def _compact(jinja: str) -> str:
    """The template text as saved: leading/trailing blank lines removed (whitespace inside is
    controlled by the `-` markers, so indentation never reaches the rendering)."""
    return jinja.strip() + "\n"


TEMPLATES: dict[str, TemplateSpec] = {
    "chatml": TemplateSpec("chatml", _compact(_CHATML), end_of_turn="<|im_end|>", bos=None),
    "qwen3": TemplateSpec("qwen3", _compact(_QWEN3), end_of_turn="<|im_end|>", bos=None),
    "llama3": TemplateSpec("llama3", _compact(_LLAMA3), end_of_turn="<|eot_id|>", bos="<|begin_of_text|>"),
    "qwen2-vl": TemplateSpec("qwen2-vl", _compact(_CHATML_VL), end_of_turn="<|im_end|>", bos=None),
}


def get_template(name: str) -> TemplateSpec:
    """The template called `name`; InputError naming the known ones otherwise."""
    from rowgrove.errors import InputError

    try:
        return TEMPLATES[name]
    except KeyError:
        raise InputError(f"unknown chat template {name!r}: use one of {', '.join(TEMPLATES)}") from None
