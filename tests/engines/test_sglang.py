"""The sglang engine against the SGLang stand-in over real loopback HTTP, alone and behind the real
gateway (official `openai` SDK): the ledger holds exactly the ids and logprobs the server sampled,
in cumulative streaming, incremental streaming and non-streaming; aborts, failures, the start-up
check and weight updates (including one landing in the middle of a request)."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from rowgrove.engines import make_engine
from rowgrove.engines.base import SamplingParams, teacher_forced_logprobs
from rowgrove.engines.sglang import ReplyReader, SGLangEngine, version_number
from rowgrove.model.tiny import CONTEXT
from rowgrove.errors import BadRequest, EngineError, Unavailable
from rowgrove.gateway.testing import start_gateway
from rowgrove.standins import launch_standin

USER = [{"role": "user", "content": "hello there"}]
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "frequency_penalty", "presence_penalty", "stop", "stop_token_ids", "ignore_eos",
                 "skip_special_tokens", "no_stop_trim"}


def _wait(pred: Callable[[], Any], timeout: float = 10.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    return pred()


def _arun(engine: SGLangEngine, make: Callable[[], Any]) -> Any:
    """Run `make()` on a fresh event loop, closing the engine's client for that loop after."""
    async def main() -> Any:
        try:
            return await make()
        finally:
            client = engine._clients.pop(id(asyncio.get_running_loop()), None)
            if client is not None:
                await client.aclose()
    return asyncio.run(main())


def _client(ro: dict, **kw: Any) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0, **kw)


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf():
    engine = make_engine("hf", "tiny", max_batch=16)
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def servers(hf):
    """The stand-ins sharing one hf engine: cumulative and incremental streaming."""
    handles = {"cumulative": launch_standin("sglang", "tiny", engine=hf),
               "incremental": launch_standin("sglang", "tiny", engine=hf, incremental=True)}
    yield handles
    for h in handles.values():
        h.close()


MODES = {"cumulative": ("cumulative", True), "incremental": ("incremental", True), "non-stream": ("cumulative", False)}


@pytest.fixture(scope="module", params=list(MODES))
def setup(request, servers, tmp_path_factory):
    """(mode, stand-in, engine, gateway) per way of reading answers."""
    which, stream = MODES[request.param]
    server = servers[which]
    engine = make_engine("sglang", "tiny", url=server.url, stream=stream)
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("sgl") / "ledger.db") as gw:
        yield request.param, server, engine, gw


@pytest.fixture(autouse=True)
def _no_fault_left(request):
    yield
    if "servers" in request.fixturenames:
        for h in request.getfixturevalue("servers").values():
            h.fault(None)


def _check_call_is_what_was_sampled(server, hf, call) -> dict:
    out = server.log()["outputs"][call.id]
    assert call.status == "completed"
    assert call.sampled_ids.tolist() == out["output_ids"] and len(out["output_ids"]) > 0
    np.testing.assert_allclose(call.logprobs, np.float32(out["logprobs"]), rtol=0, atol=1e-6)
    # and those are the model's own raw logprobs of those ids after that prompt
    ref, _ = teacher_forced_logprobs(hf.model, out["input_ids"], out["output_ids"])
    np.testing.assert_allclose(call.logprobs, ref, atol=1e-4)
    return out


# ---- through the gateway ----------------------------------------------------------------------

def test_the_ledger_holds_what_the_server_sampled(setup, hf):
    mode, server, engine, gw = setup
    assert engine.incremental[server.url] is (mode == "incremental")  # read from /server_info
    ro = gw.create_rollout("g-exact")
    r = _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=11, seed=5)
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert r.id == call.id
    out = _check_call_is_what_was_sampled(server, hf, call)
    assert r.usage.completion_tokens == len(out["output_ids"]) == 11  # several chunks when streaming
    assert call.weight_versions.tolist() == [0] * 11
    body = next(b for b in server.log()["requests"] if b.get("rid") == call.id)
    assert body["input_ids"] == call.prompt_ids.tolist() == out["input_ids"]
    assert body["stream"] is (mode != "non-stream")
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    sp = body["sampling_params"]
    assert set(sp) == SAMPLING_KEYS | {"sampling_seed"} and sp["sampling_seed"] == 5
    assert sp["max_new_tokens"] == 11 and sp["top_k"] == -1 and sp["stop_token_ids"] == [2]
    assert sp["no_stop_trim"] is True and sp["skip_special_tokens"] is False


class TurnEnder:
    """The hf engine, except that the `k`-th token of a reply is the end-of-turn id (with its real
    logprob): random weights almost never end a turn, and only a reply that ended its turn can be
    continued. The stand-in using it must sample a request in one piece (segment >= max_tokens)."""

    def __init__(self, hf, k: int):
        self.hf, self.k = hf, k
        self.tokenizer, self.stop_ids, self.vocab_size = hf.tokenizer, hf.stop_ids, hf.vocab_size

    @property
    def weights_version(self) -> int:
        return self.hf.weights_version

    async def generate(self, prompt_ids, sampling, *, hints=None):
        gen = await self.hf.generate(prompt_ids, sampling)
        if len(gen.token_ids) >= self.k:
            ids = gen.token_ids[: self.k - 1] + [self.hf.eot_id]
            lps, _ = await asyncio.to_thread(teacher_forced_logprobs, self.hf.model, list(prompt_ids), ids)
            gen.token_ids, gen.logprobs, gen.finish_reason = ids, lps, "stop"
            gen.weight_versions = gen.weight_versions[: self.k]
            gen.top_logprobs = None
        return gen


@pytest.mark.parametrize("mode", list(MODES))
def test_a_continuation_sends_the_parents_exact_ids(hf, mode, tmp_path):
    which, stream = MODES[mode]
    server = launch_standin("sglang", "tiny", engine=TurnEnder(hf, 3), segment=64,
                            incremental=which == "incremental")
    try:
        engine = make_engine("sglang", "tiny", url=server.url, stream=stream)
        with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
            ro = gw.create_rollout("g-cont")
            client = _client(ro)
            r1 = client.chat.completions.create(model="m", messages=USER, max_tokens=6, seed=1)
            assert r1.choices[0].finish_reason == "stop"
            messages = USER + [r1.choices[0].message.model_dump(exclude_none=True),
                               {"role": "user", "content": "more"}]
            r2 = client.chat.completions.create(model="m", messages=messages, max_tokens=6, seed=2)
            c1, c2 = gw.ledger.calls(ro["rollout_id"])
            assert (c1.id, c2.id) == (r1.id, r2.id) and c2.parent_id == c1.id
            assert c1.sampled_ids.tolist()[-1] == 2 and len(c1.sampled_ids) == 3
            sent = {b["rid"]: b["input_ids"] for b in server.log()["requests"]}
            parent = sent[c1.id] + c1.sampled_ids.tolist()
            assert sent[c2.id][: len(parent)] == parent
            assert sent[c2.id] == parent + c2.prompt_ids.tolist() and len(sent[c2.id]) == c2.prompt_len
            for c in (c1, c2):
                _check_call_is_what_was_sampled(server, hf, c)
    finally:
        server.close()


FAILURES = [
    ("500", 502, openai.InternalServerError),
    ("502", 502, openai.InternalServerError),
    ("bad_id", 502, openai.InternalServerError),
    ("short_logprobs", 502, openai.InternalServerError),
    ("cut", 502, openai.InternalServerError),
    ("abort", 502, openai.InternalServerError),
    ("503", 503, openai.InternalServerError),
    ("429", 503, openai.InternalServerError),
    # the server refused the request: the harness gets the 400 (engine_rejected) with its message
    ("400", 400, openai.BadRequestError),
]


@pytest.mark.parametrize(("fault", "status", "exc"), FAILURES, ids=[f[0] for f in FAILURES])
def test_server_faults_fail_the_call(setup, fault, status, exc):
    mode, server, engine, gw = setup
    ro = gw.create_rollout(f"g-{fault}")
    server.fault(fault)
    with pytest.raises(exc) as info:
        _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=9, seed=3)
    assert info.value.status_code == status
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "failed" and call.finish_reason is None and call.response is None
    if fault == "400":
        assert "stand-in fault: 400" in info.value.message and info.value.code == "engine_rejected"
    if status == 503:  # the server's Retry-After reaches the harness
        assert info.value.response.headers["retry-after"] == "2"
    if fault in ("bad_id", "short_logprobs", "cut", "abort"):
        assert server.log()["outputs"][call.id]["output_ids"], "the server did sample: the gateway refused it"
    # the next call is served normally
    r = _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=3)
    assert gw.ledger.get_call(r.id).status == "completed"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_full_queue_is_503_with_retry_after(hf, stream, tmp_path):
    server = launch_standin("sglang", "tiny", engine=hf, max_queued=1)
    try:
        engine = make_engine("sglang", "tiny", url=server.url, stream=stream)
        server.fault("slow", 1, delay=5.0)
        hold = threading.Thread(target=httpx.post, args=(f"{server.url}/generate",),
                                kwargs={"json": {"input_ids": [5, 6], "rid": "holder", "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 2}}, "timeout": 10})
        hold.start()
        assert _wait(lambda: "holder" in server.state.running)
        with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
            ro = gw.create_rollout("g-full")
            with pytest.raises(openai.InternalServerError) as info:
                _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=4)
            assert info.value.status_code == 503
            assert info.value.response.headers["retry-after"] == "1"  # SGLang sends none: the default
            assert "queue is full" in info.value.message
            (call,) = gw.ledger.calls(ro["rollout_id"])
            assert call.status == "failed"
        httpx.post(f"{server.url}/abort_request", json={"abort_all": True})
        hold.join(10)
    finally:
        server.close()


def test_a_hung_server_times_out_with_504_and_is_told_to_abort(servers, tmp_path):
    server = servers["cumulative"]
    engine = make_engine("sglang", "tiny", url=server.url, timeout=1.0)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-hang")
        server.fault("hang")
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=4)
        assert info.value.status_code == 504 and time.monotonic() - t0 < 8
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed"
        assert _wait(lambda: call.id in server.log()["aborted"])
        assert _wait(lambda: call.id not in server.state.running)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_harness_disconnect_aborts_the_request_on_the_server(servers, stream, tmp_path):
    server = servers["cumulative"]
    engine = make_engine("sglang", "tiny", url=server.url, stream=stream)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-gone")
        server.fault("slow", 1, delay=5.0)
        with pytest.raises(openai.APITimeoutError):
            _client(ro, timeout=0.5).chat.completions.create(model="m", messages=USER, max_tokens=4)
        assert _wait(lambda: [c.status for c in gw.ledger.calls(ro["rollout_id"])] == ["aborted"])
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert _wait(lambda: call.id in server.log()["aborted"])  # POST /abort_request {"rid": call id}
        assert _wait(lambda: call.id not in server.state.running)
        assert server.log()["outputs"][call.id]["finish_reason"]["type"] == "abort"


# ---- the engine alone -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_cancelling_the_engine_task_posts_abort_request(servers, stream):
    server = servers["incremental"]
    engine = make_engine("sglang", "tiny", url=server.url, stream=stream)
    rid = f"cancel-{stream}"
    server.fault("slow", 1, delay=5.0)

    async def go() -> None:
        task = asyncio.create_task(engine.generate([5, 6, 7], SamplingParams(max_tokens=4),
                                                   hints={"call_id": rid}))
        while rid not in server.state.running:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    t0 = time.monotonic()
    _arun(engine, go)
    assert rid in server.log()["aborted"]
    assert _wait(lambda: rid not in server.state.running) and time.monotonic() - t0 < 4
    assert server.log()["outputs"][rid]["finish_reason"]["type"] == "abort"


def test_the_stream_form_is_read_from_completion_tokens_whatever_was_configured(servers, hf):
    """An engine told the wrong form (or none) still joins the chunks right."""
    for which, wrong in (("incremental", False), ("cumulative", True), ("incremental", None)):
        server = servers[which]
        engine = SGLangEngine("tiny", server.url, incremental=wrong)
        rid = f"form-{which}-{wrong}"
        gen = _arun(engine, lambda: engine.generate([9, 10, 11], SamplingParams(max_tokens=10, seed=4,
                                                                                top_logprobs=2),
                                                    hints={"call_id": rid}))
        out = server.log()["outputs"][rid]
        assert gen.token_ids == out["output_ids"] and gen.logprobs == pytest.approx(out["logprobs"], abs=1e-9)
        assert gen.weight_versions == [0] * 10 and gen.finish_reason == "length"
        _, tops = teacher_forced_logprobs(hf.model, [9, 10, 11], gen.token_ids, 2)
        assert [[t for t, _ in pos] for pos in gen.top_logprobs] == [[t for t, _ in pos] for pos in tops]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_request_the_server_refuses_is_a_bad_request(servers, stream):
    engine = make_engine("sglang", "tiny", url=servers["cumulative"].url, stream=stream)
    too_long = [7] * CONTEXT  # the model's context length
    with pytest.raises(BadRequest, match="longer than the model's context length"):
        _arun(engine, lambda: engine.generate(too_long, SamplingParams(max_tokens=2)))


def test_a_mismatched_server_is_refused_at_check(hf):
    server = launch_standin("sglang", "tiny-llama3", engine=hf)
    try:
        with pytest.raises(EngineError) as info:
            make_engine("sglang", "tiny", url=server.url)
        msg = str(info.value)
        assert server.url in msg and "'tiny-llama3'" in msg and "not 'tiny'" in msg
        make_engine("sglang", "tiny-llama3", url=server.url)  # the right folder passes
    finally:
        server.close()


def test_something_else_than_sglang_is_refused_at_check(servers):
    with start_gateway("tiny") as gw:
        with pytest.raises(EngineError, match="is it an SGLang server"):
            make_engine("sglang", "tiny", url=gw.url)
    with pytest.raises(EngineError, match="cannot reach it"):
        make_engine("sglang", "tiny", url="http://127.0.0.1:9")


def test_the_other_routes_answer_in_sglangs_shapes(hf):
    server = launch_standin("sglang", "tiny", engine=hf, weight_version="base")
    url = server.url
    try:
        assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/health").content == b""
        info = httpx.get(f"{url}/get_model_info").json()
        assert info["is_generation"] is True and info["weight_version"] == "base"
        assert info["architectures"] == ["LlamaForCausalLM"]
        for path in ("/server_info", "/get_server_info"):
            assert httpx.get(f"{url}{path}").json()["incremental_streaming_output"] is False
        r = httpx.post(f"{url}/v1/tokenize", json={"prompt": "hi there", "add_special_tokens": False})
        assert r.json() == {"tokens": hf.tokenizer.encode("hi there", add_special_tokens=False),
                            "count": 3, "max_model_len": CONTEXT}
        r = httpx.post(f"{url}/tokenize", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"})
        assert r.status_code == 400 and r.json()["type"] == "Bad Request"
        r = httpx.post(f"{url}/detokenize", json={"tokens": [78, 79, 2], "skip_special_tokens": False})
        assert r.json() == {"text": hf.tokenizer.decode([78, 79, 2], skip_special_tokens=False)}
        assert httpx.post(f"{url}/flush_cache").text.startswith("Cache flushed.")
        r = httpx.post(f"{url}/update_weight_version", json={"new_version": "v7"})
        assert r.json() == {"success": True, "message": "Weight version updated to v7", "new_version": "v7"}
        assert httpx.get(f"{url}/get_weight_version").json() == {"weight_version": "v7"}
        body = {"input_ids": [5, 6], "return_logprob": True, "sampling_params": {"max_new_tokens": 3}}
        out = httpx.post(f"{url}/generate", json=body).json()
        assert out["meta_info"]["weight_versions"] == [{"version": "v7", "start": 0, "end": 3}]
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        assert len(out["output_ids"]) == len(out["meta_info"]["output_token_logprobs"]) == 3
        # an unknown sampling key fails as SGLang's closed SamplingParams struct does
        bad = httpx.post(f"{url}/generate", json={**body, "sampling_params": {"seed": 1}})
        assert bad.status_code == 500
        # a paused server (in_place) holds requests until it continues
        assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).json()["status"] == "ok"
        done: list[Any] = []
        t = threading.Thread(target=lambda: done.append(httpx.post(f"{url}/generate", json=body, timeout=10)))
        t.start()
        time.sleep(0.3)
        assert not done and len(server.state.running) == 1
        assert httpx.post(f"{url}/flush_cache").status_code == 400  # requests are there
        httpx.post(f"{url}/continue_generation", json={})
        t.join(10)
        assert done[0].json()["meta_info"]["finish_reason"]["type"] == "length"
    finally:
        server.close()


# ---- weights ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wsetup(tmp_path_factory):
    """A stand-in with its own hf engine (its weights change), sampling 2 tokens per segment
    with a pause between segments, its engine and a gateway."""
    hf_w = make_engine("hf", "tiny", max_batch=16)
    server = launch_standin("sglang", "tiny", engine=hf_w, segment=2, segment_delay=0.3)
    sync = tmp_path_factory.mktemp("sync")
    engine = make_engine("sglang", "tiny", url=server.url, sync_dir=sync)
    try:
        with start_gateway("tiny", engine=engine, ledger=sync / "ledger.db") as gw:
            yield server, engine, gw, hf_w, sync
    finally:
        server.close()
        asyncio.run(hf_w.aclose())


def _perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def test_update_weights_loads_and_later_tokens_carry_the_new_version(wsetup):
    server, engine, gw, hf_w, sync = wsetup
    before = engine.weights_version
    old = copy.deepcopy(hf_w.model)
    engine.update_weights(_perturbed(hf_w.model, 1))
    v = before + 1
    assert engine.weights_version == v and hf_w.weights_version == v
    log = server.log()
    assert log["weight_loads"][-1]["model_path"] == str(sync / f"v{v:06d}")
    assert log["weight_loads"][-1]["weight_version"] == str(v) and log["weight_version"] == str(v)
    assert httpx.get(f"{server.url}/get_weight_version").json() == {"weight_version": str(v)}
    ro = gw.create_rollout("g-w")
    r = _client(ro).chat.completions.create(model="m", messages=USER, max_tokens=4, seed=9)
    call = gw.ledger.get_call(r.id)
    assert call.weight_versions.tolist() == [v] * len(call.sampled_ids)
    out = server.log()["outputs"][call.id]
    assert out["weight_versions"] == [{"version": str(v), "start": 0, "end": len(out["output_ids"])}]
    new_ref, _ = teacher_forced_logprobs(hf_w.model, out["input_ids"], out["output_ids"])
    old_ref, _ = teacher_forced_logprobs(old, out["input_ids"], out["output_ids"])
    np.testing.assert_allclose(call.logprobs, new_ref, atol=1e-4)
    assert np.max(np.abs(np.array(old_ref) - np.array(new_ref))) > 1e-2  # the weights really changed


def test_an_update_landing_mid_request_splits_the_versions(wsetup):
    server, engine, gw, hf_w, sync = wsetup
    v = engine.weights_version
    old = copy.deepcopy(hf_w.model)
    ro = gw.create_rollout("g-mid")
    seen = len(server.log()["requests"])
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(r=_client(ro).chat.completions.create(
        model="m", messages=USER, max_tokens=8, seed=11)))
    worker.start()
    rid = _wait(lambda: len(server.state.requests) > seen and server.state.requests[seen]["rid"])
    assert _wait(lambda: len(server.log()["outputs"].get(rid, {}).get("output_ids", [])) >= 2)
    engine.update_weights(_perturbed(hf_w.model, 2))  # from this thread, while the request runs
    worker.join(20)
    call = gw.ledger.get_call(result["r"].id)
    assert call.id == rid and call.status == "completed"
    versions = call.weight_versions.tolist()
    n = len(versions)
    k = versions.count(v)
    assert n == 8 and 2 <= k < n and versions == [v] * k + [v + 1] * (n - k), versions
    out = server.log()["outputs"][rid]
    first = str(v) if v else "default"
    assert out["weight_versions"] == [{"version": first, "start": 0, "end": k},
                                      {"version": str(v + 1), "start": k, "end": n}]
    # the first span came from the old weights, the second from the new ones
    ids = out["output_ids"]
    old_ref, _ = teacher_forced_logprobs(old, out["input_ids"], ids)
    new_ref, _ = teacher_forced_logprobs(hf_w.model, out["input_ids"], ids)
    np.testing.assert_allclose(call.logprobs[:k], old_ref[:k], atol=1e-4)
    np.testing.assert_allclose(call.logprobs[k:], new_ref[k:], atol=1e-4)
    assert np.max(np.abs(np.array(old_ref[k:]) - np.array(new_ref[k:]))) > 1e-2


def test_a_failed_load_is_an_engine_error_and_keeps_the_version(wsetup, tmp_path):
    server, engine, gw, hf_w, sync = wsetup
    v = engine.weights_version
    with pytest.raises(EngineError, match="repository not found"):
        engine.update_weights(tmp_path / "missing")
    assert engine.weights_version == v and hf_w.weights_version == v


# ---- the reply reader on its own --------------------------------------------------------------

def _chunk(ids, start, total, *, finish=None, spans=None, version="default", lps=None):
    lps = lps if lps is not None else [-1.0 - 0.1 * (start + i) for i in range(len(ids))]
    meta = {"completion_tokens": total, "finish_reason": finish, "weight_version": version,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]}
    if spans is not None:
        meta["weight_versions"] = spans
    return {"output_ids": ids, "meta_info": meta}


def _reader(**kw) -> ReplyReader:
    return ReplyReader("sglang server X", "r1", 0, version_of=lambda n: version_number(n, 4), **kw)


def test_reader_joins_cumulative_incremental_and_mixed_streams():
    stop = {"type": "stop", "matched": 2}
    for incremental in (None, True, False):
        r = _reader(incremental=incremental)  # the hint never overrides what completion_tokens shows
        r.add(_chunk([10, 11], 0, 2))
        r.add(_chunk([10, 11, 12, 2], 0, 4, finish=stop))
        assert r.result(streamed=True).token_ids == [10, 11, 12, 2]
        r = _reader(incremental=incremental)
        r.add(_chunk([10, 11], 0, 2))
        r.add(_chunk([12, 2], 2, 4, finish=stop))
        g = r.result(streamed=True)
        assert g.token_ids == [10, 11, 12, 2] and g.logprobs == pytest.approx([-1.0, -1.1, -1.2, -1.3])
    # old --stream-output: ids incremental, logprobs cumulative
    r = _reader()
    r.add(_chunk([10, 11], 0, 2))
    c = _chunk([12], 2, 3, finish={"type": "length", "length": 3})
    c["meta_info"]["output_token_logprobs"] = [[-1.0, 10, None], [-1.1, 11, None], [-1.2, 12, None]]
    r.add(c)
    assert r.result(streamed=True).logprobs == pytest.approx([-1.0, -1.1, -1.2])


def test_reader_maps_versions_and_checks_spans():
    r = _reader()
    r.add(_chunk([1, 2, 3], 0, 3, finish={"type": "length"},
                 spans=[{"version": "default", "start": 0, "end": 1}, {"version": "7", "start": 1, "end": 3}]))
    assert r.result(streamed=False).weight_versions == [4, 7, 7]  # "default" → the engine's own counter
    r = _reader()  # no spans: each chunk's weight_version stamps its tokens
    r.add(_chunk([1], 0, 1, version="3"))
    r.add(_chunk([2, 5], 1, 3, version="5", finish={"type": "length"}))
    assert r.result(streamed=True).weight_versions == [3, 5, 5]
    for bad in ([{"version": "1", "start": 0, "end": 2}], [{"version": "1", "start": 1, "end": 3}],
                [{"version": "1", "start": 0, "end": 4}], "1"):
        r = _reader()
        r.add(_chunk([1, 2, 3], 0, 3, finish={"type": "length"}, spans=bad))
        with pytest.raises(EngineError, match="weight_versions"):
            r.result(streamed=False)
    assert version_number("12", 0) == 12 and version_number("v2", 3) == 3 and version_number("-1", 3) == 3


def test_reader_refuses_inconsistent_replies():
    def fails(chunks, match, exc=EngineError):
        r = _reader()
        with pytest.raises(exc, match=match):
            for c in chunks:
                r.add(c)
            r.result(streamed=True)

    length = {"type": "length"}
    c = _chunk([1, 2], 0, 2, finish=length)
    c["meta_info"]["output_token_logprobs"][1][1] = 9
    fails([c], "is for id 9")
    fails([_chunk([1, 2], 0, 5, finish=length)], "neither streaming form")
    c = _chunk([1, 2], 0, 2, finish=length)
    c["meta_info"]["output_token_logprobs"][0][0] = None
    fails([c], "no logprob")
    fails([_chunk([1, 2], 0, 2), _chunk([1, 3, 4], 0, 3, finish=length)], "does not extend")
    fails([_chunk([1, 2], 0, 2)], "without a finish reason")
    fails([{"error": {"message": "input too long"}}], "input too long", BadRequest)
    fails([_chunk([1], 0, 1), {"error": {"message": "boom"}}], "in the middle", EngineError)
    fails([_chunk([], 0, 0, finish={"type": "abort", "message": "The request queue is full.",
                                    "status_code": 503})], "overloaded", Unavailable)
    fails([_chunk([1], 0, 1, finish={"type": "abort", "message": "Aborted", "status_code": None})], "aborted")
