"""The reference harness end to end: official `openai` SDK → real gateway over loopback HTTP →
scripted engine (replies chosen per call through `extra_body={"script": ...}`)."""

from __future__ import annotations

import asyncio

import pytest

from rowgrove.agents import AgentConfig, RolloutJob, run_rollout, run_rollouts_concurrently
from rowgrove.envs import make_env, make_tasks
from rowgrove.envs.base import Task
from rowgrove.envs.counter import TOOLS
from rowgrove.toolcalls import format_tool_call


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from rowgrove.gateway.testing import start_gateway

    with start_gateway("tiny", engine="scripted", ledger=tmp_path_factory.mktemp("agents") / "ledger.db") as handle:
        yield handle


def add_one(action: int, attempt: int) -> dict[str, str]:
    return {"script": format_tool_call("add", {"n": 1})}


def test_compaction_rollout_has_several_roots_and_retry_is_a_sibling(gw):
    task = Task("t5", "Reach 5 with add. total 0, need 5", TOOLS, 5, {"max_calls": 6})

    def script(action: int, attempt: int) -> dict[str, str]:
        if action == 1 and attempt == 0:
            return {"script": "no tool call here"}
        return add_one(action, attempt)

    cfg = AgentConfig(max_actions=6, compaction="keep_last_rounds", keep_rounds=1, every_k=2)
    res = asyncio.run(run_rollout(gw.url, "g-compact", make_env("counter"), task, cfg, extra_body=script))
    assert res.reward == 1.0 and res.actions == 5 and res.rejected == 1 and res.compactions == 2
    calls = gw.lineage(res.info["rollout_id"])["calls"]
    assert len(calls) == 6
    roots = [c["ordinal"] for c in calls if c["root"]]
    # call 1 root; 2 (rejected) and 3 (its retry) continue 1; compaction after actions 2 and 4
    assert roots == [1, 4, 6]
    by_ord = {c["ordinal"]: c for c in calls}
    assert by_ord[2]["parent_id"] == by_ord[3]["parent_id"] == by_ord[1]["id"]
    assert by_ord[5]["parent_id"] == by_ord[4]["id"]
    # the gateway accepted the finish: the record matched the calls
    rows = gw.rows(res.info["rollout_id"])["rows"]
    assert len(rows) == 3
    assert {r["reward"] for r in rows} == {1.0}


def test_no_compaction_rollout_is_one_chain(gw):
    task = Task("t3", "Reach 3 with add. total 0, need 3", TOOLS, 3, {"max_calls": 6})
    res = asyncio.run(run_rollout(gw.url, "g-plain", make_env("counter"), task, AgentConfig(), extra_body=add_one))
    calls = gw.lineage(res.info["rollout_id"])["calls"]
    assert [c["root"] for c in calls] == [True, False, False]
    assert len(gw.rows(res.info["rollout_id"])["rows"]) == 1


def test_rollouts_run_concurrently_in_job_order(gw):
    tasks = make_tasks("counter", 2, seed=11)
    jobs = [RolloutJob(f"g{i % 2}", make_env("counter"), t, AgentConfig(compaction="collapse_env", every_k=1),
                       extra_body=add_one) for i, t in enumerate(tasks * 2)]
    results = asyncio.run(run_rollouts_concurrently(gw.url, jobs, concurrency=4))
    assert [r.info["task_id"] for r in results] == [t.task_id for t in tasks * 2]
    assert len({r.info["rollout_id"] for r in results}) == 4
    for r, t in zip(results, tasks * 2, strict=True):
        assert r.valid and r.actions == min(t.answer, 5)
        assert gw.lineage(r.info["rollout_id"])["status"] != "open"
