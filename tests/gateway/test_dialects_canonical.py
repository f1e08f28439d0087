"""The promise under the dialects, as properties: a conversation the gateway served, re-sent in
the Responses API's items or the Messages API's messages (the assistant turns exactly as the
gateway answered them in that dialect), translates back to the same chat conversation: the same
chain hashes (so the same parent is found) and the same messages handed to the template (so the
same tokens). And any JSON body on either route is answered with a BadRequest or a request,
never another exception."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest
from rowgrove.gateway.dialects import anthropic_api, responses_api
from rowgrove.gateway.dialects.openai_format import completion_body
from rowgrove.gateway.core.preprocess import engine_messages
from rowgrove.hashing import chain_hashes, chain_start

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
args = st.dictionaries(st.sampled_from(["city", "n", "q"]), st.one_of(st.integers(), text), max_size=2)


@st.composite
def conversations(draw) -> list[dict]:
    """System + user, then turns: an assistant reply as the gateway returns it (text, tool calls
    with arguments as JSON strings, reasoning; any of them may be absent), the tool results for its
    calls, and sometimes a user message."""
    msgs: list[dict] = [{"role": "system", "content": draw(text)}, {"role": "user", "content": draw(text)}]
    for t in range(draw(st.integers(1, 4))):
        calls = [{"id": f"call_{t}_{k}", "type": "function",
                  "function": {"name": draw(st.sampled_from(["get_weather", "search"])),
                               "arguments": json.dumps(draw(args))}}
                 for k in range(draw(st.integers(0, 2)))]
        content = draw(st.one_of(st.just(""), text))
        msg: dict = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            msg["tool_calls"] = calls
        reasoning = draw(st.one_of(st.none(), text.filter(bool)))
        if reasoning:
            msg["reasoning_content"] = reasoning
        msgs.append(msg)
        msgs += [{"role": "tool", "tool_call_id": c["id"], "content": draw(text)} for c in calls]
        if not calls or draw(st.booleans()):
            msgs.append({"role": "user", "content": draw(text)})
    return msgs


def _served(k: int, message: dict) -> dict:
    """The gateway's chat.completion for an assistant message."""
    return completion_body(call_id=f"chatcmpl-{k}", created=0, model="m", message=message,
                           finish_reason="tool_calls" if message.get("tool_calls") else "stop",
                           prompt_tokens=1, completion_tokens=1, logprobs=None)


def as_responses_items(chat: list[dict]) -> tuple[str, list[dict]]:
    items: list[dict] = []
    for k, m in enumerate(chat[1:]):
        if m["role"] == "assistant":
            items += responses_api._output(f"chatcmpl-{k}", m, None, "completed")
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return chat[0]["content"], items


def as_anthropic_messages(chat: list[dict]) -> tuple[str, list[dict]]:
    out: list[dict] = []
    for k, m in enumerate(chat[1:]):
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": anthropic_api.message_body(_served(k, m))["content"]})
            continue
        block = ({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
                 if m["role"] == "tool" else {"type": "text", "text": m["content"]})
        if out and out[-1]["role"] == "user":
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return chat[0]["content"], out


def _same(chat: list[dict], back: list[dict]) -> None:
    h0 = chain_start()
    assert chain_hashes(back, h0) == chain_hashes(chat, h0)
    for fmt in ("string", "openai"):
        assert engine_messages(back, fmt) == engine_messages(chat, fmt)


@settings(max_examples=80, deadline=None)
@given(conversations())
def test_responses_items_translate_to_the_same_conversation(chat):
    instructions, items = as_responses_items(chat)
    call = responses_api.parse_responses_request({"instructions": instructions, "input": items},
                                                 default_max_tokens=8)
    expected = chat if instructions else chat[1:]   # empty instructions add no system message
    _same(expected, call.chat.messages)
    # the same items through finish, with the system message as an item
    _same(chat, responses_api.finish_messages([{"role": "system", "content": instructions}, *items]))


@settings(max_examples=80, deadline=None)
@given(conversations())
def test_anthropic_messages_translate_to_the_same_conversation(chat):
    system, messages = as_anthropic_messages(chat)
    _, req = anthropic_api.parse_messages_request({"model": "m", "max_tokens": 8, "system": system,
                                                   "messages": messages}, default_max_tokens=8)
    expected = chat if system else chat[1:]   # an empty system adds no system message
    _same(expected, req.messages)
    _same(expected, anthropic_api.finish_messages([{"role": "system", "content": system}, *messages]))


def _edited(items: list[dict], k: int) -> list[dict]:
    """`items` with item k changed as a compaction would change it (its text extended), or, where
    it has no text, with a key added that changes its JSON but not its meaning."""
    out = json.loads(json.dumps(items))
    item = out[k]
    for key in ("content", "output", "arguments", "text"):
        if isinstance(item.get(key), str):
            item[key] = item[key] + " (edited)"
            return out
    item["note"] = True
    return out


def _same_warm_and_cold(parse, requests: list) -> None:
    """Each request parsed with the rollout's memo (its snapshot and checked items) gives what the
    cold path gives, or the same refusal."""
    memo: dict = {}
    for body in requests:
        try:
            cold = parse(body, None)
        except BadRequest as e:   # e.g. a prefix that cuts between a call and its output
            try:
                parse(body, memo)
            except BadRequest as again:
                assert str(again) == str(e)
            else:
                raise AssertionError("the memo accepted what the cold path refuses")
            continue
        assert parse(body, memo) == cold


@settings(max_examples=80, deadline=None)
@given(conversations(), st.data())
def test_the_rollouts_memo_changes_no_translation(chat, data):
    """Growing requests (each repeating the last), then one with an earlier item edited and one cut
    back: the memo and snapshot give the cold path's translation every time."""
    instructions, items = as_responses_items(chat)
    k = data.draw(st.integers(0, len(items) - 1))
    grown = [items[:n] for n in range(1, len(items) + 1)]
    _same_warm_and_cold(
        lambda b, memo: responses_api.parse_responses_request(b, default_max_tokens=8, memo=memo).chat.messages,
        [{"instructions": instructions, "input": x} for x in [*grown, _edited(items, k), items[:k + 1], items]])
    system, messages = as_anthropic_messages(chat)
    j = data.draw(st.integers(0, len(messages) - 1))
    grown = [messages[:n] for n in range(1, len(messages) + 1)]
    _same_warm_and_cold(
        lambda b, memo: anthropic_api.parse_messages_request(b, default_max_tokens=8, memo=memo)[1].messages,
        [{"model": "m", "max_tokens": 8, "system": system, "messages": x}
         for x in [*grown, _edited(messages, j), messages[:j + 1], messages]])


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
                           max_leaves=12)
responses_keys = st.sampled_from(["input", "instructions", "tools", "tool_choice", "max_output_tokens",
                                  "temperature", "top_p", "stream", "store", "previous_response_id", "include"])
anthropic_keys = st.sampled_from(["model", "max_tokens", "messages", "system", "tools", "tool_choice",
                                  "stop_sequences", "stream", "temperature", "top_p"])
item_like = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output",
                                                            "reasoning", "web_search_call"])},
                                  optional={"role": st.sampled_from(["user", "assistant", "tool"]),
                                            "content": json_values, "call_id": json_values, "name": json_values,
                                            "arguments": json_values, "output": json_values})


def _never_crashes(parse, body) -> None:
    try:
        parse(body)
    except BadRequest as e:
        assert str(e)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(responses_keys, json_values | st.lists(item_like, max_size=3), max_size=5))
def test_any_json_on_the_responses_route_is_a_request_or_a_bad_request(body):
    _never_crashes(lambda b: responses_api.parse_responses_request(
        b, default_max_tokens=8, previous=lambda rid: [],  memo={}), body)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(anthropic_keys, json_values, max_size=5))
def test_any_json_on_the_messages_route_is_a_request_or_a_bad_request(body):
    _never_crashes(lambda b: anthropic_api.parse_messages_request(b, default_max_tokens=8, memo={}), body)
