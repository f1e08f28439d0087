"""Hand-written samples of each family's native sampled format: several calls, malformed blocks,
reasoning with tool calls, no tool calls."""

from __future__ import annotations

import json

import pytest

from rowgrove.parsers import parse_output

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"}, "hourly": {"type": "boolean"},
    "opts": {"type": "object"}, "tags": {"type": "array"}, "code": {"type": "string"}, "maybe": {"type": ["integer", "null"]}}}}}


def P(text, tp=None, rp=None, **kw):
    return parse_output(text, tool_parser=tp, reasoning_parser=rp, id_seed="s", **kw)


def calls(p):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls]


# ---------------------------------------------------------------- hermes

def test_hermes_several_and_malformed():
    text = ('Sure.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {bad}\n</tool_call>\n'
            '<tool_call>\n{"name": "c", "arguments": {}}\n</tool_call>')
    p = P(text, "hermes")
    assert calls(p) == [("a", {"x": 1}), ("c", {})]
    assert len(p.errors) == 1 and "does not parse" in p.errors[0]
    assert p.content.startswith("Sure.") and '{"name": "b"' in p.content


def test_hermes_cut_short_and_plain():
    p = P('<tool_call>\n{"name": "a", "argu', "hermes")
    assert p.tool_calls == [] and p.content.startswith("<tool_call>") and "without" in p.errors[0]
    p = P("just text\n", "hermes")
    assert (p.content, p.tool_calls, p.errors) == ("just text\n", [], [])


def test_hermes_with_qwen3_reasoning_opened_by_prompt():
    p = P('Weather first.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
          "hermes", "qwen3")
    assert p.reasoning == "Weather first." and p.content is None
    assert calls(p) == [("get_weather", {"city": "Oslo"})]


def test_qwen3_without_close_is_content_and_r1_is_reasoning():
    text = "<think>\nstill thinking when max_tokens hit"
    assert P(text, "hermes", "qwen3").content == text
    p = P("still thinking", "hermes", "deepseek_r1")
    assert (p.reasoning, p.content) == ("still thinking", None)
    p = P("<think>\nstill thinking", None, "deepseek_r1")
    assert (p.reasoning, p.content) == ("still thinking", None)


# ---------------------------------------------------------------- llama3_json

def test_llama3_json_forms():
    p = P('{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3_json")
    assert calls(p) == [("get_weather", {"city": "Paris"})] and p.content is None
    p = P('<|python_tag|>{"name": "a", "parameters": {"x": {"y": [1]}}}; {"name": "b", "arguments": {}}', "llama3_json")
    assert calls(p) == [("a", {"x": {"y": [1]}}), ("b", {})]
    p = P('I will call it.\n{"name": "a", "parameters": {}}', "llama3_json")
    assert calls(p) == [("a", {})] and p.content == "I will call it."


def test_llama3_json_malformed_and_prose():
    p = P('{"name": "a", "parameters": {"x": }', "llama3_json")
    assert p.tool_calls == [] and p.errors and p.content.startswith('{"name"')
    p = P('<|python_tag|>get_weather.call(city="Paris")', "llama3_json")
    assert p.tool_calls == [] and p.errors
    p = P('The config is {"debug": true}.', "llama3_json")
    assert (p.content, p.tool_calls, p.errors) == ('The config is {"debug": true}.', [], [])


# ---------------------------------------------------------------- mistral

def test_mistral_nemo_array():
    p = P('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcDEF123"}, {"name": "b", "arguments": {}}]',
          "mistral", id_style="mistral")
    assert calls(p) == [("a", {"x": 1}), ("b", {})]
    assert p.tool_calls[0]["id"] == "abcDEF123"
    assert len(p.tool_calls[1]["id"]) == 9 and p.tool_calls[1]["id"].isalnum()


def test_mistral_v11_forms():
    p = P('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}', "mistral", id_style="mistral")
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert p.content == "Checking."
    p = P('[TOOL_CALLS]add{"a": 3.5, "b": 4}', "mistral")
    assert calls(p) == [("add", {"a": 3.5, "b": 4})]
    p = P('[TOOL_CALLS]add[CALL_ID]Zz9Zz9Zz9[ARGS]{"a": 1}', "mistral")
    assert p.tool_calls[0]["id"] == "Zz9Zz9Zz9"


def test_mistral_malformed_and_reasoning():
    p = P('[TOOL_CALLS]a[ARGS]{"x": [TOOL_CALLS]b[ARGS]{"y": 2}', "mistral")
    assert calls(p) == [("b", {"y": 2})] and len(p.errors) == 1 and "[TOOL_CALLS]a" in p.content
    p = P('[THINK]plan[/THINK]Answer.', "mistral", "mistral")
    assert (p.reasoning, p.content) == ("plan", "Answer.")


# ---------------------------------------------------------------- qwen3_coder

CODER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
         "<parameter=temp>\n21.5\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n"
         "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n"
         "<parameter=code>\ndef f():\n    return 1\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n</function>\n</tool_call>")


def test_qwen3_coder_typed_by_schema():
    p = P("I'll check.\n\n" + CODER, "qwen3_coder", tools=[WEATHER])
    assert p.errors == [] and p.content == "I'll check."
    assert calls(p) == [("get_weather", {"city": "New York", "days": 3, "temp": 21.5, "hourly": True, "opts": {"a": [1, 2]},
                                         "tags": ["x"], "code": "def f():\n    return 1", "maybe": None})]


def test_qwen3_coder_without_schema_keeps_strings_and_bad_values():
    p = P(CODER, "qwen3_coder")
    assert calls(p)[0][1]["days"] == "3" and calls(p)[0][1]["hourly"] == "True"
    bad = CODER.replace("\n3\n", "\nthree\n")
    assert calls(P(bad, "qwen3_coder", tools=[WEATHER]))[0][1]["days"] == "three"


def test_qwen3_coder_several_malformed_and_reasoning():
    two = ("<think>\nplan\n</think>\n\n<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n"
           "<tool_call>\nno function here\n</tool_call>\n"
           "<tool_call>\n<function=b>\n</function>\n</tool_call>")
    p = P(two, "qwen3_coder", "qwen3")
    assert p.reasoning == "plan"
    assert calls(p) == [("a", {"x": "1"}), ("b", {})]
    assert len(p.errors) == 1 and "no function here" in p.content
    p = P("<tool_call>\n<function=a>\n<parameter=x>\n1", "qwen3_coder")
    assert p.tool_calls == [] and "without" in p.errors[0]


# ---------------------------------------------------------------- deepseek

def test_deepseek_v31_several_and_malformed():
    text = ("Calling.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>b<｜tool▁sep｜>{oops<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>c<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    p = P(text, "deepseek_v31")
    assert calls(p) == [("a", {"x": 1}), ("c", {})]
    assert len(p.errors) == 1 and "{oops" in p.content and p.content.startswith("Calling.")


def test_deepseek_v3_fenced_form_with_r1_reasoning():
    text = ("Need weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
            "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
            "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    for tp in ("deepseek_v3", "deepseek_v31"):
        p = P(text, tp, "deepseek_r1")
        assert p.reasoning == "Need weather." and p.content is None and p.errors == []
        assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_deepseek_plain_and_cut_short():
    assert P("Hi!", "deepseek_v31").content == "Hi!"
    p = P("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\"", "deepseek_v31")
    assert p.tool_calls == [] and p.errors


# ---------------------------------------------------------------- openai (harmony)

def test_harmony_analysis_then_call_recipient_after_channel():
    text = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}')
    p = P(text, "openai", "openai")
    assert p.reasoning == "Need weather." and p.content is None and p.errors == []
    assert calls(p) == [("get_weather", {"city": "Paris"})]
    assert p.tool_calls[0]["function"]["arguments"] == '{"city": "Paris"}'


def test_harmony_recipient_before_channel_and_final():
    p = P(' to=functions.lookup<|channel|>commentary json<|message|>{"q": "x"}<|call|>', "openai", "openai")
    assert calls(p) == [("lookup", {"q": "x"})] and p.reasoning is None
    p = P("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.", "openai", "openai")
    assert (p.reasoning, p.content, p.tool_calls) == ("Think.", "Answer.", [])
    p = P("<|channel|>final<|message|>Only answer.", "openai", None)
    assert (p.reasoning, p.content) == (None, "Only answer.")


def test_harmony_malformed_call_and_plain_text():
    p = P('<|channel|>commentary to=functions.f json<|message|>{"a": ', "openai", "openai")
    assert p.tool_calls == [] and p.errors and "functions.f" in p.content
    p = P("no harmony at all", "openai", "openai")
    assert (p.content, p.reasoning, p.errors) == ("no harmony at all", None, [])


def test_harmony_reasoning_only_keeps_call_raw():
    text = '<|channel|>analysis<|message|>T<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}'
    p = P(text, None, "openai")
    assert p.reasoning == "T" and p.tool_calls == [] and "to=functions.f" in p.content


# ---------------------------------------------------------------- glm45

def test_glm45_typed_values_and_reasoning():
    text = ("\n<think>Look it up.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"a\": true}</arg_value>\n"
            "<arg_key>code</arg_key>\n<arg_value>42</arg_value>\n</tool_call>")
    p = P(text, "glm45", "glm45", tools=[WEATHER])
    assert (p.reasoning, p.content) == ("Look it up.", "Checking.")
    assert calls(p) == [("get_weather", {"city": "Paris", "days": 3, "opts": {"a": True}, "code": "42"})]
    p = P(text, "glm45", "glm45")  # no schema: JSON-looking values decode
    assert calls(p)[0][1]["code"] == 42 and calls(p)[0][1]["city"] == "Paris"


def test_glm45_several_and_malformed():
    text = ("<tool_call>a\n</tool_call>\n<tool_call>\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>\n"
            "<tool_call>b\n<arg_key>y</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")
    p = P(text, "glm45")
    assert calls(p) == [("a", {}), ("b", {"y": 2})] and len(p.errors) == 1 and "<arg_key>x" in p.content


# ---------------------------------------------------------------- kimi_k2

def test_kimi_k2_ids_kept():
    text = ("<think>plan</think>Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
            "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")
    p = P(text, "kimi_k2", "kimi_k2", id_style="kimi")
    assert (p.reasoning, p.content) == ("plan", "Let me check.")
    assert calls(p) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert [c["id"] for c in p.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]


def test_kimi_k2_malformed():
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{bad<|tool_call_end|>"
            "<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{\"z\": 0}<|tool_call_end|><|tool_calls_section_end|>")
    p = P(text, "kimi_k2")
    assert calls(p) == [("b", {"z": 0})] and len(p.errors) == 1 and "{bad" in p.content
    assert P("plain", "kimi_k2").content == "plain"


# ---------------------------------------------------------------- common behaviour

@pytest.mark.parametrize("tp", ["hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v31", "deepseek_v3", "openai",
                                "glm45", "kimi_k2"])
@pytest.mark.parametrize("text", ["", "plain answer", "<tool_call>", "[TOOL_CALLS]", "{", "<|channel|>", "<|message|>x",
                                  "<｜tool▁call▁begin｜>", "<|tool_call_begin|>", "<function=", "<arg_key>", "\x00\ud800"])
def test_never_raises(tp, text):
    for rp in (None, "qwen3", "deepseek_r1", "deepseek_v3", "openai", "glm45", "kimi_k2", "mistral"):
        p = P(text, tp, rp)
        assert p.content is None or isinstance(p.content, str)


def test_no_parsers_is_identity_and_unknown_names_raise():
    assert P("<think>x</think>y").content == "<think>x</think>y"
    with pytest.raises(ValueError):
        P("x", "nope")
    with pytest.raises(ValueError):
        P("x", None, "nope")
