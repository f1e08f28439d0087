"""Canonical message hashing: what counts as the same message for continuation and matching."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest
from rowgrove.hashing import chain_hashes, chain_start, chain_step, message_hash

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)


def tool_call(name, args_text, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args_text}}


@settings(max_examples=40, deadline=None)
@given(args=st.dictionaries(st.text(max_size=6), json_values, max_size=5), indent=st.sampled_from([None, 2]))
def test_tool_call_arguments_compare_as_parsed_json(args, indent):
    a = {"role": "assistant", "content": None, "tool_calls": [tool_call("f", json.dumps(args))]}
    reordered = dict(reversed(list(args.items())))
    b = {"role": "assistant", "content": "", "tool_calls": [tool_call("f", json.dumps(reordered, indent=indent), "other-id")]}
    assert message_hash(a) == message_hash(b)


def test_sdk_null_fields_are_ignored_and_empty_assistant_content_is_none():
    plain = {"role": "assistant", "content": "hi"}
    sdk = {"role": "assistant", "content": "hi", "refusal": None, "annotations": None, "audio": None,
           "function_call": None, "tool_calls": None}
    assert message_hash(plain) == message_hash(sdk)
    calls = [tool_call("f", "{}")]
    assert message_hash({"role": "assistant", "content": "", "tool_calls": calls}) == message_hash(
        {"role": "assistant", "tool_calls": calls}
    )


def test_differences_that_a_template_renders_change_the_hash():
    base = {"role": "assistant", "content": "hi"}
    assert message_hash(base) != message_hash({"role": "user", "content": "hi"})
    assert message_hash(base) != message_hash({"role": "assistant", "content": "hi "})
    assert message_hash(base) != message_hash({**base, "reasoning_content": "think"})
    # an empty user message is not the same as a missing one: only the assistant folds "" and null
    assert message_hash({"role": "user", "content": ""}) != message_hash({"role": "user", "content": None})
    a = {"role": "assistant", "content": None, "tool_calls": [tool_call("f", '{"x": 1}')]}
    b = {"role": "assistant", "content": None, "tool_calls": [tool_call("f", '{"x": 2}')]}
    assert message_hash(a) != message_hash(b)
    assert message_hash({"role": "tool", "tool_call_id": "a", "content": "1"}) != message_hash(
        {"role": "tool", "tool_call_id": "b", "content": "1"}
    )


def test_inline_media_is_identified_by_its_bytes():
    import base64

    data = base64.b64encode(b"\x89PNG-bytes").decode()
    m1 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}
    m2 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}", "detail": "auto"}}]}
    other = base64.b64encode(b"\x89PNG-other").decode()
    m3 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{other}"}}]}
    assert message_hash(m1) == message_hash(m2)
    assert message_hash(m1) != message_hash(m3)


@settings(max_examples=30, deadline=None)
@given(texts=st.lists(st.text(max_size=10), min_size=1, max_size=6))
def test_chain_is_incremental(texts):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    h0 = chain_start([{"type": "function", "function": {"name": "f"}}], {"enable_thinking": False})
    full = chain_hashes(msgs, h0)
    # extending a request extends its chain: the prefix's hashes are unchanged
    assert chain_hashes(msgs[:-1], h0) == full[:-1]
    assert full[-1] == chain_step(full[-2] if len(full) > 1 else h0, message_hash(msgs[-1]))
    # tools and template options are part of h0
    assert chain_hashes(msgs, chain_start(None, {"enable_thinking": False}))[-1] != full[-1]


@pytest.mark.parametrize(
    "msg, fragment",
    [
        ({"role": "wizard", "content": "x"}, "unknown message role 'wizard'"),
        ({"role": "user", "content": 3}, "content must be a string or a list"),
        ("not a dict", "must be a JSON object"),
        ({"role": "assistant", "tool_calls": [{"function": {}}]}, "function.name"),
    ],
)
def test_bad_messages_are_rejected_with_a_named_cause(msg, fragment):
    with pytest.raises(BadRequest, match=fragment):
        message_hash(msg)
