"""Which roles' content parts reach a chat template as a list, decided per role from the
template's syntax tree (`preprocess.detect_part_roles`), and the key order of the tool calls a
template writes (vLLM's).

Ministral 3 and the first Kimi K2 template read content parts by their `type` for some roles
only: their tool branch writes `message['content']` whole, so a tool result sent as text parts,
handed over as a list, rendered as `[{'type': 'text', 'text': 'sunny, 21C'}]`. Here a tool result
sent as parts renders as the same string as the one sent as a string, through the gateway's
renderer (both render paths), while the roles whose parts those templates read (user images and
text) still get the list.

The two templates below are excerpts (the message loop's branches; tool declarations and default
system prompts left out) of public chat templates, quoted for their branch structure:
- KIMI_K2: moonshotai/Kimi-K2-Instruct, the chat template of its first tokenizer_config.json (the
  same text is carried by llama.cpp's Kimi K2 chat regression test);
- MINISTRAL_3: mistralai/Ministral-3-14B-Instruct-2512, chat_template.jinja.
"""

from __future__ import annotations

import copy
import json

import pytest

from rowgrove.gateway.core.preprocess import (
    OPENAI,
    STRING,
    detect_content_format,
    detect_part_roles,
    engine_message,
    engine_messages,
)

KIMI_K2 = """{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
  {%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
    {%- if message['content'] -%}{{ message['content'] }}{%- endif -%}
    <|tool_calls_section_begin|>
    {%- for tool_call in message['tool_calls'] -%}
      <|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>{{ tool_call['function']['arguments'] | tojson }}<|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- elif message['role'] == 'tool' -%}
    ## Return of {{ message.tool_call_id }}
    {{ message['content'] }}
  {%- elif message['content'] is string -%}
    {{ message['content'] }}
  {%- elif message['content'] is not none -%}
    {% for content in message['content'] -%}
      {% if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}
        <|media_start|>image<|media_content|><|media_pad|><|media_end|>
      {% else -%}
        {{ content['text'] }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"""

MINISTRAL_3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {{- '[SYSTEM_PROMPT]' -}}
    {%- if messages[0]['content'] is string %}
        {{- messages[0]['content'] -}}
    {%- else %}
        {%- for block in messages[0]['content'] %}
            {%- if block['type'] == 'text' %}{{- block['text'] }}{%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '[/SYSTEM_PROMPT]' -}}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}
            {%- if message['content'] | length == 2 %}
                {%- set blocks = message['content'] | sort(attribute='type') %}
            {%- else %}
                {%- set blocks = message['content'] %}
            {%- endif %}
            {%- for block in blocks %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- endif %}
            {%- endfor %}
            {{- '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] }}
        {%- elif message['content'] | length > 0 %}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}{{- block['text'] }}{%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- for tool in message['tool_calls'] or [] %}
            {{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + tool['function']['arguments']|tojson }}
        {%- endfor %}
        {{- eos_token }}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]' + message['content']|string + '[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""

TEMPLATES = {"kimi-k2": KIMI_K2, "ministral-3": MINISTRAL_3}
# the roles whose parts each template reads by type: Kimi K2's parts loop is the `else` of its tool
# branch; Ministral 3 reads the system message's parts (messages[0]), the user's and the assistant's
PART_ROLES = {"kimi-k2": {"system", "developer", "user", "assistant"},
              "ministral-3": {"system", "user", "assistant"}}
# whether the gateway's fast path (MiniJinja) renders the template: both paths are checked
FAST = {"kimi-k2": True, "ministral-3": False}

RESULT = "sunny, 21C"
CALL_ID = "call00000"


def _tool_turn(parts: bool, system: bool = False) -> list[dict]:
    msgs = [{"role": "system", "content": "be brief"}] if system else []
    return msgs + [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": CALL_ID, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather",
         "content": [{"type": "text", "text": RESULT}] if parts else RESULT}]


@pytest.fixture(scope="module")
def base_tokenizer():
    from rowgrove.model.load import load_tokenizer
    from rowgrove.model.tiny import tiny_model_dir

    return load_tokenizer(str(tiny_model_dir("chatml")))


def _renderer(base_tokenizer, name: str):
    """The gateway's renderer over a tokenizer of its own whose chat template is `name`'s."""
    from rowgrove.gateway.core.render import Renderer

    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = TEMPLATES[name]
    return Renderer(tok)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_roles_whose_parts_the_template_reads_are_found(name):
    assert detect_part_roles(TEMPLATES[name]) == PART_ROLES[name]
    assert detect_content_format(TEMPLATES[name]) == OPENAI


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_tool_result_sent_as_parts_renders_as_the_same_string(name, base_tokenizer):
    renderer = _renderer(base_tokenizer, name)
    assert (renderer.fast is not None) == FAST[name], renderer.fast_declined
    for system in (False, True):
        as_parts = renderer.render_text(_tool_turn(True, system))
        as_string = renderer.render_text(_tool_turn(False, system))
        assert as_parts == as_string
        assert RESULT in as_parts and "'type'" not in as_parts
    # the window render of the continuation after the tool call writes the same text as well
    if FAST[name]:
        prepared = renderer.prepare(_tool_turn(True))
        part = renderer.fast_window(prepared, None, None, 2, 0)
        assert part is not None and "".join(part.items).count(RESULT) == 1 and "'type'" not in "".join(part.items)
    # the finding: one format for the whole template (vLLM's "openai" without its tool-role
    # flattening) hands the tool branch the list, which it prints as a Python repr
    whole = renderer.tokenizer.apply_chat_template(engine_messages(_tool_turn(True), OPENAI), tokenize=False,
                                                    add_generation_prompt=True)
    assert "[{'type': 'text', 'text': 'sunny, 21C'}]" in whole


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_roles_that_read_parts_still_get_the_list(name, base_tokenizer):
    roles = detect_part_roles(TEMPLATES[name])
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    user = engine_message({"role": "user", "content": parts}, 0, roles)
    assert user["content"] == parts  # as vLLM's "openai" format hands them over
    tool = engine_message({"role": "tool", "tool_call_id": CALL_ID, "content": parts}, 2, roles)
    assert tool["content"] == "a\nb"  # joined as vLLM joins a tool message's text parts
    # the template joins the user's parts its own way (no separator), as it does behind vLLM
    renderer = _renderer(base_tokenizer, name)
    text = renderer.render_text([{"role": "user", "content": parts}])
    assert "ab" in text and "a\nb" not in text
    # images keep their place in the user's list on a vision model
    img = engine_message({"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                      {"type": "image_url", "image_url": {"url": "data:x"}}]},
                         0, roles, media=True, images=_images({(0, 1): "sha256:ab"}))
    assert img["content"] == [{"type": "text", "text": "what is it?"}, {"type": "image", "image": "sha256:ab"}]


def _images(digests):
    from rowgrove.gateway.core.messages import RequestImages

    return RequestImages(images=[], digests=digests)


# -- the role logic, one clause each ---------------------------------------------------------------

_LOOP = "{% for p in m.content %}{{ p.type }}{% endfor %}"
ALL = {"system", "developer", "user", "assistant", "tool"}


@pytest.mark.parametrize("template, roles", [
    # no role test around the loop: every role
    ("{% for m in messages %}" + _LOOP + "{% endfor %}", ALL),
    # a loop that never asks a part's type (GLM-4.6's tool branch): no role
    ("{% for m in messages %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}", set()),
    ("{% for m in messages %}{% if m.role == 'user' %}" + _LOOP + "{% endif %}{% endfor %}", {"user"}),
    ("{% for m in messages %}{% if 'user' == m['role'] %}" + _LOOP + "{% endif %}{% endfor %}", {"user"}),
    ("{% for m in messages %}{% if m.role != 'tool' %}" + _LOOP + "{% endif %}{% endfor %}", ALL - {"tool"}),
    ("{% for m in messages %}{% if m.role in ['user', 'system'] %}" + _LOOP + "{% endif %}{% endfor %}",
     {"user", "system"}),
    ("{% for m in messages %}{% if m.role not in ('tool',) %}" + _LOOP + "{% endif %}{% endfor %}", ALL - {"tool"}),
    # elif: every earlier test false; else: all of them
    ("{% for m in messages %}{% if m.role == 'tool' %}{{ m.content }}{% elif m.role == 'user' %}x"
     "{% else %}" + _LOOP + "{% endif %}{% endfor %}", ALL - {"tool", "user"}),
    # `and` with a test on something else does not rule the role out of the other branch
    ("{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}x{% else %}" + _LOOP
     + "{% endif %}{% endfor %}", ALL),
    ("{% for m in messages %}{% if not (m.role == 'tool' or m.role == 'developer') %}" + _LOOP
     + "{% endif %}{% endfor %}", ALL - {"tool", "developer"}),
    # a variable set from the role
    ("{% for m in messages %}{% set r = m.role %}{% if r == 'user' %}" + _LOOP + "{% endif %}{% endfor %}",
     {"user"}),
    # a variable set from the content, through a filter or a list of its items
    ("{% for m in messages %}{% if m.role == 'user' %}{% set bs = m.content | sort(attribute='type') %}"
     "{% for b in bs %}{{ b['type'] }}{% endfor %}{% endif %}{% endfor %}", {"user"}),
    ("{% for m in messages %}{% if m.role == 'user' %}{% set bs = [m.content[1], m.content[0]] %}"
     "{% for b in bs %}{{ b.type }}{% endfor %}{% endif %}{% endfor %}", {"user"}),
    # the role tested is another message's: no constraint on this one
    ("{% for m in messages %}{% if messages[0].role == 'system' %}" + _LOOP + "{% endif %}{% endfor %}", ALL),
    # the system message read outside the loop
    ("{% if messages[0]['role'] == 'system' %}{% for b in messages[0]['content'] %}{{ b.type }}{% endfor %}"
     "{% endif %}", {"system"}),
])
def test_the_role_of_a_branch_is_read_from_its_tests(template, roles):
    assert detect_part_roles(template) == roles
    assert detect_content_format(template) == (OPENAI if roles else STRING)


def test_an_unparsable_template_reads_no_parts():
    assert detect_part_roles("{% if %}") == frozenset()


# -- tool-call key order ---------------------------------------------------------------------------

def test_tool_calls_reach_the_template_in_vllms_key_order():
    """vLLM validates the body with pydantic, which rebuilds each tool call as OpenAI's
    ChatCompletionMessageFunctionToolCallParam (`id`, `function`, `type`) and its `function` as
    `Function` (`arguments`, `name`), other keys after them as sent."""
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "extra": 1, "function": {"name": "f", "x": 2, "arguments": '{"b": 1, "a": 2}'},
         "id": CALL_ID, "index": None}]}
    call = engine_message(msg, 1)["tool_calls"][0]
    assert list(call) == ["id", "function", "type", "extra"]
    assert list(call["function"]) == ["arguments", "name", "x"]
    assert list(call["function"]["arguments"]) == ["b", "a"]  # the arguments keep the sampled order
    # a call sent without a type gets "function", in type's place
    bare = {"role": "assistant", "content": "",
            "tool_calls": [{"id": CALL_ID, "function": {"name": "f", "arguments": ""}}]}
    assert engine_message(bare, 1)["tool_calls"][0] == {"id": CALL_ID, "function": {"arguments": {}, "name": "f"},
                                                        "type": "function"}


def test_mistral_nemo_writes_arguments_before_name(base_tokenizer):
    """Mistral Nemo's template writes `tool_call.function|tojson` (its own text, not an excerpt:
    the real template is read through tests/families.py when present)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from families import FAMILIES

    source = FAMILIES["mistral-nemo"].chat_template()  # skips without the real templates
    prepared = engine_messages(_tool_turn(False))
    text = base_tokenizer.apply_chat_template(prepared, tokenize=False, add_generation_prompt=True,
                                              chat_template=source)
    want = json.dumps({"arguments": {"city": "Paris"}, "name": "get_weather"})[:-1] + ', "id": "' + CALL_ID + '"}'
    assert want in text, text
