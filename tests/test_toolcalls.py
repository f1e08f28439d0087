"""Reading and writing hermes-style tool calls: round trips, think blocks, malformed JSON."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.toolcalls import format_assistant_text, format_tool_call, parse_assistant_text, tool_call_id

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=5)


@settings(max_examples=60, deadline=None)
@given(name=names, args=arguments, content=st.none() | st.text(min_size=1, max_size=30).filter(lambda s: s.strip() and "<" not in s))
def test_round_trip(name, args, content):
    text = format_assistant_text(content, [(name, args), (name, {})])
    parsed = parse_assistant_text(text, id_seed="call-1")
    assert parsed.errors == []
    assert [c["function"]["name"] for c in parsed.tool_calls] == [name, name]
    got = json.loads(parsed.tool_calls[0]["function"]["arguments"])
    assert got == args and list(got) == list(args)  # order preserved
    assert parsed.tool_calls[0]["function"]["arguments"] == json.dumps(args, ensure_ascii=False)
    assert parsed.content == (content.strip() if content else None)
    assert parsed.reasoning is None
    # the parsed message renders back to the same text (arguments are canonical json.dumps)
    again = format_assistant_text(parsed.content, [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                                   for c in parsed.tool_calls])
    if content is None or content == content.strip():
        assert again == text


def test_think_content_and_several_calls():
    text = ("<think>\nneed two lookups\n</think>\n\nLet me check.\n" + format_tool_call("search", {"q": "a"})
            + "\n" + format_tool_call("read_file", {"path": "/x", "n": 3}))
    p = parse_assistant_text(text, id_seed="s")
    assert p.reasoning == "need two lookups"
    assert p.content == "Let me check."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in p.tool_calls] == [
        ("search", '{"q": "a"}'), ("read_file", '{"path": "/x", "n": 3}')]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in p.tool_calls)
    assert p.tool_calls[0]["id"] != p.tool_calls[1]["id"]
    assert p.to_message() == {"role": "assistant", "content": "Let me check.", "tool_calls": p.tool_calls,
                              "reasoning_content": "need two lookups"}


def test_ids_are_deterministic_and_seeded():
    text = format_tool_call("f", {"a": 1})
    a, b, c = (parse_assistant_text(text, id_seed=s).tool_calls[0]["id"] for s in ("x", "x", "y"))
    assert a == b != c
    assert a == tool_call_id("x", 0, "f", '{"a": 1}')


def test_malformed_json_stays_in_content_and_is_reported():
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'
    good = format_tool_call("g", {})
    p = parse_assistant_text(f"Hi\n{bad}\n{good}")
    assert [c["function"]["name"] for c in p.tool_calls] == ["g"]
    assert bad in p.content and "Hi" in p.content
    assert len(p.errors) == 1 and "does not parse" in p.errors[0]


def test_other_malformed_shapes_never_raise():
    for body in ("[1, 2]", '{"arguments": {}}', '{"name": "f", "arguments": [1]}', '{"name": "f", "arguments": "nope"}', ""):
        p = parse_assistant_text(f"<tool_call>\n{body}\n</tool_call>")
        assert p.tool_calls == [] and len(p.errors) == 1 and p.content.startswith("<tool_call>")
    cut = parse_assistant_text('<tool_call>\n{"name": "f", "argu')  # cut by max_tokens
    assert cut.tool_calls == [] and cut.content.startswith("<tool_call>") and "without </tool_call>" in cut.errors[0]


def test_arguments_as_json_string_are_accepted():
    p = parse_assistant_text('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 2}"}\n</tool_call>')
    assert p.tool_calls[0]["function"]["arguments"] == '{"a": 2}'


def test_plain_text_and_thinking_variants():
    assert parse_assistant_text("reply 3").content == "reply 3"
    assert parse_assistant_text("").content is None
    p = parse_assistant_text("reasoning only opened by the prompt\n</think>\n\nanswer")
    assert (p.reasoning, p.content) == ("reasoning only opened by the prompt", "answer")
    p = parse_assistant_text("<think>\n\n</think>\n\n" + format_tool_call("f", {}))
    assert p.reasoning == "" and p.content is None and len(p.tool_calls) == 1
