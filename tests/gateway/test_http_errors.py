"""Every refusal of the gateway over real HTTP: the right status, OpenAI's error shape, and, for
every request refused before generation, a ledger that did not change (table dumps compared).
Clients use max_retries=0: the SDK would otherwise retry 429/5xx on its own."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from fixtures_http import TestEngine, dump_ledger, scripted_engine
from rowgrove.errors import EngineError
from rowgrove.gateway.testing import GatewayError, start_gateway

LIMIT = 100_000
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("err") / "ledger.db",
                       max_body_bytes=LIMIT) as handle:
        handle.test_engine = engine
        yield handle


@pytest.fixture
def ro(gw):
    """A rollout with one completed call, so that "unchanged" covers existing calls too."""
    r = gw.create_rollout("g-err")
    OpenAI(base_url=r["base_url"], api_key=r["api_key"], max_retries=0).chat.completions.create(
        model="m", messages=USER)
    return r


def _client(ro, key=None) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=key or ro["api_key"], max_retries=0)


def _error_shape(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def _refused(gw, exc_type, status, fn):
    """Run `fn`, expect the SDK error `exc_type` with `status`, and an unchanged ledger."""
    before = dump_ledger(gw.ledger_path)
    with pytest.raises(exc_type) as info:
        fn()
    assert info.value.status_code == status
    err = _error_shape(info.value.response)
    assert dump_ledger(gw.ledger_path) == before
    return err


BAD_BODIES = [
    pytest.param(dict(messages=[{"role": "wizard", "content": "x"}]), "messages", id="unknown-role"),
    pytest.param(dict(messages=USER, n=2), "n", id="n>1"),
    pytest.param(dict(messages=USER, temperature="hot"), "temperature", id="temperature-type"),
    pytest.param(dict(messages=USER, max_tokens=0), "max_tokens", id="max_tokens-0"),
    pytest.param(dict(messages=USER, stop=[1, 2]), "stop", id="stop-type"),
    pytest.param(dict(messages=USER, top_logprobs=3), "top_logprobs", id="top_logprobs-without-logprobs"),
    pytest.param(dict(messages=[{"role": "user", "content": 5}]), "messages", id="content-type"),
    pytest.param(dict(messages=[]), "messages", id="no-messages"),
    pytest.param(dict(messages=USER + [{"role": "tool", "tool_call_id": "call_nope", "content": "42"}]),
                 "messages", id="tool-message-answers-nothing"),
    pytest.param(dict(messages=USER, tools=[{"type": "function", "function": {}}]), "tools", id="tool-no-name"),
    pytest.param(dict(messages=USER, extra_body={"script": 7}), "script", id="script-type"),
    pytest.param(dict(messages=USER, extra_body={"chat_template_kwargs": {"tokenize": True}}),
                 "chat_template_kwargs", id="reserved-template-kwarg"),
]


@pytest.mark.parametrize(("kwargs", "param"), BAD_BODIES)
def test_bad_requests_are_400_and_change_nothing(gw, ro, kwargs, param):
    err = _refused(gw, openai.BadRequestError, 400,
                   lambda: _client(ro).chat.completions.create(model="m", **kwargs))
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"just a string"', b""])
def test_malformed_json_is_400(gw, ro, raw):
    before = dump_ledger(gw.ledger_path)
    r = httpx.post(ro["base_url"] + "/chat/completions", content=raw,
                   headers={"authorization": f"Bearer {ro['api_key']}", "content-type": "application/json"})
    assert r.status_code == 400
    _error_shape(r)
    assert dump_ledger(gw.ledger_path) == before


def test_wrong_key_is_401(gw, ro):
    other = gw.create_rollout("g-other")
    err = _refused(gw, openai.AuthenticationError, 401,
                   lambda: _client(ro, key=other["api_key"]).chat.completions.create(model="m", messages=USER))
    assert err["type"] == "authentication_error"
    _refused(gw, openai.AuthenticationError, 401,
             lambda: _client(ro, key="rk_wrong").chat.completions.create(model="m", messages=USER))


def test_unknown_rollout_is_404(gw, ro):
    fake = dict(ro, base_url=ro["base_url"].replace(ro["rollout_id"], "ro_doesnotexist"))
    _refused(gw, openai.NotFoundError, 404,
             lambda: _client(fake).chat.completions.create(model="m", messages=USER))
    with pytest.raises(GatewayError) as info:
        gw.lineage("ro_doesnotexist")
    assert info.value.status == 404
    r = httpx.get(gw.url + "/no/such/route")
    assert r.status_code == 404
    _error_shape(r)


def test_finished_rollout_refuses_calls_and_a_second_finish(gw, ro):
    gw.finish(ro["rollout_id"], messages=USER + [{"role": "assistant", "content": "reply 1"}], reward=1.0)
    err = _refused(gw, openai.ConflictError, 409,
                   lambda: _client(ro).chat.completions.create(model="m", messages=USER))
    assert ro["rollout_id"] in err["message"]
    before = dump_ledger(gw.ledger_path)
    with pytest.raises(GatewayError) as info:
        gw.finish(ro["rollout_id"], messages=USER, reward=0.0)
    assert info.value.status == 409
    assert dump_ledger(gw.ledger_path) == before


@pytest.mark.parametrize("body", [
    pytest.param({"reward": 1.0}, id="neither"),
    pytest.param({"messages": USER, "conversations": [USER], "reward": 1.0}, id="both"),
    pytest.param({"messages": USER, "reward": "high"}, id="reward-string"),
    pytest.param({"messages": USER, "reward": True}, id="reward-bool"),
    pytest.param({"messages": USER}, id="reward-missing"),
    pytest.param({"messages": USER, "reward": 1.0, "valid": "yes"}, id="valid-type"),
    pytest.param({"conversations": USER, "reward": 1.0}, id="conversations-not-nested"),
    pytest.param({"messages": [{"role": "ghost", "content": "x"}], "reward": 1.0}, id="bad-role"),
])
def test_finish_with_a_bad_shape_is_400(gw, ro, body):
    before = dump_ledger(gw.ledger_path)
    r = httpx.post(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish", json=body)
    assert r.status_code == 400, r.text
    _error_shape(r)
    assert dump_ledger(gw.ledger_path) == before


def test_create_rollout_needs_a_group_id(gw):
    before = dump_ledger(gw.ledger_path)
    for body in ({}, {"group_id": ""}, {"group_id": 3}, {"group_id": "g", "metadata": [1]}):
        r = httpx.post(gw.url + "/v1/rollouts", json=body)
        assert r.status_code == 400, body
        _error_shape(r)
    assert dump_ledger(gw.ledger_path) == before


def test_body_over_the_limit_is_413(gw, ro):
    big = [{"role": "user", "content": "x" * (LIMIT + 10)}]
    err = _refused(gw, openai.APIStatusError, 413,
                   lambda: _client(ro).chat.completions.create(model="m", messages=big))
    assert err["code"] == "request_too_large"

    def chunks():  # no Content-Length: the cap applies while reading
        for _ in range(20):
            yield b" " * 10_000

    before = dump_ledger(gw.ledger_path)
    r = httpx.post(ro["base_url"] + "/chat/completions", content=chunks(),
                   headers={"authorization": f"Bearer {ro['api_key']}"})
    assert r.status_code == 413
    _error_shape(r)
    assert dump_ledger(gw.ledger_path) == before


def test_engine_failure_is_502_and_recorded_failed(gw, ro):
    gw.test_engine.fail = EngineError("the GPU caught fire")
    try:
        with pytest.raises(openai.InternalServerError) as info:
            _client(ro).chat.completions.create(model="m", messages=[{"role": "user", "content": "fail"}])
    finally:
        gw.test_engine.reset()
    assert info.value.status_code == 502
    assert _error_shape(info.value.response)["code"] == "engine_failed"
    last = gw.ledger.calls(ro["rollout_id"])[-1]
    assert last.status == "failed" and "caught fire" in last.error
    gw.test_engine.fail = RuntimeError("unexpected")
    try:
        with pytest.raises(openai.InternalServerError) as info:
            _client(ro).chat.completions.create(model="m", messages=[{"role": "user", "content": "fail 2"}])
    finally:
        gw.test_engine.reset()
    assert info.value.status_code == 502
    assert gw.ledger.calls(ro["rollout_id"])[-1].status == "failed"
    assert gw.gateway.in_flight == 0


def test_shutting_down_is_503_with_retry_after(gw, ro):
    gw.gateway.closing = True
    try:
        before = dump_ledger(gw.ledger_path)
        with pytest.raises(openai.InternalServerError) as info:
            _client(ro).chat.completions.create(model="m", messages=USER)
        assert httpx.get(gw.url + "/health").status_code == 503
    finally:
        gw.gateway.closing = False
    assert info.value.status_code == 503
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert dump_ledger(gw.ledger_path) == before


def test_engine_timeout_is_504_and_recorded_failed(tmp_path):
    engine = TestEngine(scripted_engine("tiny"))
    engine.delay = 5.0
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", engine_timeout=0.2) as gw:
        ro = gw.create_rollout("g-timeout")
        with pytest.raises(openai.APIStatusError) as info:
            _client(ro).chat.completions.create(model="m", messages=USER)
        assert info.value.status_code == 504
        assert _error_shape(info.value.response)["code"] == "engine_timeout"
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed" and "timed out" in call.error
        assert engine.cancelled == 1


def test_full_queue_is_429_with_retry_after_and_changes_nothing(tmp_path):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", max_queue=1) as gw:
        ro = gw.create_rollout("g-queue")

        async def run():
            client = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            engine.delay = 0.5
            first = asyncio.ensure_future(client.chat.completions.create(model="m", messages=USER))
            await asyncio.sleep(0.15)
            before = dump_ledger(gw.ledger_path)
            try:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2"}])
            except openai.RateLimitError as e:
                refused = e
            after = dump_ledger(gw.ledger_path)
            done = await first
            await client.close()
            return refused, before, after, done

        refused, before, after, done = asyncio.run(run())
        assert refused.status_code == 429
        assert int(refused.response.headers["retry-after"]) >= 1
        assert _error_shape(refused.response)["code"] == "queue_full"
        assert before == after
        assert [c.id for c in gw.ledger.calls(ro["rollout_id"])] == [done.id]


def test_admin_key_guards_control_routes(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db",
                       admin_key="adm-secret") as gw:
        ro = gw.create_rollout("g-admin")  # the handle sends the admin key
        other = gw.create_rollout("g-admin-2")
        rid = ro["rollout_id"]
        assert httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}).status_code == 401
        assert httpx.get(f"{gw.url}/v1/rollouts/{rid}").status_code == 401
        own = {"authorization": f"Bearer {ro['api_key']}"}
        assert httpx.get(f"{gw.url}/v1/rollouts/{rid}", headers=own).status_code == 200
        assert httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g"}, headers=own).status_code == 401
        theirs = {"authorization": f"Bearer {other['api_key']}"}
        before = dump_ledger(gw.ledger_path)
        r = httpx.post(f"{gw.url}/v1/rollouts/{rid}/finish", json={"messages": USER, "reward": 1}, headers=theirs)
        assert r.status_code == 401
        _error_shape(r)
        assert dump_ledger(gw.ledger_path) == before
        r = httpx.post(f"{gw.url}/v1/rollouts/{rid}/finish", json={"messages": USER, "reward": 1}, headers=own)
        assert r.status_code == 200 and r.json()["status"] == "finished"
