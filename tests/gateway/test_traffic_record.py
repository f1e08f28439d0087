"""What a finish trains when the record is the traffic, repeats itself, or holds harness roles,
through the real gateway and the official `openai` SDK (docs/rows.md, "A finish with no record")."""

from __future__ import annotations

import openai
import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.gateway.testing import start_gateway


def _client(gw, ro) -> openai.OpenAI:
    base = gw.url + ro["base_url"] if ro["base_url"].startswith("/") else ro["base_url"]
    return openai.OpenAI(base_url=base, api_key=ro["api_key"], max_retries=0)


def _say(client, messages, text):
    out = client.chat.completions.create(model="m", messages=messages, extra_body={"script": text})
    return {"role": "assistant", "content": out.choices[0].message.content}, out.id


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("t") / "l.db") as g:
        g.engine = engine
        yield g


def _trained(out) -> int:
    return sum(sum(r["loss_mask"]) for r in out["rows"])


def test_two_windows_with_the_same_turns_each_claim_their_own_calls(gw):
    ro = gw.create_rollout("g")
    client = _client(gw, ro)
    convs = []
    for w in range(2):
        conv = [{"role": "system", "content": f"window {w}"}, {"role": "user", "content": "go"}]
        a, _ = _say(client, conv, "step one")
        conv += [a, {"role": "user", "content": "more"}]
        b, _ = _say(client, conv, "step two")
        convs.append([*conv, b])
    gw.finish(ro["rollout_id"], conversations=convs, reward=1.0)
    out = gw.rows(ro["rollout_id"])
    assert out["invalid_reason"] is None
    assert out["metrics"]["accepted_calls"] == 4 and len(out["rows"]) == 2


def test_no_record_trains_every_window_the_sub_agent_and_not_the_discarded_sample(gw):
    """A compaction (the summary call, then a new window), a sub-agent, and one resampled call
    the harness did not go on from; finished with `{"conversations": []}`."""
    ro = gw.create_rollout("g")
    client = _client(gw, ro)
    w1 = [{"role": "system", "content": "main"}, {"role": "user", "content": "task"}]
    a1, _ = _say(client, w1, "first look")
    w1 += [a1, {"role": "user", "content": "obs 1"}]
    a2, id2 = _say(client, w1, "second look")
    _, resampled = _say(client, w1, "a sample thrown away")    # same parent, same request
    w1 += [a2, {"role": "user", "content": "obs 2"}]
    a3, _ = _say(client, w1, "third look")
    w1 += [a3, {"role": "user", "content": "summarize the conversation so far"}]
    summary, _ = _say(client, w1, "summary: looked three times")
    w2 = [{"role": "system", "content": "main"},
          {"role": "user", "content": "This session is being continued. " + summary["content"]}]
    _say(client, w2, "fourth look")
    _say(client, [{"role": "system", "content": "sub-agent"}, {"role": "user", "content": "subtask"}], "sub done")
    gw.finish(ro["rollout_id"], conversations=[], reward=1.0)
    out = gw.rows(ro["rollout_id"])
    m = out["metrics"]
    assert out["invalid_reason"] is None and m["source"] == "traffic"
    assert m["calls"] == 7 and m["accepted_calls"] == 6 and m["superseded_calls"] == 1
    assert len(out["rows"]) == 3                          # window 1 + summary, window 2, sub-agent
    assert all(resampled not in r["call_ids"] for r in out["rows"]) and any(id2 in r["call_ids"] for r in out["rows"])
    # tokens exact: each row is the engine's own prompt for its leaf call, then only what the
    # engine sampled for it (all of it trained)
    for r in out["rows"]:
        ids = r["input_ids"]
        p = max((list(q) for q in gw.engine.prompts if len(q) < len(ids) and list(q) == ids[:len(q)]), key=len)
        assert all(r["loss_mask"][len(p):]) and sum(r["loss_mask"]) > len(ids) - len(p) - 1 >= 0
    assert m["delivered_fraction"] < 1.0 and m["rejected_calls"] == 1


def test_a_mini_swe_agent_record_with_an_exit_role_finishes_and_trains(gw):
    ro = gw.create_rollout("g")
    client = _client(gw, ro)
    msgs = [{"role": "system", "content": "you are a shell agent"}, {"role": "user", "content": "fix it"}]
    a, _ = _say(client, msgs, "THOUGHT: look\n```bash\nls\n```")
    msgs += [{**a, "extra": {"actions": ["ls"]}}, {"role": "user", "content": "<output>a.py</output>"}]
    b, _ = _say(client, msgs, "THOUGHT: done\n```bash\necho COMPLETE_TASK\n```")
    msgs += [{**b, "extra": {}}, {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}]
    gw.finish(ro["rollout_id"], messages=msgs, reward=1.0)
    out = gw.rows(ro["rollout_id"])
    assert out["invalid_reason"] is None and out["metrics"]["accepted_calls"] == 2
    assert out["metrics"]["harness_messages"] == 1 and len(out["rows"]) == 1
