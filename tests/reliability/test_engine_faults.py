"""What the gateway does with a broken engine: any engine's answer is checked before it is stored
(ids in the vocabulary, one finite logprob per id, a finish reason), a bad one is a 502 and a
failed call; a generation that times out is cancelled in the engine, and does not hold up the
calls after it."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import openai
import pytest
from openai import OpenAI

from fixtures_http import dump_ledger, scripted_engine
from rowgrove.engines import make_engine
from rowgrove.engines.base import Generation, SamplingParams, check_generation
from rowgrove.errors import EngineError
from rowgrove.gateway.testing import start_gateway

USER = [{"role": "user", "content": "hello"}]


class Tamper:
    """The scripted engine's answer, changed by `edit(gen) -> gen` while `edit` is set."""

    def __init__(self, inner: Any, *, vocab_size: bool = True):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        if vocab_size:
            self.vocab_size = inner.vocab_size
        self.edit = None

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        gen = await self.inner.generate(prompt_ids, sampling, hints=hints)
        return self.edit(gen) if self.edit is not None else gen

    async def aclose(self) -> None:
        pass


def _with(**kw):
    def edit(gen: Generation) -> Generation:
        return Generation(**{**{"token_ids": list(gen.token_ids), "logprobs": list(gen.logprobs),
                                "finish_reason": gen.finish_reason, "top_logprobs": gen.top_logprobs,
                                "weight_versions": None}, **{k: v(gen) for k, v in kw.items()}})
    return edit


BAD = [
    pytest.param(_with(token_ids=lambda g: g.token_ids[:-1] + [10**7]), "outside the vocabulary", id="id-past-vocab"),
    pytest.param(_with(token_ids=lambda g: [-1] + g.token_ids[1:]), "outside the vocabulary", id="negative-id"),
    pytest.param(_with(token_ids=lambda g: [True] + g.token_ids[1:]), "outside the vocabulary", id="bool-id"),
    pytest.param(_with(token_ids=lambda g: [1.5] + g.token_ids[1:]), "outside the vocabulary", id="float-id"),
    pytest.param(_with(logprobs=lambda g: g.logprobs[:-1]), "logprobs", id="one-logprob-short"),
    pytest.param(_with(logprobs=lambda g: g.logprobs + [-1.0]), "logprobs", id="one-logprob-extra"),
    pytest.param(_with(logprobs=lambda g: [math.nan] + g.logprobs[1:]), "NaN", id="nan"),
    pytest.param(_with(logprobs=lambda g: [math.inf] + g.logprobs[1:]), "infinite", id="inf"),
    pytest.param(_with(logprobs=lambda g: [-math.inf] + g.logprobs[1:]), "infinite", id="minus-inf"),
    pytest.param(_with(logprobs=lambda g: [0.7] + g.logprobs[1:]), "positive", id="positive"),
    pytest.param(_with(logprobs=lambda g: ["x"] + g.logprobs[1:]), "not a number", id="string"),
    pytest.param(_with(finish_reason=lambda g: "abort"), "finish reason", id="finish-abort"),
]


@pytest.fixture(scope="module")
def tamper():
    return Tamper(scripted_engine("tiny"))


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tamper):
    with start_gateway("tiny", engine=tamper, ledger=tmp_path_factory.mktemp("faults") / "l.db") as handle:
        yield handle


@pytest.mark.parametrize(("edit", "words"), BAD)
def test_a_bad_generation_is_502_and_a_failed_call(gw, tamper, edit, words):
    ro = gw.create_rollout("g-bad")
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    tamper.edit = edit
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="m", messages=USER, logprobs=True)
    finally:
        tamper.edit = None
    assert info.value.status_code == 502
    err = info.value.response.json()["error"]
    assert err["code"] == "engine_failed" and words in err["message"]
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "failed" and call.error.startswith("bad generation") and words in call.error
    assert len(call.sampled_ids) == 0 and call.response is None  # nothing of it is stored
    # the rollout goes on
    r = client.chat.completions.create(model="m", messages=USER)
    assert r.choices[0].finish_reason == "stop"
    assert [c.status for c in gw.ledger.calls(ro["rollout_id"])] == ["failed", "completed"]


def test_numpy_ids_and_logprobs_are_a_good_generation(gw, tamper):
    ro = gw.create_rollout("g-np")
    tamper.edit = _with(token_ids=lambda g: list(np.asarray(g.token_ids, np.int64)),
                        logprobs=lambda g: list(np.asarray(g.logprobs, np.float32)))
    try:
        r = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0).chat.completions.create(
            model="m", messages=USER)
    finally:
        tamper.edit = None
    assert r.choices[0].message.content == "reply 1"


def test_an_engine_without_vocab_size_is_checked_against_the_tokenizer(tmp_path):
    eng = Tamper(scripted_engine("tiny"), vocab_size=False)
    eng.edit = _with(token_ids=lambda g: g.token_ids[:-1] + [len(eng.tokenizer)])
    with start_gateway("tiny", engine=eng, ledger=tmp_path / "l.db") as gw:
        assert gw.gateway.vocab_size == len(eng.tokenizer)
        ro = gw.create_rollout("g")
        with pytest.raises(openai.InternalServerError):
            OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0).chat.completions.create(
                model="m", messages=USER)
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "failed" and "outside the vocabulary" in call.error


def test_check_generation_unit():
    good = Generation(token_ids=[1, 2], logprobs=[-0.5, 0.0], finish_reason="stop")
    check_generation(good, 10, "e")
    check_generation(Generation(token_ids=[1], logprobs=[np.float32(-1)], finish_reason="length"), 10, "e")
    check_generation(Generation(token_ids=[1], logprobs=[-1.0], finish_reason="stop", weight_versions=[0, 1]),
                     10, "e", versions=False)
    with pytest.raises(EngineError, match="weight versions"):
        check_generation(Generation(token_ids=[1], logprobs=[-1.0], finish_reason="stop", weight_versions=[0, 1]),
                         10, "e")
    with pytest.raises(EngineError, match="infinite"):
        check_generation(Generation(token_ids=[1], logprobs=[float("-inf")], finish_reason="stop"), 10, "e")


# -- timeouts cancel the engine's work ----------------------------------------------------------------


def _hanging_scripted(workers: int) -> tuple[Any, threading.Event, list[str]]:
    """A scripted engine whose forward pass on a "hang" script blocks until the event is set;
    the list collects the text of every pass that ran."""
    engine = make_engine("scripted", "tiny", workers=workers)
    release = threading.Event()
    real = engine._score
    ran: list[str] = []

    def score(prompt, ids, top):
        text = engine.tokenizer.decode(ids)
        ran.append(text)
        if "hang" in text:
            release.wait(20)
        return real(prompt, ids, top)

    engine._score = score
    return engine, release, ran


def test_a_timed_out_scripted_pass_does_not_hold_up_the_next_call(tmp_path):
    """The first call's forward pass hangs (held on an event) past the engine timeout: 504. The
    next calls run in the engine's other workers and answer at once; once the hung pass ends, its
    result is thrown away."""
    engine, release, _ = _hanging_scripted(workers=2)
    try:
        with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", engine_timeout=0.5) as gw:
            ro = gw.create_rollout("g")
            client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(model="m", messages=USER, extra_body={"script": "hang"})
            assert info.value.status_code == 504
            t0 = time.monotonic()
            for k in range(3):
                r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{k}"}])
                assert r.choices[0].finish_reason == "stop"
            assert time.monotonic() - t0 < 0.5 * 3, "the next calls waited for the hung pass"
            release.set()
            time.sleep(0.2)
            statuses = [c.status for c in gw.ledger.calls(ro["rollout_id"])]
            assert statuses == ["failed", "completed", "completed", "completed"]
    finally:
        release.set()
        asyncio.run(engine.aclose())


def test_a_cancelled_scripted_call_that_has_not_started_never_runs():
    engine, release, ran = _hanging_scripted(workers=1)
    p = engine.tokenizer.encode("hi", add_special_tokens=False)

    async def main():
        hung = asyncio.ensure_future(engine.generate(p, SamplingParams(), hints={"script": "hang"}))
        await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError):  # queued behind the hung pass in the one worker
            await asyncio.wait_for(engine.generate(p, SamplingParams(), hints={"script": "queued"}), 0.2)
        release.set()
        await hung
        after = await engine.generate(p, SamplingParams(), hints={"script": "after"})
        return after

    try:
        after = asyncio.run(main())
        assert engine.tokenizer.decode(after.token_ids[:-1]) == "after"
        assert not any("queued" in t for t in ran), ran
    finally:
        release.set()
        asyncio.run(engine.aclose())


def test_a_timed_out_hf_generation_is_dropped_by_the_engine(tmp_path):
    """The hf engine drops a cancelled request at its next step: after the 504, the engine stops
    stepping for it, and the next call runs alone."""
    engine = make_engine("hf", "tiny", max_batch=4)
    try:
        with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", engine_timeout=0.5) as gw:
            ro = gw.create_rollout("g")
            client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            with pytest.raises(openai.APIStatusError) as info:
                # greedy on "a" does not stop early (tests/engines/test_hf.py); 5000 tokens take seconds
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}],
                                               temperature=0, max_tokens=5000)
            assert info.value.status_code == 504
            time.sleep(0.2)
            steps = len(engine.step_batch_sizes)
            time.sleep(0.5)
            assert len(engine.step_batch_sizes) == steps, "the engine kept generating the timed-out request"
            engine.step_batch_sizes.clear()
            r = client.chat.completions.create(model="m", messages=USER, max_tokens=4, seed=1)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert set(engine.step_batch_sizes) == {1}
            (failed, ok) = gw.ledger.calls(ro["rollout_id"])
            assert failed.status == "failed" and "timed out" in failed.error and ok.status == "completed"
    finally:
        asyncio.run(engine.aclose())


def test_a_refusal_by_the_engine_keeps_its_400(gw, tamper):
    """An engine that refuses the request as the caller's fault (a server's 400) stays a 400."""
    from rowgrove.errors import BadRequest

    ro = gw.create_rollout("g-refused")

    def refuse(gen):
        raise BadRequest("the prompt is longer than the model's context")

    tamper.edit = refuse
    before = dump_ledger(gw.ledger_path)
    try:
        with pytest.raises(openai.BadRequestError):
            OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0).chat.completions.create(
                model="m", messages=USER)
    finally:
        tamper.edit = None
    assert dump_ledger(gw.ledger_path) != before  # the call was begun, then failed
    (call,) = gw.ledger.calls(ro["rollout_id"])
    assert call.status == "failed" and call.error.startswith("BadRequest:")


# -- a real inference server failing under the gateway -------------------------------------------

SERVER_FAULTS = [("cut", 502, "engine_failed"), ("hang", 504, "engine_timeout"),
                 ("500", 502, "engine_failed"), ("bad_id", 502, "engine_failed"),
                 ("short_logprobs", 502, "engine_failed")]


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def served(request, tmp_path_factory):
    """The gateway in front of a vLLM or SGLang stand-in (real HTTP both ways, streaming from the
    server), engine timeout 1 s so a hang is quick."""
    from rowgrove.engines import make_engine
    from rowgrove.standins import start_standin

    with start_standin(request.param, "tiny") as server:
        engine = make_engine(request.param, "tiny", url=server.url, timeout=1.0)
        with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("served") / "l.db") as gw:
            yield server, gw


@pytest.mark.parametrize(("fault", "status", "code"), SERVER_FAULTS, ids=[f[0] for f in SERVER_FAULTS])
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_a_server_that_dies_mid_stream_or_hangs_is_never_reward_0(served, fault, status, code, stream):
    """Call 1 is answered; the server then fails call 2 (dies mid-stream, hangs, 500s, or answers
    ids outside the vocabulary / too few logprobs). The harness sees a 5xx in OpenAI's shape, the
    call is `failed` with nothing stored, and when the harness gives up and finishes with reward 0
    the rollout is invalid (`infra_failure`) — never a valid row with reward 0."""
    from rowgrove.assemble import build_rows

    server, gw = served
    ro = gw.create_rollout("g-served")
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    first = client.chat.completions.create(model="tiny", messages=USER, max_tokens=4)
    # the assistant message as the SDK returned it (a random model's 4 tokens may parse into
    # reasoning or a tool call; its content alone would then match no call)
    history = USER + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "user", "content": "and then?"}]
    server.fault(fault)
    try:
        with pytest.raises(openai.APIStatusError) as info:
            answer = client.chat.completions.create(model="tiny", messages=history, max_tokens=4, stream=stream)
            if stream:
                list(answer)
    finally:
        server.fault(None)
    assert info.value.status_code == status
    assert info.value.response.json()["error"]["code"] == code
    calls = gw.ledger.calls(ro["rollout_id"])
    assert [c.status for c in calls] == ["completed", "failed"]
    assert len(calls[1].sampled_ids) == 0
    gw.finish(ro["rollout_id"], messages=history[:2], reward=0.0)
    built = build_rows(gw.ledger.get_rollout(ro["rollout_id"]), gw.ledger.calls(ro["rollout_id"]))
    assert built.rows and not any(r.valid for r in built.rows)
    assert set(built.reason_kinds) == {"infra_failure"}
