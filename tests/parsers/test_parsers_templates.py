"""Round trips through the real chat templates ($ROWGROVE_TEMPLATES): render an assistant turn
with tool calls (arguments as dicts) the way the template writes it, take what the model would
sample, and check the auto-detected parsers read back the same names, arguments and reasoning."""

from __future__ import annotations

import json

import pytest
from parser_templates import SPECIALS, sampled_assistant, template, tool_calls

from rowgrove.parsers import detect_reasoning_parser, detect_tool_parser, parse_output, tool_call_id_style

USER = [{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"},
                                     "detail": {"type": "object"}, "hourly": {"type": "boolean"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Local time.", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}
TOOLS = [WEATHER, CLOCK]
ARGS1 = {"city": "Paris", "days": 3, "detail": {"wind": True, "levels": [1, 2.5, None]}, "hourly": False}
ARGS2 = {"tz": "Asia/Tokyo — 東京"}


def _parse(name: str, text: str, **kw):
    t = template(name)
    return parse_output(text, tool_parser=detect_tool_parser(t), reasoning_parser=detect_reasoning_parser(t),
                        id_seed="seed-1", tools=TOOLS, id_style=tool_call_id_style(t), **kw)


def _calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


MULTI = ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
         "deepseek-ai-DeepSeek-V3.1.jinja", "GLM-4.6.jinja"]


@pytest.mark.parametrize("name", MULTI)
def test_two_calls_round_trip(name):
    msg = {"role": "assistant", "content": "", "tool_calls": tool_calls(("get_weather", ARGS1), ("get_time", ARGS2))}
    text = sampled_assistant(name, USER, msg, tools=TOOLS)
    p = _parse(name, text)
    assert p.errors == []
    assert _calls(p) == [("get_weather", ARGS1), ("get_time", ARGS2)]
    assert p.content is None
    ids = [c["id"] for c in p.tool_calls]
    assert len(set(ids)) == 2
    if tool_call_id_style(template(name)) == "mistral":
        assert all(len(i) == 9 and i.isalnum() for i in ids)
    else:
        assert all(i.startswith("call_") and len(i) == 29 for i in ids)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "deepseek-ai-DeepSeek-V3.1.jinja",
                                  "GLM-4.6.jinja"])
def test_content_and_call_round_trip(name):
    msg = {"role": "assistant", "content": "Let me look that up.", "tool_calls": tool_calls(("get_weather", {"city": "Paris"}))}
    p = _parse(name, sampled_assistant(name, USER, msg, tools=TOOLS))
    assert p.errors == []
    assert p.content == "Let me look that up."
    assert _calls(p) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("name", sorted(SPECIALS))
def test_single_call_round_trip(name):
    msg = {"role": "assistant", "content": "", "tool_calls": tool_calls(("get_weather", ARGS1))}
    p = _parse(name, sampled_assistant(name, USER, msg, tools=TOOLS))
    assert p.errors == []
    assert _calls(p) == [("get_weather", ARGS1)]
    assert p.content is None


@pytest.mark.parametrize("name", sorted(SPECIALS))
def test_plain_answer_round_trip(name):
    msg = {"role": "assistant", "content": "It is sunny in Paris."}
    text = sampled_assistant(name, USER, msg, tools=TOOLS)
    p = _parse(name, text)
    assert p.errors == [] and p.tool_calls == []
    assert p.content is not None and p.content.strip() == "It is sunny in Paris."


def test_qwen3_reasoning_and_calls_round_trip():
    name = "Qwen-Qwen3-0.6B.jinja"
    msg = {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities, two lookups.",
           "tool_calls": tool_calls(("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"}))}
    text = sampled_assistant(name, USER, msg, tools=TOOLS)
    assert text.startswith("<think>\n")
    p = _parse(name, text)
    assert p.reasoning == "Two cities, two lookups."
    assert p.content == "Checking both."
    assert _calls(p) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    # the prompt may open the think block itself: the sampled text then starts inside it
    p2 = _parse(name, text[len("<think>"):])
    assert (p2.reasoning, p2.content, _calls(p2)) == (p.reasoning, p.content, _calls(p))


def test_glm_reasoning_and_call_round_trip():
    name = "GLM-4.6.jinja"
    msg = {"role": "assistant", "content": "On it.", "reasoning_content": "Need the weather.",
           "tool_calls": tool_calls(("get_weather", {"city": "Paris", "days": 2}))}
    p = _parse(name, sampled_assistant(name, USER, msg, tools=TOOLS))
    assert (p.reasoning, p.content) == ("Need the weather.", "On it.")
    assert _calls(p) == [("get_weather", {"city": "Paris", "days": 2})]


def test_gpt_oss_thinking_and_call_round_trip():
    name = "openai-gpt-oss-120b.jinja"
    msg = {"role": "assistant", "content": "", "thinking": "User wants weather.", "tool_calls": tool_calls(("get_weather", ARGS1))}
    text = sampled_assistant(name, USER, msg, tools=TOOLS)
    assert "<|channel|>analysis" in text
    p = _parse(name, text)
    assert p.reasoning == "User wants weather."
    assert _calls(p) == [("get_weather", ARGS1)] and p.content is None


def test_gpt_oss_final_answer_with_thinking_round_trip():
    name = "openai-gpt-oss-120b.jinja"
    msg = {"role": "assistant", "content": "Sunny.", "thinking": "Easy."}
    p = _parse(name, sampled_assistant(name, USER, msg, tools=TOOLS))
    assert (p.reasoning, p.content, p.tool_calls) == ("Easy.", "Sunny.", [])


def test_deepseek_v31_thinking_on_and_off():
    name = "deepseek-ai-DeepSeek-V3.1.jinja"
    t = template(name)
    assert detect_reasoning_parser(t) == "deepseek_v3"
    # thinking off: the prompt ends with <think></think>, the sample has no </think> -> all content
    p = _parse(name, "Hello there.")
    assert (p.reasoning, p.content) == (None, "Hello there.")
    # thinking on: the prompt ends with <think>, the sample closes it
    p = _parse(name, "Let me think.</think>Hello there.")
    assert (p.reasoning, p.content) == ("Let me think.", "Hello there.")


def test_mistral_sampled_ids_kept():
    name = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
    msg = {"role": "assistant", "content": "", "tool_calls": tool_calls(("get_weather", {"city": "Paris"}), ids=["Ab3dE6gH9"])}
    p = _parse(name, sampled_assistant(name, USER, msg, tools=TOOLS))
    assert p.tool_calls[0]["id"] == "Ab3dE6gH9"


def test_parsed_calls_render_back_through_template():
    """Parsed messages (ids included) are accepted by the template again: Mistral's id check."""
    name = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
    p = _parse(name, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    assert p.errors == [] and len(p.tool_calls[0]["id"]) == 9
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in p.tool_calls]
    msg = {"role": "assistant", "content": "", "tool_calls": calls}
    again = sampled_assistant(name, USER, msg, tools=TOOLS)
    assert _calls(_parse(name, again)) == [("get_weather", {"city": "Paris"})]
