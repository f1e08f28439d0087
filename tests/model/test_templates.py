"""The shipped chat templates, rendered through the real `tokenizer.apply_chat_template`.

We render with `tokenize=False` and encode with `add_special_tokens=False` (transformers 5's
`tokenize=True` returns a BatchEncoding), which is also what the gateway does.
"""

from __future__ import annotations

import json

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.model.load import load_tokenizer
from rowgrove.toolcalls import format_assistant_text, format_tool_call

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "two cities",
     "tool_calls": [call("c1", "get_weather", '{"city": "Paris"}'), call("c2", "get_weather", '{"city": "Rome"}')]},
    {"role": "tool", "tool_call_id": "c1", "content": "21"},
    {"role": "tool", "tool_call_id": "c2", "content": "25"},
    {"role": "assistant", "content": "Paris 21, Rome 25.", "reasoning_content": "read them"},
    {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "Oslo?"}]},
    {"role": "assistant", "content": None, "tool_calls": [call("c3", "get_weather", '{"city": "Oslo"}')]},
    {"role": "tool", "tool_call_id": "c3", "content": "3"},
    {"role": "assistant", "content": "Oslo 3."},
]


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen3", "tiny-llama3"])
def tok(request):
    return load_tokenizer(request.param)


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_chatml_renders_as_specified():
    tok = load_tokenizer("tiny")
    text = render(tok, CONV[:6], tools=TOOLS, add_generation_prompt=True)
    expected_tail = (
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\ntwo cities\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n25\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nread them\n</think>\n\nParis 21, Rome 25.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert text.endswith(expected_tail)
    # no system message -> default one; no tools -> no tools block
    plain = render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert plain == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_llama3_renders_as_specified():
    tok = load_tokenizer("tiny-llama3")
    text = render(tok, CONV[:5], add_generation_prompt=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert ("<|start_header_id|>ipython<|end_header_id|>\n\n21<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n25<|eot_id|>") in text
    gen = render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert gen == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    with_tools = render(tok, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert with_tools.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n# Tools\n")


def test_qwen3_strips_reasoning_before_last_query_and_thinking_switch():
    tok = load_tokenizer("tiny-qwen3")
    text = render(tok, CONV[:7])
    assert "two cities" not in text and "read them" not in text  # both before the last user query
    # after the last user query (tool responses do not count as a query) reasoning is kept
    text5 = render(tok, CONV[:6])
    assert "<think>\ntwo cities\n</think>\n\nChecking." in text5 and "<think>\nread them\n</think>" in text5
    # a <think> block inside content is recognised and stripped the same way
    inline = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"},
              {"role": "user", "content": "q2"}]
    assert "hmm" not in render(tok, inline) and "<|im_start|>assistant\nA<|im_end|>" in render(tok, inline)
    assert "<think>\nhmm\n</think>\n\nA" in render(tok, inline[:2])
    assert render(tok, inline, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    assert render(tok, inline, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not render(tok, [{"role": "user", "content": "q"}]).startswith("<|im_start|>system")


def test_assistant_turn_is_generation_prompt_plus_model_text(tok):
    """What the template writes for an assistant message equals what the model samples after the
    generation prompt (format_assistant_text) followed by the end-of-turn token."""
    before = CONV[:2]
    msg = CONV[2]
    prompt = render(tok, before, add_generation_prompt=True)
    full = render(tok, before + [msg])
    body = format_assistant_text("Checking.", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
                                 reasoning="two cities")
    assert full.startswith(prompt + body + tok.eos_token)
    assert body.count(format_tool_call("get_weather", {"city": "Rome"})) == 1


def test_arguments_as_mapping_render_like_format_tool_call(tok):
    args = {"z": 1, "a": "é", "nested": {"k": [1, 2]}}
    m = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": args}}]}]
    assert format_tool_call("f", args) + tok.eos_token in render(tok, m)


@pytest.mark.parametrize("spec", ["tiny", "tiny-llama3"])
def test_prefix_stable_at_assistant_boundaries(spec):
    tok = load_tokenizer(spec)
    full = render(tok, CONV, tools=TOOLS)
    for i, m in enumerate(CONV):
        if m["role"] == "assistant":
            assert full.startswith(render(tok, CONV[: i + 1], tools=TOOLS)), i
            # and the prompt the model saw for this turn is a prefix too
            assert full.startswith(render(tok, CONV[:i], tools=TOOLS, add_generation_prompt=True)), i


def test_chatml_not_prefix_stable_between_consecutive_tool_messages():
    tok = load_tokenizer("tiny")
    assert not render(tok, CONV[:5]).startswith(render(tok, CONV[:4]))
    assert render(tok, CONV[:5]).startswith(render(tok, CONV[:4])[: -len("<|im_end|>\n")])
    llama = load_tokenizer("tiny-llama3")
    assert render(llama, CONV[:5]).startswith(render(llama, CONV[:4]))


def test_qwen3_breaks_prefix_once_a_new_user_message_arrives():
    tok = load_tokenizer("tiny-qwen3")
    assert render(tok, CONV[:5]).startswith(render(tok, CONV[:3]))  # tool results: no new query
    assert render(tok, CONV[:6]).startswith(render(tok, CONV[:3]))
    assert not render(tok, CONV[:7]).startswith(render(tok, CONV[:6]))  # new user query drops <think>


def test_unknown_role_raises(tok):
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role"):
        render(tok, [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])


def test_image_part_is_refused(tok):
    msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="only text parts"):
        render(tok, msg)


def test_encoded_rendering_has_single_id_markup(tok):
    text = render(tok, CONV[:3], add_generation_prompt=False)
    ids = tok.encode(text, add_special_tokens=False)
    toks = tok.convert_ids_to_tokens(ids)
    assert toks.count("<tool_call>") == 2 and toks.count("</tool_call>") == 2
    assert toks.count("<think>") == 1  # the last assistant turn keeps its reasoning in all three
    assert tok.decode(ids) == text


_TOKENIZERS: dict = {}
_text = st.text(st.sampled_from("abc xyz 019.,!?\n{}\"é"), min_size=0, max_size=12)


@st.composite
def conversations(draw):
    msgs = [{"role": "system", "content": draw(_text)}] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 4))):
        msgs.append({"role": "user", "content": draw(_text)})
        while True:
            calls = draw(st.lists(st.tuples(st.sampled_from(["f", "get_weather"]), st.dictionaries(st.sampled_from("abc"), st.integers(0, 99), max_size=2)), max_size=2))
            msg = {"role": "assistant", "content": draw(st.none() | _text)}
            if draw(st.booleans()):
                msg["reasoning_content"] = draw(_text.filter(lambda s: s.strip("\n")))
            if calls:
                msg["tool_calls"] = [call(f"c{turn}{i}", n, json.dumps(a)) for i, (n, a) in enumerate(calls)]
            msgs.append(msg)
            if not calls:
                break
            msgs.extend({"role": "tool", "tool_call_id": f"c{turn}{i}", "content": draw(_text)} for i in range(len(calls)))
    return msgs


@pytest.mark.parametrize("spec", ["tiny", "tiny-llama3"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversations())
def test_prefix_stable_property_in_text_and_ids(spec, conv):
    """For random conversations, at every assistant boundary the rendering (and its ids) is a
    prefix of the full rendering: what the gateway's continuations rely on for these templates."""
    if spec not in _TOKENIZERS:
        _TOKENIZERS[spec] = load_tokenizer(spec)
    tok = _TOKENIZERS[spec]
    full = render(tok, conv, tools=TOOLS)
    full_ids = tok.encode(full, add_special_tokens=False)
    for i, m in enumerate(conv):
        if m["role"] == "assistant":
            part = render(tok, conv[: i + 1], tools=TOOLS)
            assert full.startswith(part)
            ids = tok.encode(part, add_special_tokens=False)
            assert full_ids[: len(ids)] == ids
