"""Infrastructure failure is never reward 0: a failed or aborted call the rollout needed makes the
rollout invalid (`infra_failure`), unless a later completed call answered the same request. On
stand-in ledgers (exact control of statuses and request hashes) and through a real gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import openai
import pytest
from assemble_standin import assistant, logprob_of
from openai import OpenAI

from rowgrove.assemble import build_rows, read_calls, rollout_rows
from rowgrove.assemble.build import REASONS, needed_failures
from rowgrove.hashing import chain_hashes, chain_start, chain_step, message_hash
from rowgrove.ledger import Ledger

H0 = chain_start(None, None)


def user(text):
    return {"role": "user", "content": text}


def _write(ledger: Ledger, steps, record, reward: float) -> str:
    """steps: (call_id, parent_id, request_key_text, outcome, reply) with outcome "ok", or
    ("failed" | "aborted" | "pending", error). The request hash is that of [user(request)]."""
    ro = ledger.create_rollout("g")
    full: dict[str, int] = {}
    for k, (cid, parent, request, outcome, reply) in enumerate(steps):
        h = chain_hashes([user(request)], H0)[-1]
        prompt = [k + 1]
        plen = len(prompt) + (full[parent] if parent else 0)
        ledger.begin_call(ro.id, parent_id=parent, prompt_ids=prompt, prompt_len=plen, request_hash=h.hex(),
                          call_id=cid)
        if outcome == "ok":
            msg = assistant(reply)
            d = message_hash(msg)
            sampled = [100 + k]
            ledger.complete_call(cid, sampled_ids=sampled, logprobs=[logprob_of(t) for t in sampled],
                                 finish_reason="stop", summary_hash=chain_step(h, d).hex(), response_hash=d.hex(),
                                 response={"choices": [{"message": msg}]})
            full[cid] = plen + 1
        elif outcome[0] in ("failed", "aborted"):
            ledger.end_call(cid, outcome[0], outcome[1])
        # "pending": left as it is
    ledger.finish_rollout(ro.id, record, reward)
    return ro.id


def test_infra_failure_is_a_named_reason():
    assert "infra_failure" in REASONS


def test_a_504_then_finish_with_reward_0_is_invalid_naming_the_call(ledger):
    steps = [("c1", None, "q1", "ok", "a"),
             ("c2", "c1", "q2", ("failed", "engine timed out after 600 s"), None)]
    rid = _write(ledger, steps, {"messages": [user("q1"), assistant("a")]}, 0.0)
    rr = rollout_rows(ledger, rid)
    assert rr.reason_kinds == ["infra_failure"]
    assert "c2 (failed: engine timed out after 600 s)" in rr.invalid_reason
    (row,) = rr.rows
    assert not row.valid and "c2" in row.mask_reason and row.reward == 0.0


def test_a_504_then_a_successful_retry_of_the_same_request_is_valid(ledger):
    steps = [("c1", None, "q1", "ok", "a"),
             ("c2", "c1", "q2", ("failed", "engine timed out after 600 s"), None),
             ("c3", "c1", "q2", "ok", "b")]  # the retry: same request, completed
    rec = {"messages": [user("q1"), assistant("a"), user("q2"), assistant("b")]}
    rr = rollout_rows(ledger, _write(ledger, steps, rec, 1.0))
    assert rr.invalid_reason is None and [r.valid for r in rr.rows] == [True]
    assert rr.chains == [["c1", "c3"]]


def test_the_replacement_need_not_be_accepted(ledger):
    # the retry answered the request; the harness then resampled once more and kept c4
    steps = [("c1", None, "q", ("failed", "EngineError: boom"), None), ("c2", None, "q", "ok", "x"),
             ("c3", None, "q", "ok", "y")]
    rr = rollout_rows(ledger, _write(ledger, steps, {"messages": [user("q"), assistant("y")]}, 1.0))
    assert rr.invalid_reason is None


def test_a_different_request_after_the_failure_is_not_a_retry(ledger):
    steps = [("c1", None, "q1", "ok", "a"),
             ("c2", "c1", "q2", ("failed", "EngineError: boom"), None),
             ("c3", "c1", "q2 (the tool failed, try again)", "ok", "b")]
    rec = {"messages": [user("q1"), assistant("a"), user("q2 (the tool failed, try again)"), assistant("b")]}
    rr = rollout_rows(ledger, _write(ledger, steps, rec, 1.0))
    assert rr.reason_kinds == ["infra_failure"] and "c2" in rr.invalid_reason


def test_an_earlier_answer_does_not_cover_a_later_failure(ledger):
    # c1 answered q, the harness resampled q and that sample failed, then it gave up with reward 0
    steps = [("c1", None, "q", "ok", "a"), ("c2", None, "q", ("failed", "engine timed out"), None)]
    rr = rollout_rows(ledger, _write(ledger, steps, {"messages": [user("q"), assistant("a")]}, 0.0))
    assert rr.reason_kinds == ["infra_failure"] and "c2" in rr.invalid_reason


@pytest.mark.parametrize("outcome", [
    ("aborted", "server restarted while the call was in flight"),
    ("aborted", "client disconnected before the response"),
    ("aborted", "not delivered to the client: the client disconnected after 10 of 90 bytes of the stream were sent"),
    ("failed", "bad generation: the engine returned 1 logprobs that are not a number <= 0"),
    ("failed", "Unavailable: vllm server answered 503"),
    "pending",
], ids=["restart", "client-gone", "undelivered", "bad-generation", "engine-overloaded", "pending"])
def test_every_kind_of_infrastructure_failure_counts(ledger, outcome):
    steps = [("c1", None, "q1", "ok", "a"), ("c2", "c1", "q2", outcome, None)]
    rr = rollout_rows(ledger, _write(ledger, steps, {"messages": [user("q1"), assistant("a")]}, 0.0))
    assert "infra_failure" in rr.reason_kinds


def test_an_engine_refusal_of_the_request_is_not_an_infrastructure_failure(ledger):
    steps = [("c1", None, "q1", "ok", "a"),
             ("c2", "c1", "q2", ("failed", "BadRequest: vllm server answered 400: prompt too long"), None)]
    rr = rollout_rows(ledger, _write(ledger, steps, {"messages": [user("q1"), assistant("a")]}, 0.0))
    assert rr.invalid_reason is None


def test_a_finish_with_no_record_is_invalid_after_a_needed_failure(ledger):
    steps = [("c1", None, "q1", "ok", "a"), ("c2", "c1", "q2", ("aborted", "not delivered to the client: cut"), None)]
    rr = rollout_rows(ledger, _write(ledger, steps, None, 0.0))
    assert rr.metrics["source"] == "traffic" and rr.chains == [["c1"]]
    assert rr.reason_kinds == ["infra_failure"]


def test_needed_failures_lists_them_in_order(ledger):
    steps = [("c1", None, "a", ("failed", "x"), None), ("c2", None, "b", ("failed", "y"), None),
             ("c3", None, "a", "ok", "r"), ("c4", None, "c", ("aborted", "z"), None)]
    rid = _write(ledger, steps, None, 0.0)
    assert [c.id for c in needed_failures(read_calls(ledger, rid))] == ["c2", "c4"]
    ro = ledger.get_rollout(rid)
    assert "c1" not in build_rows(ro, read_calls(ledger, rid)).invalid_reason


# -- through a real gateway -------------------------------------------------------------------------


class FirstCallHangs:
    """The scripted engine, except that the first `hang` calls take `delay` seconds."""

    def __init__(self, inner: Any, hang: int, delay: float):
        self.inner, self.tokenizer, self.vocab_size = inner, inner.tokenizer, inner.vocab_size
        self.hang, self.delay = hang, delay

    async def generate(self, prompt_ids: Sequence[int], sampling: Any, *,
                       hints: Mapping[str, Any] | None = None):
        if self.hang > 0:
            self.hang -= 1
            await asyncio.sleep(self.delay)
        return await self.inner.generate(prompt_ids, sampling, hints=hints)

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def scripted():
    from rowgrove.engines import make_engine

    eng = make_engine("scripted", "tiny")
    yield eng
    asyncio.run(eng.aclose())


def test_through_the_gateway_a_504_then_reward_0_is_invalid(tmp_path, scripted):
    from rowgrove.gateway.testing import start_gateway

    engine = FirstCallHangs(scripted, hang=0, delay=5.0)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", engine_timeout=0.3) as gw:
        ro = gw.create_rollout("g")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        r1 = client.chat.completions.create(model="m", messages=[user("q1")])
        msgs = [user("q1"), r1.choices[0].message.model_dump(exclude_none=True), user("q2")]
        engine.hang = 1
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="m", messages=msgs)
        assert info.value.status_code == 504
        failed = gw.ledger.calls(ro["rollout_id"])[-1]
        gw.finish(ro["rollout_id"], messages=msgs[:2], reward=0.0)
        out = gw.rows(ro["rollout_id"])
        assert out["invalid_reason"] and failed.id in out["invalid_reason"] and "timed out" in out["invalid_reason"]
        assert [r["valid"] for r in out["rows"]] == [False]
        assert failed.id in out["rows"][0]["mask_reason"]


def test_through_the_gateway_the_sdks_retry_of_a_504_keeps_the_rollout_valid(tmp_path, scripted):
    from rowgrove.gateway.testing import start_gateway

    engine = FirstCallHangs(scripted, hang=0, delay=5.0)
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", engine_timeout=0.3) as gw:
        ro = gw.create_rollout("g")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=2)
        r1 = client.chat.completions.create(model="m", messages=[user("q1")])
        msgs = [user("q1"), r1.choices[0].message.model_dump(exclude_none=True), user("q2")]
        engine.hang = 1
        r2 = client.chat.completions.create(model="m", messages=msgs)  # 504, then the SDK retries
        calls = gw.ledger.calls(ro["rollout_id"])
        assert [c.status for c in calls] == ["completed", "failed", "completed"]
        assert calls[1].request_hash == calls[2].request_hash and calls[2].id == r2.id
        gw.finish(ro["rollout_id"], messages=msgs + [r2.choices[0].message.model_dump(exclude_none=True)],
                  reward=1.0)
        out = gw.rows(ro["rollout_id"])
        assert out["invalid_reason"] is None and [r["valid"] for r in out["rows"]] == [True]
