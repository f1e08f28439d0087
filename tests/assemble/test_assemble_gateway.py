"""End to end: a harness drives the real gateway over loopback HTTP with the official openai SDK
(scripted engine on the tiny model), finishes with its record, and the rows are checked against
what the engine actually sampled (promise 1) and what the harness kept.

Scenarios: compaction (a rewrite starts a new root), rejections with identical retries, a
sub-agent conversation, parallel branches with a shared prefix, an injected answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI, OpenAI

from rowgrove.assemble import rollout_rows
from rowgrove.engines.base import Generation, SamplingParams


class RecordingEngine:
    """The scripted engine, remembering every generation it returned (ids and logprobs)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.generations: list[tuple[tuple[int, ...], tuple[float, ...]]] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        gen = await self.inner.generate(prompt_ids, sampling, hints=hints)
        self.generations.append((tuple(int(t) for t in gen.token_ids),
                                 tuple(float(np.float32(x)) for x in gen.logprobs)))
        return gen

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    import torch

    from rowgrove.engines import make_engine
    from rowgrove.gateway.testing import start_gateway

    torch.set_num_threads(1)
    engine = RecordingEngine(make_engine("scripted", "tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("gw") / "ledger.db") as handle:
        handle.recording = engine
        yield handle
    asyncio.run(engine.aclose())


def client(ro) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)


def ask(c: OpenAI, messages: list[dict], script: str | None = None) -> dict:
    extra = {"script": script} if script is not None else None
    r = c.chat.completions.create(model="tiny", messages=messages, logprobs=True, extra_body=extra)
    return r.choices[0].message.model_dump()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def check_exact(gw, rr) -> None:
    """Promise 1: every mask-1 run is one generation the engine returned, ids and logprobs alike,
    and every accepted call's generation is trained exactly once."""
    sampled = set(gw.recording.generations)
    runs = []
    for row in rr.rows:
        ids, mask, lps = (np.asarray(row.input_ids), np.asarray(row.loss_mask), np.asarray(row.logprobs))
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            run = (tuple(int(t) for t in ids[a:b]), tuple(float(x) for x in lps[a:b]))
            assert run in sampled, f"row {row.segment} trains tokens {run[0][:8]}… the engine never sampled"
            runs.append(run)
    assert len(runs) == len(rr.accepted)
    assert rr.metrics["trained_tokens"] == sum(len(r[0]) for r in runs)


def test_compaction_starts_a_new_root_and_a_new_row(gw):
    ro = gw.create_rollout("g-compact")
    c = client(ro)
    history = [user("count to three")]
    history.append(ask(c, history))                     # c1 root
    history.append(user("observation 1"))
    history.append(ask(c, history))                     # c2 continues c1
    # the harness compacts: a new context with a summary instead of the old turns (c3 root)
    compacted = [user("summary: counted to two"), user("go on")]
    record = history + compacted[:1]
    a3 = ask(c, compacted)
    compacted.append(a3)
    compacted.append(user("observation 3"))
    a4 = ask(c, compacted)                              # c4 continues c3
    record += [a3, user("observation 3"), a4]
    gw.finish(ro["rollout_id"], messages=record, reward=1.0)
    rr = rollout_rows(gw.ledger, ro["rollout_id"])
    calls = gw.ledger.calls(ro["rollout_id"])
    assert [x.parent_id is None for x in calls] == [True, False, True, False]
    assert rr.invalid_reason is None
    assert rr.chains == [[calls[0].id, calls[1].id], [calls[2].id, calls[3].id]]
    assert [r.segment for r in rr.rows] == [0, 1] and all(r.reward == 1.0 for r in rr.rows)
    check_exact(gw, rr)
    # the HTTP route gives the same rows
    body = gw.rows(ro["rollout_id"])
    assert [r["input_ids"] for r in body["rows"]] == [list(map(int, r.input_ids)) for r in rr.rows]


def test_rejections_with_identical_retries_train_only_the_kept_ones(gw):
    ro = gw.create_rollout("g-reject")
    c = client(ro)
    history = [user("solve it")]
    history.append(ask(c, history))                     # c1
    history.append(user("try"))
    ask(c, history, script="same answer")               # c2, rejected by the harness
    kept = ask(c, history, script="same answer")        # c3, identical text, kept
    history += [kept, user("and then")]
    history.append(ask(c, history))                     # c4 continues c3
    gw.finish(ro["rollout_id"], messages=history, reward=0.0)
    rr = rollout_rows(gw.ledger, ro["rollout_id"])
    ids = [x.id for x in gw.ledger.calls(ro["rollout_id"])]
    assert rr.invalid_reason is None
    assert rr.accepted == [ids[0], ids[2], ids[3]]
    assert rr.chains == [[ids[0], ids[2], ids[3]]]
    assert rr.metrics["rejected_calls"] == 1
    check_exact(gw, rr)


def test_sub_agent_conversation(gw):
    ro = gw.create_rollout("g-sub")
    c = client(ro)
    main = [user("plan the trip")]
    main.append(ask(c, main))                           # c1 main root
    sub = [user("sub-agent: find trains")]
    sub.append(ask(c, sub))                             # c2 sub-agent root
    sub.append(user("train list"))
    sub.append(ask(c, sub))                             # c3 sub continues c2
    main.append(user("sub-agent reports: " + sub[-1]["content"]))
    main.append(ask(c, main))                           # c4 main continues c1
    gw.finish(ro["rollout_id"], conversations=[main, sub], reward=1.0)
    rr = rollout_rows(gw.ledger, ro["rollout_id"])
    ids = [x.id for x in gw.ledger.calls(ro["rollout_id"])]
    assert rr.invalid_reason is None
    assert rr.chains == [[ids[0], ids[3]], [ids[1], ids[2]]]
    check_exact(gw, rr)


def test_parallel_branches_train_the_shared_prefix_once(gw):
    ro = gw.create_rollout("g-par")
    c = client(ro)
    prefix = [user("explore")]
    prefix.append(ask(c, prefix))                       # c1: shared by both branches

    async def branches():
        ac = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        convs = [prefix + [user(f"branch {k}")] for k in range(2)]
        outs = await asyncio.gather(*(ac.chat.completions.create(model="tiny", messages=m) for m in convs))
        await ac.close()
        return [m + [o.choices[0].message.model_dump()] for m, o in zip(convs, outs, strict=True)]

    convs = asyncio.run(branches())
    gw.finish(ro["rollout_id"], conversations=convs, reward=1.0)
    rr = rollout_rows(gw.ledger, ro["rollout_id"])
    calls = gw.ledger.calls(ro["rollout_id"])
    assert rr.invalid_reason is None and len(rr.rows) == 2
    assert all(ch[0] == calls[0].id for ch in rr.chains)
    first, second = rr.rows
    n1 = len(calls[0].prompt_ids)
    span = slice(n1, n1 + len(calls[0].sampled_ids))
    assert np.asarray(first.loss_mask)[span].all() and not np.asarray(second.loss_mask)[span].any()
    assert rr.metrics["trained_tokens"] == rr.metrics["generated_tokens"]
    check_exact(gw, rr)


def test_injected_answer_makes_the_rollout_invalid(gw):
    ro = gw.create_rollout("g-inject")
    c = client(ro)
    history = [user("what is 6*7")]
    history.append(ask(c, history))
    history += [user("final?"), {"role": "assistant", "content": "42 (written by the harness, not the model)"}]
    gw.finish(ro["rollout_id"], messages=history, reward=1.0)
    rr = rollout_rows(gw.ledger, ro["rollout_id"])
    assert rr.invalid_reason and "match no call" in rr.invalid_reason
    assert rr.rows and all(not r.valid and r.mask_reason == rr.invalid_reason for r in rr.rows)
    body = gw.rows(ro["rollout_id"])
    assert all(r["valid"] is False and "match no call" in r["mask_reason"] for r in body["rows"])
