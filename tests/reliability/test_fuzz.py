"""Fuzzing a real gateway (scripted engine, real HTTP): random JSON-ish bodies and mutations of
valid ones on every route that reads a body. Whatever arrives: no 5xx, every error in OpenAI's
shape, and the ledger's call count grows only when a chat completion answered 200 (by exactly
one call), its rollout count only when a create answered 201."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.gateway.testing import start_gateway

EXAMPLES = 500  # per test: about 2,100 requests in all (bench_reliability sends 10,000)
GENERATING = 100  # bodies that reach the engine cost a generation each

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with start_gateway("tiny", engine="scripted", ledger=tmp_path_factory.mktemp("fuzz") / "ledger.db",
                       max_body_bytes=200_000) as handle:
        handle.http = httpx.Client(timeout=30)
        handle.chat_ro = handle.create_rollout("g-fuzz")
        yield handle
        handle.http.close()


def _counts(gw) -> tuple[int, int]:
    db = sqlite3.connect(f"file:{gw.ledger_path}?mode=ro", uri=True)
    try:
        return (db.execute("SELECT COUNT(*) FROM calls").fetchone()[0],
                db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0])
    finally:
        db.close()


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"}, body
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"]


# -- strategies ----------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
KEYS = ["messages", "model", "stream", "stream_options", "tools", "tool_choice", "logprobs", "top_logprobs",
        "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n", "script",
        "chat_template_kwargs", "group_id", "metadata", "reward", "valid", "conversations",
        "accepted_call_ids", "version", "path"]
ROLES = ["system", "developer", "user", "assistant", "tool", "wizard", ""]
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10) | json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_image"]),
                           "image_url": st.fixed_dictionaries({"url": st.sampled_from(
                               ["data:image/png;base64,abcde", "data:image/png;base64,aGk=", "data:,x",
                                "https://x/y.png", ""]) | json_values})}),
    st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": json_values}),
    st.dictionaries(st.sampled_from(["type", "text", "image_url"]), json_values, max_size=3),
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES)},
        optional={
            "content": st.text(max_size=30) | st.lists(parts, max_size=3) | json_values,
            "tool_calls": st.lists(st.fixed_dictionaries(
                {"id": st.text(max_size=6) | json_values,
                 "function": st.fixed_dictionaries({"name": st.text(max_size=6) | json_values,
                                                    "arguments": st.sampled_from(["{}", '{"a": 1}', "{", ""]) | json_values})}),
                max_size=2) | json_values,
            "tool_call_id": st.text(max_size=6) | json_values,
            "name": st.text(max_size=6) | json_values,
            "reasoning_content": st.text(max_size=10) | json_values,
        }),
    max_size=4,
) | json_values
chatish = st.fixed_dictionaries(
    {"messages": messages},
    optional={k: json_values for k in KEYS if k != "messages"}
    | {"stream": st.booleans(), "max_tokens": st.integers(-2, 40), "logprobs": st.booleans(),
       "top_logprobs": st.integers(-1, 25), "script": st.text(max_size=40),
       "chat_template_kwargs": st.dictionaries(st.sampled_from(
           ["enable_thinking", "eos_token", "raise_exception", "pad_token", "x"]), json_values, max_size=2),
       "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=2)},
)
# mostly valid requests with arbitrary values where any value is allowed: they reach the engine,
# the output parsers and the stream writer (a reply with special tokens, tool-call syntax, think tags)
SCRIPTS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
                     "<tool_call>{not json</tool_call>", "<think>hmm</think>answer", "<think>unclosed",
                     "<|im_end|>", "<|im_start|>user\nfake", "\ud7ff\u0000\x7f", "a" * 300]),
)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                       "properties": {"a": {"type": "integer"}}}}}]
plausible_chat = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]),
                                                 "content": st.text(max_size=30)}), min_size=1, max_size=3)},
    optional={"script": SCRIPTS, "stream": st.booleans(), "max_tokens": st.integers(1, 30),
              "logprobs": st.just(True), "top_logprobs": st.integers(0, 20), "seed": st.integers(-(2**63), 2**64),
              "stop": st.lists(st.text(min_size=1, max_size=3), max_size=3), "temperature": st.floats(0, 2),
              "tools": st.just(TOOLS), "tool_choice": st.sampled_from(["auto", "none", "required"]),
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
              "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), scalars, max_size=2),
              "model": st.text(max_size=10), "user": json_values, "metadata": json_values},
)
VALID_CHAT = {"messages": USER, "max_tokens": 8, "temperature": 0.5, "logprobs": True, "top_logprobs": 2,
              "stop": ["\n"], "stream": False}


def _enc(value: Any) -> bytes:
    """JSON bytes of any generated value (the stdlib writes integers beyond 64 bits; orjson won't)."""
    return json.dumps(value).encode()


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(body: Any, path: tuple, new: Any, delete: bool) -> Any:
    if not path:
        return new
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = new
    return body


@st.composite
def mutated(draw, valid: Any) -> Any:
    body = valid
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        body = _mutate(body, path, draw(json_values), draw(st.booleans()))
    return body


@st.composite
def raw_mutation(draw, valid: Any) -> bytes:
    raw = bytearray(_enc(valid))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        i = draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i:]
        elif op == "insert":
            raw[i:i] = draw(st.sampled_from([b"[", b"{", b"]", b"}", b",", b'"', b"\\", b"\\u", b"\x00", b"\xff", b"1e999", b"[" * 300]))
        elif raw:
            del raw[i]
    return bytes(raw)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def _post_chat(gw, content: bytes, *, stream_ok: bool = True) -> httpx.Response:
    ro = gw.chat_ro
    return gw.http.post(ro["base_url"] + "/chat/completions", content=content,
                        headers={"authorization": f"Bearer {ro['api_key']}", "content-type": "application/json"})


def _chat_and_check(gw, content: bytes) -> None:
    calls, rollouts = _counts(gw)
    r = _post_chat(gw, content)
    _check(r)
    after_calls, after_rollouts = _counts(gw)
    assert after_rollouts == rollouts
    if r.status_code == 200:
        assert after_calls == calls + 1
    else:
        assert after_calls == calls, (r.status_code, r.text[:300])


# -- the tests -----------------------------------------------------------------------------------


@FUZZ
@given(body=chatish)
def test_fuzzed_chat_bodies(gw, body):
    _chat_and_check(gw, _enc(body))


@settings(FUZZ, max_examples=GENERATING)
@given(body=plausible_chat)
def test_plausible_chat_bodies_reach_the_engine(gw, body):
    _chat_and_check(gw, _enc(body))


@FUZZ
@given(data=st.data())
def test_mutations_of_a_valid_chat_body(gw, data):
    if data.draw(st.booleans()):
        content = data.draw(raw_mutation(VALID_CHAT))
    else:
        content = _enc(data.draw(mutated(VALID_CHAT)))
    _chat_and_check(gw, content)


@FUZZ
@given(data=st.data())
def test_fuzzed_control_bodies(gw, data):
    """create, finish (a fresh rollout each time: a 200 finishes it) and POST /v1/weights."""
    route = data.draw(st.sampled_from(["create", "finish", "weights"]))
    valid = {"create": {"group_id": "g", "metadata": {"k": 1}},
             "finish": {"messages": USER + [{"role": "assistant", "content": "reply 1"}], "reward": 1.0},
             "weights": {"version": 0}}[route]
    how = data.draw(st.sampled_from(["random", "mutated", "raw", "plausible"]))
    if how == "plausible":
        content = _enc({"create": {"group_id": data.draw(st.text(min_size=1, max_size=20)),
                                   "metadata": data.draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3))},
                        "finish": {"messages": USER + [{"role": "assistant", "content": data.draw(st.text(max_size=10))}],
                                   "reward": data.draw(st.floats(allow_nan=False, allow_infinity=False)),
                                   "valid": data.draw(st.booleans())},
                        "weights": {"version": data.draw(st.integers(-5, 2**40))}}[route])
    elif how == "random":
        content = _enc(data.draw(json_values | st.fixed_dictionaries({}, optional={k: json_values for k in KEYS})))
    elif how == "mutated":
        content = _enc(data.draw(mutated(valid)))
    else:
        content = data.draw(raw_mutation(valid))
    if route == "finish":
        ro = gw.create_rollout("g-fuzz-finish")
        url = f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish"
    else:
        url = gw.url + ("/v1/rollouts" if route == "create" else "/v1/weights")
    calls, rollouts = _counts(gw)
    r = gw.http.post(url, content=content, headers={"content-type": "application/json"})
    _check(r)
    after_calls, after_rollouts = _counts(gw)
    assert after_calls == calls
    assert after_rollouts == rollouts + (1 if route == "create" and r.status_code == 201 else 0)


@FUZZ
@given(body=chatish)
def test_fuzzed_continuations(gw, body):
    """The same fuzz on a conversation that extends a real completed call: the continuation path
    (parent lookup, the template's rendering of the whole request) sees the hostile input."""
    first = gw.chat_ro_first if hasattr(gw, "chat_ro_first") else None
    if first is None:
        r = _post_chat(gw, _enc({"messages": USER}))
        assert r.status_code == 200
        first = gw.chat_ro_first = r.json()["choices"][0]["message"]
    tail = body.get("messages")
    body = dict(body, messages=USER + [first] + (tail if isinstance(tail, list) else [tail]))
    _chat_and_check(gw, _enc(body))


def test_the_gateway_is_still_healthy_after_fuzzing(gw):
    assert gw.http.get(gw.url + "/health").json()["status"] == "ok"
    assert gw.gateway.in_flight == 0 and gw.gateway.open_uploads == 0
