"""A rollout's request bodies decoded by what each adds (`dialects.growing.GrowingBody`): every body
decodes to what `load_json` gives it, or is refused with `load_json`'s own error, whatever the
previous bodies were (a growing conversation, a branch from an earlier message, a rewrite, a
duplicate key, other spacing, escapes, bad JSON, JSON too deep); the kept messages are the very
objects of the previous request, which `RolloutIndex.chain` then hashes without reading them."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest
from rowgrove.gateway.core.decide import RolloutIndex
from rowgrove.gateway.core.messages import Kept
from rowgrove.gateway.dialects import growing
from rowgrove.gateway.dialects.growing import GrowingBody
from rowgrove.gateway.dialects.openai_format import load_json
from rowgrove.hashing import chain_hashes, chain_start

PAD = "x" * growing.MIN_BYTES  # a system prompt that makes every body large enough to be held
TEXT = st.text(alphabet="ab \"\\/\n\t日ü{}[],:\u2028", max_size=12)
MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, TEXT),
    st.builds(lambda t, n: {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": t})}}]},
        TEXT, st.integers(0, 9)),
    st.builds(lambda t, n: {"role": "tool", "tool_call_id": f"call_{n}", "content": t}, TEXT, st.integers(0, 9)),
)


def encode(body: dict, style: int) -> bytes:
    """The body as different clients write it: orjson's compact form, Python's json (spaces, ASCII
    escapes: the OpenAI SDK), pretty-printed, or with `messages` not first."""
    if style == 0:
        return orjson.dumps(body)
    if style == 1:
        return json.dumps(body).encode()
    if style == 2:
        return json.dumps(body, indent=1, ensure_ascii=False).encode()
    return json.dumps({"model": body.get("model"), **body}).encode()


def expected(raw: bytes, depth: int):
    try:
        return load_json(raw, depth), None
    except BadRequest as e:
        return None, (e.code, str(e))


def check(g: GrowingBody, raw: bytes, depth: int = 64):
    want, err = expected(raw, depth)
    if err is not None:
        with pytest.raises(BadRequest) as e:
            g.load(raw, depth)
        assert (e.value.code, str(e.value)) == err
        return None
    got = g.load(raw, depth)
    assert got == want
    return got


@st.composite
def rollouts(draw):
    """A sequence of request bodies: each the last one grown by some messages, or cut back to an
    earlier message and grown again (a branch), or its first message rewritten, in one spacing
    style per rollout (or a new style midway)."""
    style = draw(st.integers(0, 3))
    msgs = [{"role": "system", "content": PAD}, {"role": "user", "content": draw(TEXT)}]
    out = []
    for _ in range(draw(st.integers(1, 7))):
        move = draw(st.sampled_from(["grow", "grow", "grow", "branch", "rewrite", "style", "same"]))
        if move == "branch" and len(msgs) > 2:
            msgs = msgs[: draw(st.integers(2, len(msgs)))]
        elif move == "rewrite":
            msgs = [{"role": "system", "content": PAD + "!"}, *msgs[1:]]
        elif move == "style":
            style = draw(st.integers(0, 3))
        if move != "same":
            msgs = msgs + draw(st.lists(MESSAGE, min_size=1, max_size=3))
        out.append(encode({"model": "m", "messages": msgs, "max_tokens": 8}, style))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies=rollouts())
def test_every_body_decodes_as_load_json_decodes_it(bodies):
    g = GrowingBody()
    for raw in bodies:
        check(g, raw)


def test_a_growing_conversation_reuses_the_held_messages_themselves():
    g = GrowingBody()
    msgs = [{"role": "system", "content": PAD}, {"role": "user", "content": "go"}]
    seen = []
    for k in range(4):
        msgs = msgs + [{"role": "assistant", "content": f"r{k}"}, {"role": "user", "content": f"u{k}"}]
        got = check(g, json.dumps({"messages": msgs, "model": "m"}).encode())
        seen.append(got["messages"])
    # the first body is decoded whole; the second, which repeats it, is located message by message
    assert type(seen[0]) is list and type(seen[1]) is list
    assert type(seen[2]) is Kept and seen[2].source is seen[1] and seen[2].kept == len(seen[1])
    assert seen[3].source is seen[2] and all(a is b for a, b in zip(seen[3], seen[2]))  # the same objects
    # a branch from an earlier message keeps the messages before it
    branch = check(g, json.dumps({"messages": msgs[:3] + [{"role": "user", "content": "other"}], "model": "m"}).encode())
    assert type(branch["messages"]) is Kept and branch["messages"].kept == 3
    assert branch["messages"][2] is seen[3][2]


@pytest.mark.parametrize("tail, why", [
    (b',{"role":"user","content":"a"}], "messages": [1]}', "a later duplicate key wins"),
    (b',{"role":"user","content":"a"]}', "malformed"),
    (b',{"role":"user","content":"\\ud800"}]}', "a lone surrogate"),
    (b',{"role":"user","content":' + b"[" * 80 + b"]" * 80 + b"}]}", "too deep"),
    (b',{"role":"user","content":"a"}],"x":NaN}', "not JSON"),
    (b"]}" + b" " * 10, "nothing new"),
    (b',{"role":"user","content":"\xff"}]}', "not UTF-8"),
])
def test_what_follows_the_held_messages_decodes_or_fails_as_the_whole_body(tail, why):
    g = GrowingBody()
    head = b'{"model":"m","messages":[{"role":"system","content":"' + PAD.encode() + b'"},{"role":"user","content":"q"}'
    check(g, head + b"]}")
    check(g, head + b',{"role":"assistant","content":"r"}]}')  # now held, with its offsets
    check(g, head + b',{"role":"assistant","content":"r"}' + tail)


def test_small_bodies_and_bodies_that_are_not_conversations_decode_as_before():
    g = GrowingBody()
    for raw in (b'{"messages":[]}', b"[1,2]", b'"x"', b'{"messages":"text"}', b'{"messages":[' + b'"' + PAD.encode()
                + b'"]}', b'{"messages":[{"a":"' + PAD.encode() + b'"}]}', b'{"messages":[{"a":"' + PAD.encode()
                + b'"},1]}', b'{"messages":[{"a":"' + PAD.encode() + b'"},1,[2]]}'):
        check(g, raw)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies=rollouts())
def test_the_chain_of_kept_messages_is_the_chain_of_their_bytes(bodies):
    """`RolloutIndex.chain` over what `GrowingBody` decoded equals the chain hashed from scratch,
    request after request (the kept prefix reused from the previous request, not re-read)."""
    g = GrowingBody()
    index = RolloutIndex()
    h0 = chain_start(None, None)
    for raw in bodies:
        msgs = g.load(raw, 64)["messages"]
        try:
            got = index.chain(msgs, h0)
        except BadRequest:
            continue  # a generated message the gateway refuses: refused either way
        assert got == chain_hashes(msgs, h0)
