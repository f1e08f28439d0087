"""A rollout's key alone identifies it at the gateway's plain base URL `http://HOST:PORT/v1`
(`Authorization: Bearer KEY` or `x-api-key: KEY`), for the Chat Completions, Responses, Messages
and count_tokens routes, through the official `openai` and `anthropic` SDKs; the per-rollout path
keeps working, and a key no rollout has is a 401 in one sentence saying what to send."""

from __future__ import annotations

import sys
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_http import assert_continuation  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.ledger import Ledger  # noqa: E402


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with start_gateway("tiny", engine="scripted", ledger=tmp_path_factory.mktemp("plain") / "ledger.db") as handle:
        yield handle


def test_the_key_alone_routes_each_dialect_to_its_rollout(gw):
    a, b = gw.create_rollout("g"), gw.create_rollout("g")
    plain = gw.url + "/v1"
    chat = openai.OpenAI(base_url=plain, api_key=a["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    r1 = chat.chat.completions.create(model="m", messages=msgs, extra_body={"script": "hello"})
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "more"}]
    # the same conversation through the per-rollout path continues the call made at the plain URL
    per = openai.OpenAI(base_url=a["base_url"], api_key=a["api_key"], max_retries=0)
    per.chat.completions.create(model="m", messages=msgs, extra_body={"script": "ok"})
    c1, c2 = gw.ledger.calls(a["rollout_id"])
    assert_continuation(gw.ledger, c2, c1)

    resp = openai.OpenAI(base_url=plain, api_key=b["api_key"], max_retries=0)
    assert resp.responses.create(model="m", input="hi", extra_body={"script": "r"}).output_text == "r"
    ant = anthropic.Anthropic(base_url=gw.url, api_key=b["api_key"], max_retries=0)
    m = ant.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hey"}],
                            extra_body={"script": "m"})
    assert m.content[0].text == "m"
    n = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hey"}]).input_tokens
    assert n == gw.ledger.calls(b["rollout_id"])[1].prompt_len
    assert len(gw.ledger.calls(b["rollout_id"])) == 2 and len(gw.ledger.calls(a["rollout_id"])) == 2
    # Bearer on the Messages route works too
    r = httpx.post(plain + "/messages", headers={"authorization": f"Bearer {b['api_key']}"},
                   json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "script": "y"})
    assert r.status_code == 200, r.text


def test_a_key_no_rollout_has_is_401_in_one_sentence(gw):
    plain = gw.url + "/v1"
    for path in ("/chat/completions", "/responses", "/messages", "/messages/count_tokens"):
        for headers in ({"authorization": "Bearer rk_nope"}, {"x-api-key": "rk_nope"}, {}):
            r = httpx.post(plain + path, headers=headers, json={"model": "m"})
            assert r.status_code == 401, (path, headers, r.text)
            body = r.json()
            message = body["error"]["message"]
            assert "api_key POST /v1/rollouts returned" in message and message.count(". ") == 0
            if path.startswith("/messages"):
                assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=plain, api_key="rk_nope", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key="rk_nope", max_retries=0).messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])


def test_a_key_is_found_after_a_restart(tmp_path):
    db = tmp_path / "ledger.db"
    with start_gateway("tiny", engine="scripted", ledger=db) as gw:
        ro = gw.create_rollout("g")
    with start_gateway("tiny", engine="scripted", ledger=db) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=ro["api_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"script": "x"})
        assert len(gw.ledger.calls(ro["rollout_id"])) == 1
    ledger = Ledger(db)
    try:
        assert ledger.rollout_by_key(ro["api_key"]).id == ro["rollout_id"]
        assert ledger.rollout_by_key("rk_nope") is None
    finally:
        ledger.close()
