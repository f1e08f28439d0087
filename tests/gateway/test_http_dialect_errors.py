"""Bad input on each dialect's route, over real loopback HTTP with the official SDKs: every refusal
comes back in that dialect's own error shape (OpenAI's `{"error": {message, type, param, code}}`
on the Chat and Responses routes, Anthropic's `{"type": "error", "error": {type, message}}` on the
Messages route), with the status the SDK maps to its exception, and the ledger unchanged."""

from __future__ import annotations

import anthropic
import openai
import pytest
from openai import OpenAI

from fixtures_http import TestEngine, dump_ledger, scripted_engine
from rowgrove.gateway.testing import start_gateway

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")),
                       ledger=tmp_path_factory.mktemp("dialect-errors") / "ledger.db") as handle:
        yield handle


@pytest.fixture
def ro(gw):
    return gw.create_rollout("g-errors")


def _openai(ro, key=None) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=key or ro["api_key"], max_retries=0)


def _anthropic(ro, key=None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=key or ro["api_key"],
                               max_retries=0)


BAD_RESPONSES = [
    pytest.param(dict(input=5), "input", id="input-type"),
    pytest.param(dict(input=[{"type": "web_search_call", "id": "x"}]), "input", id="unsupported-item"),
    pytest.param(dict(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input",
                 id="function-call-without-call-id"),
    pytest.param(dict(input=[*USER, {"type": "function_call_output", "call_id": "call_nope", "output": "1"}]),
                 "input", id="output-answers-nothing"),
    pytest.param(dict(input=[{"role": "wizard", "content": "x"}]), "input", id="unknown-role"),
    pytest.param(dict(input="hi", tools=[{"type": "not_a_tool"}]), "tools", id="non-function-tool"),
    pytest.param(dict(input="hi", tools=[{"type": "function"}]), "tools", id="tool-without-name"),
    pytest.param(dict(input="hi", max_output_tokens=0), "max_output_tokens", id="max-output-tokens-0"),
    pytest.param(dict(input="hi", temperature="hot"), "temperature", id="temperature-type"),
    pytest.param(dict(input="hi", top_p=0), "top_p", id="top-p-0"),
    pytest.param(dict(input="hi", tool_choice="sometimes"), "tool_choice", id="tool-choice"),
    pytest.param(dict(input="hi", previous_response_id="resp_nope"), "previous_response_id", id="unknown-previous"),
    pytest.param(dict(input="hi", extra_body={"script": 7}), "script", id="script-type"),
]


@pytest.mark.parametrize(("kwargs", "param"), BAD_RESPONSES)
def test_bad_responses_requests_get_openai_errors_and_change_nothing(gw, ro, kwargs, param):
    before = dump_ledger(gw.ledger_path)
    with pytest.raises(openai.BadRequestError) as info:
        _openai(ro).responses.create(model="m", **kwargs)
    err = info.value.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["message"]
    assert "; or" not in err["message"] and "; " not in err["message"]  # one field, one sentence
    assert dump_ledger(gw.ledger_path) == before


BAD_MESSAGES = [
    pytest.param(dict(max_tokens=0, messages=USER), "max_tokens", id="max-tokens-0"),
    pytest.param(dict(max_tokens=8, messages=[]), "messages", id="no-messages"),
    pytest.param(dict(max_tokens=8, messages=[{"role": "tool", "content": "x"}]), "messages", id="unknown-role"),
    pytest.param(dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "tool_result",
                                                                           "tool_use_id": "toolu_x"}]}]),
                 "messages", id="tool-result-answers-nothing"),
    pytest.param(dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t",
                                                                           "name": "f", "input": {}}]}]),
                 "messages", id="tool-use-in-user-turn"),
    pytest.param(dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "document"}]}]),
                 "messages", id="unknown-block"),
    # anthropic 2.10's create() has no temperature argument; older SDKs and raw clients send it
    pytest.param(dict(max_tokens=8, messages=USER, extra_body={"temperature": 1.5}), "temperature",
                 id="temperature-over-1"),
    pytest.param(dict(max_tokens=8, messages=USER, stop_sequences="END"), "stop_sequences", id="stop-type"),
    pytest.param(dict(max_tokens=8, messages=USER, tools=[{"name": "f"}]), "tools", id="tool-without-schema"),
    pytest.param(dict(max_tokens=8, messages=USER, tool_choice={"type": "tool"}), "tool_choice",
                 id="tool-choice-without-name"),
    pytest.param(dict(max_tokens=8, messages=USER, system=3), "system", id="system-type"),
]


@pytest.mark.parametrize(("kwargs", "param"), BAD_MESSAGES)
def test_bad_messages_requests_get_anthropic_errors_and_change_nothing(gw, ro, kwargs, param):
    before = dump_ledger(gw.ledger_path)
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(ro).messages.create(model="m", **kwargs)
    body = info.value.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request_error"
    assert param in body["error"]["message"]
    assert "; or" not in body["error"]["message"] and "; " not in body["error"]["message"]
    assert dump_ledger(gw.ledger_path) == before


ONE_FIELD = [  # (a bad body, the one sentence said): a union's branch the value meant, not every branch
    (dict(input=5), "'input': Input should be a valid string or a valid list (got 5)"),
    (dict(input=[{"role": "user", "content": 5}]),
     "'input[0].message.content': Input should be a valid string or a valid list (got 5)"),
    (dict(input="hi", tool_choice={"type": "function"}), "'tool_choice.name': Field required"),
    (dict(input="hi", tool_choice="sometimes"),
     "'tool_choice': Input should be 'none', 'auto' or 'required' (got 'sometimes')"),
    (dict(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
     "'input[0].function_call.call_id': Field required"),
]


@pytest.mark.parametrize(("kwargs", "message"), ONE_FIELD)
def test_a_refusal_names_the_one_field_the_value_meant(gw, ro, kwargs, message):
    with pytest.raises(openai.BadRequestError) as info:
        _openai(ro).responses.create(model="m", **kwargs)
    assert info.value.response.json()["error"]["message"] == message


def test_a_messages_refusal_names_the_one_field(gw, ro):
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(ro).messages.create(model="m", max_tokens=8, messages=USER, system=3)
    assert info.value.response.json()["error"]["message"] == "'system': Input should be a valid string or a valid list (got 3)"
    with pytest.raises(anthropic.BadRequestError) as info:
        _anthropic(ro).messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": 3}])
    assert info.value.response.json()["error"]["message"] == (
        "'messages[0].content': Input should be a valid string or a valid list (got 3)")


def test_messages_route_errors_of_every_kind_are_anthropic_shaped(gw, ro):
    before = dump_ledger(gw.ledger_path)
    other = gw.create_rollout("g-errors")
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _anthropic(ro, key=other["api_key"]).messages.create(model="m", max_tokens=8, messages=USER)
    assert auth.value.response.json()["error"]["type"] == "authentication_error"
    fake = dict(ro, base_url=ro["base_url"].replace(ro["rollout_id"], "ro_nope"))
    with pytest.raises(anthropic.NotFoundError) as missing:
        _anthropic(fake).messages.create(model="m", max_tokens=8, messages=USER)
    assert missing.value.response.json()["error"]["type"] == "not_found_error"
    base = ro["base_url"].removesuffix("/v1")
    for raw in (b"{not json", b"[1, 2]"):
        r = gw._http.post(f"{base}/v1/messages", content=raw, headers={"x-api-key": ro["api_key"]})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
    r = gw._http.get(f"{base}/v1/messages", headers={"x-api-key": ro["api_key"]})
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text
    # the bearer form of the key is accepted too; a finished rollout is a conflict
    gw.finish(other["rollout_id"], messages=USER, reward=0.0)
    with pytest.raises(anthropic.APIStatusError) as done:
        anthropic.Anthropic(base_url=other["base_url"].removesuffix("/v1"), auth_token=other["api_key"],
                            max_retries=0).messages.create(model="m", max_tokens=8, messages=USER)
    assert done.value.status_code == 409 and done.value.response.json()["error"]["type"] == "conflict_error"
    assert dump_ledger(gw.ledger_path)[1] == before[1]


def test_engine_failure_on_the_messages_route_is_an_anthropic_api_error(gw, ro):
    engine = gw.engine
    engine.fail = RuntimeError("boom")
    try:
        with pytest.raises(anthropic.APIStatusError) as info:
            _anthropic(ro).messages.create(model="m", max_tokens=8, messages=USER)
    finally:
        engine.reset()
    assert info.value.status_code == 502
    assert info.value.response.json()["error"]["type"] == "api_error"
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "failed"


def test_openai_routes_keep_openai_errors(gw, ro):
    with pytest.raises(openai.AuthenticationError) as info:
        _openai(ro, key="rk_wrong").responses.create(model="m", input="hi")
    assert info.value.response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as bad:
        _openai(ro).chat.completions.create(model="m", messages=USER, stop=[1, 2])
    assert bad.value.response.json()["error"]["param"] == "stop"
