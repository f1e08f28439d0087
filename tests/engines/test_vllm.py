"""The `vllm` engine against the vLLM stand-in over real loopback HTTP: the stand-in speaks vLLM's
wire format (checked here field by field), the engine reads it back token for token, and the real
gateway stores what the stand-in sampled. Failures, disconnects, the start-up check and weight
updates (also in the middle of a request) are covered in both engine modes (stream / whole body).
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from rowgrove.engines import make_engine
from rowgrove.engines.base import SamplingParams, teacher_forced_logprobs
from rowgrove.errors import BadRequest, EngineError
from rowgrove.gateway.testing import launch_gateway, start_gateway
from rowgrove.model.load import load_tokenizer, model_dir
from rowgrove.standins import launch_standin, start_standin
from standin_fixtures import (
    USER,
    as_list,
    await_for,
    closed_port_url,
    ending_weights,
    entry,
    sse_events,
    turns_that_end,
    wait_for,
)

TOK = load_tokenizer("tiny")
PROMPT = list(TOK.encode(TOK.apply_chat_template(USER, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False))
BASE = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "seed": 3, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True}
MODES = [pytest.param(True, id="stream"), pytest.param(False, id="whole")]


@pytest.fixture(scope="module")
def server():
    with start_standin("vllm", "tiny") as s:
        yield s


@pytest.fixture(autouse=True)
def _reset(server):
    server.fault(None)
    server.state.segment_delay = 0.0
    server.state.delay = 2.0
    yield
    server.fault(None)
    server.state.segment_delay = 0.0
    server.state.paused, server.state.pause_mode = False, None


@pytest.fixture(scope="module")
def engines(server):
    return {True: make_engine("vllm", "tiny", url=server.url, stream=True),
            False: make_engine("vllm", "tiny", url=server.url)}


@pytest.fixture(scope="module")
def gateways(engines, tmp_path_factory):
    handles = {mode: launch_gateway("tiny", engine=e, ledger=tmp_path_factory.mktemp(f"gw{int(mode)}") / "l.db")
               for mode, e in engines.items()}
    yield handles
    for h in handles.values():
        h.close()


@pytest.fixture(params=MODES)
def gw(request, gateways):
    return gateways[request.param]


def _client(ro, **kw) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0, **kw)


def _post(server, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=30, **kw)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["message"]
    return body["error"]


# ---- the stand-in speaks vLLM's /v1/completions ------------------------------------------------


def test_whole_body_has_vllm_shape_and_the_sampled_ids(server):
    r = _post(server, {**BASE, "logprobs": 2, "unknown_field": {"x": 1}}, headers={"X-Request-Id": "shape-1"})
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "kv_transfer_params", "ec_transfer_params", "metrics"]
    assert body["id"] == "cmpl-shape-1" and body["object"] == "text_completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                            "prompt_logprobs", "prompt_token_ids"]
    log = entry(server, "shape-1")
    ids = choice["token_ids"]
    assert ids == log["token_ids"] and len(ids) == 6 and choice["finish_reason"] == "length"
    assert choice["stop_reason"] is None and choice["prompt_token_ids"] == PROMPT
    assert choice["text"] == TOK.decode(ids, skip_special_tokens=True)
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert lp["tokens"] == [f"token_id:{t}" for t in ids]
    assert lp["token_logprobs"] == log["logprobs"]
    for t, value, tops, alts in zip(ids, lp["token_logprobs"], lp["top_logprobs"], log["top_logprobs"], strict=True):
        keys = list(tops)
        assert keys[0] == f"token_id:{t}" and tops[keys[0]] == value  # the sampled token first
        best = {f"token_id:{a}": v for a, v in alts[:2]}
        assert {k: tops[k] for k in keys[1:]} == {k: v for k, v in best.items() if k != keys[0]}
        assert len(tops) in (2, 3)
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "total_tokens": len(PROMPT) + 6,
                             "completion_tokens": 6, "prompt_tokens_details": None}
    # the body is logged as received, unknown fields and all
    assert server.state.requests[-1]["unknown_field"] == {"x": 1}


def test_stream_sends_deltas_then_usage_then_done(server):
    body = {**BASE, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    r = _post(server, body, headers={"X-Request-Id": "stream-1"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": len(PROMPT), "total_tokens": len(PROMPT) + 10,
                                                         "completion_tokens": 10}
    assert len(chunks) == 3  # 4 + 4 + 2 tokens: one chunk per sampled piece
    for k, c in enumerate(chunks):
        assert c["id"] == "cmpl-stream-1" and c["object"] == "text_completion" and "usage" not in c
        (choice,) = c["choices"]
        assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
                                "token_ids"]
        assert choice["prompt_token_ids"] == (PROMPT if k == 0 else None)
        assert choice["finish_reason"] == ("length" if k == len(chunks) - 1 else None)
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    lps = [v for c in chunks for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    log = entry(server, "stream-1")
    assert ids == log["token_ids"] and lps == log["logprobs"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == TOK.decode(ids, skip_special_tokens=True)
    # the same seed samples the same ids, streamed or not
    assert _post(server, {**body, "stream": False, "stream_options": None}).json()["choices"][0]["token_ids"] == ids


def test_seeds_greedy_stop_ids_and_stop_strings(server):
    greedy = _post(server, {**BASE, "temperature": 0, "max_tokens": 8, "logprobs": 1}).json()["choices"][0]
    for value, tops in zip(greedy["logprobs"]["token_logprobs"], greedy["logprobs"]["top_logprobs"], strict=True):
        assert value == max(tops.values())  # temperature 0: always the most likely token
    seeded = {**BASE, "max_tokens": 8, "seed": 5}
    ids = _post(server, seeded).json()["choices"][0]["token_ids"]
    assert _post(server, seeded).json()["choices"][0]["token_ids"] == ids
    assert _post(server, {**seeded, "seed": 6}).json()["choices"][0]["token_ids"] != ids
    nucleus = _post(server, {**BASE, "top_p": 1e-6, "max_tokens": 8, "logprobs": 1}).json()["choices"][0]
    assert nucleus["token_ids"] == greedy["token_ids"]  # a vanishing top_p keeps only the best token
    greedy = seeded  # the same seed samples the same prefix, so a stop cuts it where expected
    j = next(k for k in range(1, 8) if ids[k] not in ids[:k])
    r = _post(server, {**greedy, "stop_token_ids": [ids[j]]}).json()["choices"][0]
    assert r["token_ids"] == ids[: j + 1] and r["finish_reason"] == "stop" and r["stop_reason"] == ids[j]
    # a stop string: the completing token is kept in token_ids, the string cut from the text
    text = TOK.decode(ids, skip_special_tokens=True)
    k = next(k for k in range(1, 8) if 6 < ids[k] < 1024 and TOK.decode(ids[k:k + 1]).strip()
             and TOK.decode(ids[k:k + 1]).strip() not in TOK.decode(ids[:k]))
    stop = TOK.decode(ids[k:k + 1]).strip()
    r = _post(server, {**greedy, "stop": [stop]}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["stop_reason"] == stop
    assert r["token_ids"] == ids[: k + 1] and stop not in r["text"] and text.startswith(r["text"])
    r = _post(server, {**greedy, "stop": stop, "include_stop_str_in_output": True}).json()["choices"][0]
    assert r["text"].endswith(stop)


@pytest.mark.parametrize("body,status,param,words", [
    pytest.param({"max_tokens": 4090}, 400, "input_tokens", "maximum context length is 4096", id="context-length"),
    pytest.param({"model": "other"}, 404, "model", "The model `other` does not exist.", id="unknown-model"),
    pytest.param({"logprobs": -1}, 400, "logprobs", "must be a positive value", id="negative-logprobs"),
    pytest.param({"logprobs": 21}, 400, "logprobs", "greater than max allowed: 20", id="too-many-logprobs"),
    pytest.param({"stream_options": {"include_usage": True}}, 400, "stream_options", "only be defined when",
                 id="stream-options-without-stream"),
    # vLLM 0.32 names no param for an id outside the vocabulary (checked against the real server)
    pytest.param({"prompt": [5000]}, 400, None, "Token id 5000 is out of vocabulary", id="id-outside-vocab"),
    pytest.param({"prompt": []}, 400, "prompt", "must be provided and non-empty", id="empty-prompt"),
    pytest.param({"n": 2}, 400, "n", "does not support n=2", id="n"),
    pytest.param({"top_k": 5}, 400, "top_k", "does not support top_k=5", id="top-k"),
    pytest.param({"temperature": "hot"}, 400, "temperature", "input should be a number", id="temperature-type"),
])
def test_refusals_have_vllm_error_shape(server, body, status, param, words):
    before = len(server.state.generations)
    err = _error(_post(server, {**BASE, **body}), status)
    assert err["param"] == param and words in err["message"]
    assert err["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    assert len(server.state.generations) == before  # refused before sampling


def test_tokenize_detokenize_models_health_version(server):
    ids = TOK.encode("Hello, world!", add_special_tokens=False)
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello, world!", "add_special_tokens": False}).json()
    assert r == {"count": len(ids), "max_model_len": 4096, "tokens": ids, "token_strs": None}
    r = httpx.post(f"{server.url}/tokenize", json={"messages": USER, "return_token_strs": True}).json()
    assert r["tokens"] == PROMPT and r["token_strs"] == TOK.convert_ids_to_tokens(PROMPT)
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": PROMPT}).json() == {"prompt": TOK.decode(PROMPT)}
    assert httpx.post(f"{server.url}/tokenize", json={"model": "x", "prompt": "a"}).status_code == 404
    (card,) = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert card["id"] == "tiny" and card["root"] == "tiny" and card["max_model_len"] == 4096
    assert card["object"] == "model" and card["owned_by"] == "vllm"
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.content == b""
    assert "version" in httpx.get(f"{server.url}/version").json()
    assert httpx.post(f"{server.url}/v1/nothing-here").json() == {"detail": "Not Found"}


def test_tokenize_takes_messages_as_vllm_parses_them(server):
    """vLLM's chat parsing hands the template an assistant tool-call turn's `content: null` as ""
    and its arguments decoded (vllm/entrypoints/chat_utils.py), where transformers'
    apply_chat_template would raise on the null: the stand-in's /tokenize answers it, with the
    ids of that parsed form, as vLLM does."""
    from rowgrove.gateway.core.preprocess import detect_content_format, engine_messages

    msgs = [{"role": "user", "content": "read it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}]
    r = httpx.post(f"{server.url}/tokenize", json={"messages": msgs})
    assert r.status_code == 200, r.text
    parsed = engine_messages(msgs, detect_content_format(TOK.chat_template))
    text = TOK.apply_chat_template(parsed, add_generation_prompt=True, tokenize=False)
    assert r.json()["tokens"] == TOK.encode(text, add_special_tokens=False)


def test_pause_keep_freezes_requests_until_resume(server):
    server.state.segment_delay = 0.05

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            task = asyncio.create_task(http.post("/v1/completions", json={**BASE, "max_tokens": 24},
                                                 headers={"X-Request-Id": "keep-1"}))
            assert await await_for(lambda: (e := entry(server, "keep-1")) and len(e["token_ids"]) >= 4)
            assert (await http.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
            assert (await http.get("/is_paused")).json() == {"is_paused": True}
            at_pause = len(entry(server, "keep-1")["token_ids"])
            await asyncio.sleep(0.5)  # a piece under way when the pause came may still land
            frozen = len(entry(server, "keep-1")["token_ids"])
            await asyncio.sleep(0.4)
            assert len(entry(server, "keep-1")["token_ids"]) == frozen < 24 and not task.done()
            assert frozen - at_pause <= 4  # at most the one piece under way
            # a new request waits too
            late = asyncio.create_task(http.post("/v1/completions", json=BASE, headers={"X-Request-Id": "keep-2"}))
            await asyncio.sleep(0.2)
            assert entry(server, "keep-2")["token_ids"] == [] and not late.done()
            assert (await http.post("/resume")).json() == {"status": "resumed"}
            return (await task).json(), (await late).json()

    first, second = asyncio.run(main())
    assert first["choices"][0]["token_ids"] == entry(server, "keep-1")["token_ids"]
    assert len(first["choices"][0]["token_ids"]) == 24 and first["choices"][0]["finish_reason"] == "length"
    assert second["choices"][0]["finish_reason"] == "length"
    assert [e["route"] for e in server.state.events[-2:]] == ["/pause", "/resume"]
    assert server.state.events[-2]["in_flight"] == ["keep-1"]


@pytest.mark.parametrize("stream", MODES)
def test_abort_requests_ends_a_request_with_abort(server, stream):
    server.state.segment_delay = 0.1
    rid = f"abort-{int(stream)}"

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            task = asyncio.create_task(http.post("/v1/completions", json={**BASE, "max_tokens": 40, "stream": stream},
                                                 headers={"X-Request-Id": rid}))
            assert await await_for(lambda: (e := entry(server, rid)) and e["token_ids"])
            r = await http.post("/abort_requests", json={"request_ids": [f"cmpl-{rid}-0"]})
            assert r.json() == {"status": "aborted", "aborted": 1}
            return await task

    r = asyncio.run(main())
    assert r.status_code == 200
    if stream:
        events = sse_events(r.content)
        assert events[-1] == "[DONE]"
        finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
        assert finishes[-1] == "abort" and all(f is None for f in finishes[:-1])
    else:
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 40
    assert rid in server.state.aborted and entry(server, rid)["status"] == "aborted"


def test_dev_routes_need_dev_mode(server):
    plain = launch_standin("vllm", "tiny", engine=server.engine, dev_mode=False)
    try:
        for path in ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/abort_requests"):
            r = httpx.post(f"{plain.url}{path}")
            assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        engine = make_engine("vllm", "tiny", url=plain.url)  # serving works without dev mode
        with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
            engine.update_weights(str(model_dir("tiny")))
        assert engine.weights_version == 0
    finally:
        plain.close()


# ---- the engine through the real gateway --------------------------------------------------------


def test_ledger_holds_what_the_stand_in_sampled(gw, server):
    ro = gw.create_rollout("g-ids")
    r = _client(ro).chat.completions.create(model="tiny", messages=USER, max_tokens=10, seed=11,
                                            logprobs=True, top_logprobs=3)
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "completed" and call.id == r.id
    log = entry(server, call.id)  # the call id is the X-Request-Id the stand-in saw
    assert log["prompt"] == PROMPT == as_list(call.prompt_ids)
    assert as_list(call.sampled_ids) == log["token_ids"] and len(log["token_ids"]) == r.usage.completion_tokens
    np.testing.assert_allclose(call.logprobs, log["logprobs"], rtol=0, atol=1e-6)
    assert as_list(call.weight_versions) == [0] * len(log["token_ids"])
    content = r.choices[0].logprobs.content
    np.testing.assert_allclose([c.logprob for c in content], log["logprobs"][: len(content)], atol=1e-6)
    # the engine asked for exactly this (sampling fields explicit, tokens and alternatives named by
    # id, and no return_token_ids: vLLM would echo the whole prompt's ids with it)
    body = next(b for b in reversed(server.state.requests) if b["prompt"] == PROMPT and b.get("seed") == 11)
    assert "return_token_ids" not in body and body["return_tokens_as_token_ids"] is True
    assert body["logprobs"] == 3 and body["max_tokens"] == 10 and body["stop_token_ids"] == [2]
    assert body["temperature"] == 1.0 and body["top_p"] == 1.0 and body["top_k"] == -1
    assert body["stream"] is gw.engine.stream
    if gw.engine.stream:
        assert body["stream_options"] == {"include_usage": True}
    # the top alternatives the gateway reports are the stand-in's, best first
    for c, alts in zip(content, log["top_logprobs"], strict=False):
        assert [round(t.logprob, 5) for t in c.top_logprobs] == [round(v, 5) for _, v in alts[:3]]


def test_a_continuation_sends_the_parents_prompt_and_samples_first(gw, server):
    with turns_that_end(server):
        for seed in range(30):
            ro = gw.create_rollout("g-cont")
            client = _client(ro)
            r1 = client.chat.completions.create(model="tiny", messages=USER, max_tokens=24, seed=seed)
            if r1.choices[0].finish_reason == "stop" and not r1.choices[0].message.tool_calls:
                break
        else:
            pytest.fail("no first turn ended with the end-of-turn token in 30 seeds")
        messages = USER + [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more?"}]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=1)
    c1, c2 = gw.ledger.calls(ro["rollout_id"])
    assert c2.parent_id == c1.id and not c2.root and c2.status == "completed"
    e1, e2 = entry(server, c1.id), entry(server, c2.id)
    assert e1["token_ids"][-1] == 2 and as_list(c1.sampled_ids) == e1["token_ids"]
    context = e1["prompt"] + e1["token_ids"]
    assert e2["prompt"][: len(context)] == context  # token for token, the sampled ids never re-encoded
    assert e2["prompt"][len(context):] == as_list(c2.prompt_ids) and len(e2["prompt"]) == c2.prompt_len
    assert as_list(c2.sampled_ids) == e2["token_ids"]


def test_a_client_that_gives_up_aborts_the_server_request(gw, server):
    ro = gw.create_rollout("g-gone")
    server.fault("slow", delay=5.0)
    with pytest.raises(openai.APITimeoutError):
        _client(ro, timeout=0.5).chat.completions.create(model="tiny", messages=USER, max_tokens=4)
    calls = wait_for(lambda: [c for c in gw.ledger.calls(ro["rollout_id"]) if c.status == "aborted"])
    assert calls, [c.status for c in gw.ledger.calls(ro["rollout_id"])]
    assert wait_for(lambda: calls[0].id in server.state.disconnected, timeout=5)
    assert entry(server, calls[0].id)["status"] == "disconnected" and entry(server, calls[0].id)["token_ids"] == []


@pytest.mark.parametrize("stream", MODES)
def test_cancelling_the_engine_task_aborts_on_the_server(engines, server, stream):
    engine = engines[stream]
    server.state.segment_delay = 0.2
    rid = f"cancel-{int(stream)}"

    async def main():
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=40), hints={"call_id": rid}))
        assert await await_for(lambda: (e := entry(server, rid)) and e["token_ids"])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_for(lambda: rid in server.state.disconnected, timeout=5)
    e = entry(server, rid)
    assert e["status"] == "disconnected" and len(e["token_ids"]) < 40
    assert engine.in_flight == [0]


FAILURES = [
    ("500", 502, "answered 500"), ("502", 502, "answered 502"),
    ("429", 503, "overloaded"), ("503", 503, "overloaded"),
    ("bad_id", 502, "outside the vocabulary"), ("short_logprobs", 502, "logprobs"),
    ("cut", 502, "failed on request"), ("abort", 502, "aborted request"),
    ("400", 400, "answered 400"),  # the server refused the request itself: the harness's to fix
]


@pytest.mark.parametrize("fault,status,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_server_failure_is_a_status_and_a_failed_call(gw, server, fault, status, words):
    ro = gw.create_rollout("g-fail")
    server.fault(fault)
    with pytest.raises(openai.APIStatusError) as info:
        _client(ro).chat.completions.create(model="tiny", messages=USER, max_tokens=6)
    assert info.value.status_code == status
    if status == 503:
        assert info.value.response.headers["retry-after"] == "2"  # the server's hint, passed on
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "failed" and words in call.error and len(call.sampled_ids) == 0
    assert entry(server, call.id)["fault"] == fault
    # the next call of the rollout is served normally
    _client(ro).chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert [c.status for c in gw.ledger.calls(ro["rollout_id"])] == ["failed", "completed"]


def test_a_400_from_the_server_is_a_bad_request(engines, server):
    server.fault("400")
    with pytest.raises(BadRequest, match="answered 400"):
        asyncio.run(engines[True].generate(PROMPT, SamplingParams(max_tokens=2)))
    with pytest.raises(BadRequest, match="maximum context length"):
        asyncio.run(engines[False].generate(PROMPT, SamplingParams(max_tokens=4090)))


def test_connection_refused_is_502(tmp_path):
    engine = make_engine("vllm", "tiny", url=closed_port_url(), check=False)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-refused")
        with pytest.raises(openai.APIStatusError) as info:
            _client(ro).chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert info.value.status_code == 502
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed" and "cannot connect" in call.error and "is the server running" in call.error


def test_a_hanging_server_times_out_as_504(server, tmp_path):
    engine = make_engine("vllm", "tiny", url=server.url, timeout=1.0)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-hang")
        server.fault("hang")
        with pytest.raises(openai.APIStatusError) as info:
            _client(ro).chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert info.value.status_code == 504
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed" and "timed out" in call.error
        assert wait_for(lambda: call.id in server.state.disconnected, timeout=5)  # the engine let go


# ---- the start-up check ------------------------------------------------------------------------


@pytest.mark.parametrize("other", ["tiny-qwen3", "tiny-llama3"])
def test_check_refuses_a_server_of_another_folder(server, other):
    # same tokenizer, same weights, same served name: only the chat template tells them apart
    wrong = launch_standin("vllm", other, engine=server.engine, served_model_name="tiny")
    try:
        with pytest.raises(EngineError) as info:
            make_engine("vllm", "tiny", url=wrong.url)
        msg = str(info.value)
        assert wrong.url in msg and "chat template" in msg and "first difference at position" in msg
        assert str(model_dir("tiny")) in msg
        make_engine("vllm", other, url=wrong.url, served_model="tiny")  # its own folder passes
    finally:
        wrong.close()


def test_check_refuses_a_wrong_served_model_name(server):
    with pytest.raises(EngineError, match=r"serves the model name\(s\) \['tiny'\], not 'policy'"):
        make_engine("vllm", "tiny", url=server.url, served_model="policy")
    named = launch_standin("vllm", "tiny", engine=server.engine, served_model_name="policy")
    try:
        # no name given: the one model the server serves is adopted (the tokenizer probes prove it)
        assert make_engine("vllm", "tiny", url=named.url).served_model == "policy"
        engine = make_engine("vllm", "tiny", url=named.url, served_model="policy")
        gen = asyncio.run(engine.generate(PROMPT, SamplingParams(max_tokens=3), hints={"call_id": "named-1"}))
        assert gen.token_ids == entry(named, "named-1")["token_ids"]
        assert named.state.requests[-1]["model"] == "policy"
    finally:
        named.close()


def test_check_names_every_bad_server(server):
    dead = closed_port_url()
    with pytest.raises(EngineError) as info:
        make_engine("vllm", "tiny", url=[server.url, dead])
    msg = str(info.value)
    assert f"{dead}: cannot reach it" in msg and f"{server.url}:" not in msg


# ---- weights ------------------------------------------------------------------------------------


def _weights(server) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in server.engine.model.state_dict().items()}


def test_update_weights_from_a_state_dict(server, tmp_path):
    engine = make_engine("vllm", "tiny", url=server.url, sync_dir=tmp_path / "sync")
    before = _weights(server)
    new = {k: v * 1.5 if k in ("model.embed_tokens.weight", "lm_head.weight") else v * 0.9 for k, v in before.items()}
    greedy = SamplingParams(temperature=0, max_tokens=4)
    g0 = asyncio.run(engine.generate(PROMPT, greedy))
    n_events = len(server.state.events)
    try:
        engine.update_weights(new)
        assert engine.weights_version == 1
        folder = tmp_path / "sync" / "v000001"
        assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
        routes = [e["route"] for e in server.state.events[n_events:]]
        assert routes == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
        assert server.state.events[n_events]["mode"] == "keep"
        load = server.state.weight_loads[-1]
        assert load["path"] == str(folder) and load["paused"] is True and load["tensors"] == len(new)
        assert httpx.get(f"{server.url}/weight_info").json() == {"weight_version": "1"}
        assert all(torch.equal(server.engine.model.state_dict()[k], new[k]) for k in new)
        g1 = asyncio.run(engine.generate(PROMPT, greedy))
        assert abs(g1.logprobs[0] - g0.logprobs[0]) > 1e-3  # the server samples with the new weights
        expect, _ = teacher_forced_logprobs(server.engine.model, PROMPT, g1.token_ids)
        np.testing.assert_allclose(g1.logprobs, expect, atol=1e-4)
        assert g1.weight_versions == [1] * len(g1.token_ids)
    finally:
        # a folder of a tied model without lm_head.weight: rewritten under sync_dir with the head
        # named (vLLM's CPU build reloads the output layer only from a checkpoint that names it)
        engine.update_weights(str(model_dir("tiny")))
    assert engine.weights_version == 2
    from safetensors import safe_open

    with safe_open(str(tmp_path / "sync" / "v000002" / "model.safetensors"), "pt") as st:
        assert "lm_head.weight" in set(st.keys())
    assert all(torch.equal(server.engine.model.state_dict()[k], before[k]) for k in before)


def test_an_update_in_the_middle_of_a_request_keeps_it_valid(server, tmp_path):
    engine = make_engine("vllm", "tiny", url=server.url, sync_dir=tmp_path / "sync", pause_mode="keep")
    before = _weights(server)
    new = ending_weights(before, delta=-0.8)  # new weights that never end the turn early
    server.state.segment_delay = 0.1
    rid = "mid-update"

    async def main():
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=24, seed=7),
                                                   hints={"call_id": rid}))
        assert await await_for(lambda: (e := entry(server, rid)) and len(e["token_ids"]) >= 4)
        await asyncio.to_thread(engine.update_weights, new)
        return await task

    try:
        gen = asyncio.run(main())
    finally:
        server.state.segment_delay = 0.0
        engine.update_weights(str(model_dir("tiny")))
    log = entry(server, rid)
    assert log["status"] == "finished" and gen.finish_reason == "length"
    assert gen.token_ids == log["token_ids"] and gen.logprobs == log["logprobs"] and len(gen.token_ids) == 24
    versions = log["weight_versions"]
    k = versions.index(versions[-1])
    assert versions[-1] == versions[0] + 1 and 4 <= k < 24 and versions == [versions[0]] * k + [versions[-1]] * (24 - k)
    # the later tokens really are the new weights' (teacher-forced under them)
    server.engine.update_weights(new)
    try:
        expect, _ = teacher_forced_logprobs(server.engine.model, PROMPT + gen.token_ids[:k], gen.token_ids[k:])
    finally:
        server.engine.update_weights(before)
    np.testing.assert_allclose(gen.logprobs[k:], expect, atol=1e-4)
    # vLLM reports no per-token version: the engine stamps the version held when it asked
    assert gen.weight_versions == [0] * 24
    pause = next(e for e in reversed(server.state.events) if e["route"] == "/pause" and rid in e["in_flight"])
    assert pause["mode"] == "keep"
    assert any(rid in w["in_flight"] for w in server.state.weight_loads)


def test_pause_mode_abort_fails_the_request_in_flight(server, tmp_path):
    engine = make_engine("vllm", "tiny", url=server.url, pause_mode="abort")
    server.state.segment_delay = 0.1
    rid = "pause-abort"

    async def main():
        # greedy: the tiny model writes all 200 tokens without an end of turn (a sampled request
        # could end within the few pieces before the pause lands, and then nothing is aborted);
        # at 0.1 s a piece the request lasts up to 20 s, so a slow weight load still finds it running
        params = SamplingParams(max_tokens=200, temperature=0.0)
        task = asyncio.create_task(engine.generate(PROMPT, params, hints={"call_id": rid}))
        assert await await_for(lambda: (e := entry(server, rid)) and e["token_ids"])
        await asyncio.to_thread(engine.update_weights, str(model_dir("tiny")))
        with pytest.raises(EngineError, match="aborted request pause-abort"):
            await task

    asyncio.run(main())
    assert rid in server.state.aborted and engine.weights_version == 1


def test_the_command_line_refuses_options_of_the_other_server(capsys):
    from rowgrove.standins.__main__ import build_parser, main

    assert main(["vllm", "--incremental"]) == 2
    assert "--incremental is an sglang option" in capsys.readouterr().err
    assert main(["sglang", "--no-dev-routes"]) == 2
    args = build_parser().parse_args(["vllm", "--model", "tiny-qwen3", "--port", "9", "--served-model-name", "p"])
    assert (args.kind, args.model, args.port, args.served_model_name) == ("vllm", "tiny-qwen3", 9, "p")


# ---- weight sync is verified ------------------------------------------------------------------

def test_a_sync_whose_logprobs_differ_is_refused_and_the_server_serves_nothing_after_it(server, tmp_path):
    """The check compares the server's probe logprobs (prompt_logprobs) with the reference: a
    reference the server does not match (as a stale output layer would) is a WeightSyncError
    naming the server, the version and the largest difference; the server then serves no call,
    and a later sync that matches lets it serve again."""
    from rowgrove.engines.verify import WeightSyncError, policy_logprobs

    engine = make_engine("vllm", "tiny", url=server.url, sync_dir=tmp_path / "sync")
    weights = _weights(server)
    truth = lambda ids: policy_logprobs(server.engine.model, ids)  # noqa: E731
    off = lambda ids: [v + 0.01 for v in truth(ids)]  # noqa: E731 - what a stale head looks like
    with pytest.raises(WeightSyncError) as e:
        engine.update_weights(weights, reference=off)
    msg = str(e.value)
    assert server.url in msg and "weight version 1" in msg and "differ by up to 0.01" in msg
    assert engine.weights_version == 0 and server.url in engine.stale
    with pytest.raises(EngineError, match="serves no call until"):
        asyncio.run(engine.generate(PROMPT, SamplingParams(max_tokens=2)))
    engine.update_weights(weights, reference=truth)
    assert engine.weights_version == 1 and not engine.stale
    assert asyncio.run(engine.generate(PROMPT, SamplingParams(max_tokens=2))).token_ids


def test_the_trainer_checks_each_sync_against_its_own_policy(server, tmp_path):
    """`rowgrove train` syncs through _LocalRollouts.sync(state_dict, model): the reference is the
    trainer's own policy (after an update that used packed attention), not a copy of the
    checkpoint, so a server that loaded something other than the policy is refused."""
    import copy

    from rowgrove.engines.verify import WeightSyncError, policy_logprobs
    from rowgrove.train.loop import _LocalRollouts

    engine = make_engine("vllm", "tiny", url=server.url, sync_dir=tmp_path / "sync", sync_tolerance=1e-4)
    weights = _weights(server)
    policy = copy.deepcopy(server.engine.model)
    try:
        assert _LocalRollouts(None, engine, None).sync(weights, policy) == 1
        with torch.no_grad():
            policy.get_output_embeddings().weight.mul_(1.5)  # the policy is not what was sent
        with pytest.raises(WeightSyncError, match="weight version 2"):
            _LocalRollouts(None, engine, None).sync(weights, policy)
        assert server.url in engine.stale
    finally:
        engine.update_weights(weights, reference=lambda ids: policy_logprobs(server.engine.model, ids))
    assert not engine.stale


def test_the_default_reference_is_a_mirror_of_what_was_synced_and_the_tolerance_is_settable(server, tmp_path):
    """Without a reference the engine compares with its own CPU copy of the synced weights (the
    stand-in loads them exactly: passes at 1e-6); a negative tolerance is refused by name."""
    from rowgrove.errors import InputError

    engine = make_engine("vllm", "tiny", url=server.url, sync_dir=tmp_path / "sync", sync_tolerance=1e-6)
    before = _weights(server)
    try:
        engine.update_weights({k: v * 1.1 for k, v in before.items()})
        assert engine.weights_version == 1 and not engine.stale
    finally:
        engine.update_weights(before)
    with pytest.raises(InputError, match="sync tolerance"):
        make_engine("vllm", "tiny", url=server.url, sync_tolerance=-1)
