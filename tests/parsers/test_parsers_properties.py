"""Round-trip properties: names and arguments drawn, formatted the way the model samples them
(hand formatters and the real templates), then parsed back equal."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parser_templates import sampled_assistant

from rowgrove.parsers import make_tool_call_id, parse_output
from rowgrove.parsers.hermes import format_call as hermes_call
from rowgrove.parsers.qwen3_coder import format_call as coder_call
from rowgrove.toolcalls import format_assistant_text

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
safe_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="<>"), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | safe_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(safe_text, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(ident, json_values, max_size=4)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


def _calls(p):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls]


@SETTINGS
@given(calls=st.lists(st.tuples(names, st.dictionaries(st.text(max_size=8), json_values, max_size=4)), min_size=1, max_size=3),
       content=st.none() | safe_text.filter(lambda s: s.strip()), reasoning=st.none() | safe_text.filter(lambda s: s.strip("\n")))
def test_hermes_round_trip(calls, content, reasoning):
    text = format_assistant_text(content, calls, reasoning=reasoning)
    p = parse_output(text, tool_parser="hermes", reasoning_parser="qwen3", id_seed="x")
    assert p.errors == []
    assert _calls(p) == [(n, a) for n, a in calls]
    assert [c["function"]["arguments"] for c in p.tool_calls] == [json.dumps(a, ensure_ascii=False) for _, a in calls]
    assert p.content == (content.strip() if content else None)
    assert p.reasoning == (reasoning.strip("\n") if reasoning else None)
    assert text.count("<tool_call>") == len(calls) and hermes_call(*calls[0]) in text


def _schema(args: dict) -> dict:
    def t(v):
        return {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array"}.get(type(v), "null")
    return {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {k: {"type": t(v)} for k, v in args.items()}}}}


coder_values = (st.booleans() | st.integers(-10**9, 10**9) | safe_text
                | st.dictionaries(safe_text, st.integers() | safe_text, max_size=3) | st.lists(st.integers(), max_size=3))


@SETTINGS
@given(name=ident, args=st.dictionaries(ident, coder_values, max_size=4), n=st.integers(1, 3))
def test_qwen3_coder_round_trip_with_schema(name, args, n):
    tools = [dict(_schema(args), function={**_schema(args)["function"], "name": name})]
    text = "\n".join(coder_call(name, args) for _ in range(n))
    p = parse_output(text, tool_parser="qwen3_coder", reasoning_parser=None, tools=tools)
    assert p.errors == [] and p.content is None
    assert _calls(p) == [(name, args)] * n


@SETTINGS
@given(calls=st.lists(st.tuples(ident, arguments), min_size=1, max_size=3))
def test_deepseek_v31_template_round_trip(calls):
    name = "deepseek-ai-DeepSeek-V3.1.jinja"
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}
    text = sampled_assistant(name, [{"role": "user", "content": "go"}], msg)
    p = parse_output(text, tool_parser="deepseek_v31", reasoning_parser="deepseek_v3")
    assert p.errors == [] and p.content is None and p.reasoning is None
    assert _calls(p) == calls


glm_values = safe_text | st.integers(-10**9, 10**9) | st.booleans() | st.lists(st.integers(), max_size=3) | \
    st.dictionaries(safe_text, st.integers(), max_size=2)


@SETTINGS
@given(name=ident, args=st.dictionaries(ident, glm_values, max_size=4), reasoning=st.none() | safe_text.filter(str.strip))
def test_glm45_template_round_trip(name, args, reasoning):
    tmpl = "GLM-4.6.jinja"
    tools = [dict(_schema(args), function={**_schema(args)["function"], "name": name})]
    msg = {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {"name": name, "arguments": args}}]}
    if reasoning:
        msg["reasoning_content"] = reasoning
    text = sampled_assistant(tmpl, [{"role": "user", "content": "go"}], msg, tools=tools)
    p = parse_output(text, tool_parser="glm45", reasoning_parser="glm45", tools=tools)
    assert p.errors == [] and p.content is None
    assert _calls(p) == [(name, args)]
    assert p.reasoning == (reasoning.strip() if reasoning else "")


@SETTINGS
@given(calls=st.lists(st.tuples(ident, arguments), min_size=1, max_size=3), content=st.none() | safe_text.filter(str.strip))
def test_kimi_and_mistral_v11_round_trip(calls, content):
    kimi = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json.dumps(a, ensure_ascii=False)}<|tool_call_end|>"
                   for i, (n, a) in enumerate(calls))
    p = parse_output((content or "") + "<|tool_calls_section_begin|>" + kimi + "<|tool_calls_section_end|>",
                     tool_parser="kimi_k2", reasoning_parser="kimi_k2", id_style="kimi")
    assert p.errors == [] and _calls(p) == calls and p.content == (content.strip() if content else None)
    assert [c["id"] for c in p.tool_calls] == [make_tool_call_id("kimi", "", i, n, "") for i, (n, _) in enumerate(calls)]
    mistral = "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, ensure_ascii=False)}" for n, a in calls)
    p = parse_output((content or "") + mistral, tool_parser="mistral", reasoning_parser=None, id_style="mistral", id_seed="q")
    assert p.errors == [] and _calls(p) == calls and p.content == (content.strip() if content else None)
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in p.tool_calls)
