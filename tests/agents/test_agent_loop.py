"""The reference harness loop against a hand-written fake client: rejection and bounded
resampling, compaction contexts, the accepted record, and that no assistant text is invented."""

from __future__ import annotations

import asyncio
import json

import pytest
from agent_fakes import FakeClient, text_reply, tool_reply

from rowgrove.agents import COLLAPSED, AgentConfig, run_episode
from rowgrove.envs import make_env, make_tasks
from rowgrove.envs.base import Task
from rowgrove.envs.counter import TOOLS
from rowgrove.errors import InputError


def counter_task(target: int, max_calls: int = 6) -> Task:
    return Task(task_id=f"t{target}", prompt=f"Reach {target} with add. total 0, need {target}", tools=TOOLS,
                answer=target, data={"max_calls": max_calls})


def run(client, task, config, **kw):
    return asyncio.run(run_episode(client, make_env("counter"), task, config, **kw))


def assistant_turns(messages):
    return [m for m in messages if m["role"] == "assistant"]


def test_expert_episode_reaches_target_and_record_is_the_conversation():
    replies = [tool_reply("add", {"n": 3}, call_id=f"c{i}") for i in range(2)] + [tool_reply("add", {"n": 1}, call_id="c2")]
    client = FakeClient(replies)
    res = run(client, counter_task(7), AgentConfig(max_actions=6))
    assert res.reward == 1.0 and res.actions == 3 and res.rejected == 0 and res.calls == 3
    assert res.info["end"] == "done" and res.valid
    roles = [m["role"] for m in res.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    # accepted assistant messages are exactly the returned ones (None fields dropped), in order
    expected = [{k: v for k, v in r.items() if v is not None} for r in replies]
    assert assistant_turns(res.messages) == expected
    assert [m["tool_call_id"] for m in res.messages if m["role"] == "tool"] == ["c0", "c1", "c2"]
    assert res.messages[-1]["content"] == "total 7, reached 7"
    # without compaction every request extends the previous one by [assistant, tool]
    for prev, nxt in zip(client.requests, client.requests[1:], strict=False):
        assert nxt["messages"][: len(prev["messages"])] == prev["messages"]
    assert client.requests[0]["tools"] == TOOLS
    assert client.requests[0]["model"] == "policy"


@pytest.mark.parametrize("bad", [
    text_reply("I think 3"),                              # no tool call
    tool_reply("multiply", {"n": 3}),                     # unknown tool
    tool_reply("add", '{"n": 3'),                         # arguments not JSON
    tool_reply("add", {"n": 5}),                          # task rule: n in {1, 2, 3}
    tool_reply("add", {"n": "3"}),                        # wrong type
    tool_reply("add", {}),                                # missing argument
])
def test_rejected_response_is_resampled_with_the_same_request_and_never_recorded(bad):
    client = FakeClient([bad, tool_reply("add", {"n": 2}), tool_reply("add", {"n": 2})])
    res = run(client, counter_task(4), AgentConfig(max_resamples=2))
    assert res.rejected == 1 and res.actions == 2 and res.reward == 1.0
    assert client.requests[0]["messages"] == client.requests[1]["messages"]  # the same request again
    bad_clean = {k: v for k, v in bad.items() if v is not None}
    assert all(bad_clean not in req["messages"] for req in client.requests)
    assert bad_clean not in res.messages
    assert len(assistant_turns(res.messages)) == 2
    assert res.info["rejections"] and isinstance(res.info["rejections"][0], str)


def test_resamples_are_bounded_and_exhaustion_ends_without_injected_text():
    client = FakeClient(lambda req: text_reply("no"))
    res = run(client, counter_task(9), AgentConfig(max_resamples=3))
    assert res.calls == 4 and res.rejected == 4 and res.actions == 0
    assert res.info["end"] == "resamples_exhausted"
    assert res.messages == [{"role": "user", "content": counter_task(9).prompt}]  # nothing invented
    assert res.reward == 0.0


@pytest.mark.parametrize("on_exhausted, valid", [("invalid", False), ("score", True)])
def test_exhaustion_after_progress_keeps_partial_reward(on_exhausted, valid):
    replies = [tool_reply("add", {"n": 3})] + [text_reply("x")] * 2
    res = run(FakeClient(replies), counter_task(6), AgentConfig(max_resamples=1, on_exhausted=on_exhausted))
    assert res.actions == 1 and res.rejected == 2 and res.info["end"] == "resamples_exhausted"
    assert res.reward == pytest.approx(0.5 * 3 / 6)
    assert [m["role"] for m in res.messages] == ["user", "assistant", "tool"]
    # masked by default: its reward was decided by responses that are never trained
    assert res.valid is valid


def test_unknown_on_exhausted_is_refused():
    with pytest.raises(ValueError, match="unknown on_exhausted 'drop'"):
        AgentConfig(on_exhausted="drop")


def test_max_actions_ends_the_episode():
    client = FakeClient(lambda req: tool_reply("add", {"n": 1}))
    res = run(client, counter_task(12, max_calls=10), AgentConfig(max_actions=3))
    assert res.actions == 3 and res.calls == 3 and res.info["end"] == "max_actions"
    assert res.reward == pytest.approx(0.5 * 3 / 12)


def test_keep_last_rounds_rewrites_the_context_but_keeps_the_whole_record():
    client = FakeClient(lambda req: tool_reply("add", {"n": 1}, call_id=f"c{len(req['messages'])}"))
    cfg = AgentConfig(max_actions=5, compaction="keep_last_rounds", keep_rounds=1, every_k=2)
    res = run(client, counter_task(5), cfg)
    ctx = [r["messages"] for r in client.requests]
    user = {"role": "user", "content": counter_task(5).prompt}
    # calls 1, 2, 3 grow the context; after action 2 only the last round is kept
    assert [len(c) for c in ctx] == [1, 3, 4, 6, 4]
    assert ctx[2][0] == user and ctx[2][1] == {"role": "user", "content": "[1 earlier rounds omitted]"}
    assert ctx[2][2:] == res.messages[3:5]  # round 2, unchanged
    assert ctx[4][1] == {"role": "user", "content": "[3 earlier rounds omitted]"}
    assert res.compactions == 2 and res.actions == 5 and res.reward == 1.0
    assert len(assistant_turns(res.messages)) == 5  # the record spans all compactions
    assert res.messages[0] == user


def test_collapse_env_hides_old_tool_outputs_only():
    client = FakeClient(lambda req: tool_reply("add", {"n": 1}))
    cfg = AgentConfig(max_actions=4, compaction="collapse_env", every_k=1)
    res = run(client, counter_task(4), cfg)
    last = client.requests[-1]["messages"]
    tools = [m["content"] for m in last if m["role"] == "tool"]
    assert tools == [COLLAPSED, COLLAPSED, "total 3, need 1"]
    assert [m for m in last if m["role"] == "assistant"] == assistant_turns(res.messages)[:3]
    assert [m["content"] for m in res.messages if m["role"] == "tool"] == [
        "total 1, need 3", "total 2, need 2", "total 3, need 1", "total 4, reached 4"]
    # after the first action there is only one round: nothing to collapse, no rewrite counted
    assert res.compactions == 2


def test_drop_reasoning_strips_old_reasoning_in_context_keeps_it_in_record():
    client = FakeClient(lambda req: tool_reply("add", {"n": 1}, reasoning=f"think {len(req['messages'])}"))
    cfg = AgentConfig(max_actions=4, compaction="drop_reasoning", every_k=2)
    res = run(client, counter_task(4), cfg)
    ctx = [r["messages"] for r in client.requests]
    assert all("reasoning_content" in m for m in ctx[1] if m["role"] == "assistant")
    assert not any("reasoning_content" in m for m in ctx[2] if m["role"] == "assistant")
    assert [("reasoning_content" in m) for m in ctx[3] if m["role"] == "assistant"] == [False, False, True]
    assert all(m["reasoning_content"].startswith("think") for m in assistant_turns(res.messages))
    assert res.compactions == 1  # after action 4 the episode is done


def test_drop_reasoning_without_reasoning_is_no_rewrite():
    client = FakeClient(lambda req: tool_reply("add", {"n": 1}))
    res = run(client, counter_task(4), AgentConfig(max_actions=4, compaction="drop_reasoning", every_k=1))
    assert res.compactions == 0
    for prev, nxt in zip(client.requests, client.requests[1:], strict=False):
        assert nxt["messages"][: len(prev["messages"])] == prev["messages"]


def test_extra_body_callable_gets_action_and_attempt_and_system_prompt_goes_first():
    seen = []

    def extra(action, attempt):
        seen.append((action, attempt))
        return {"script": f"{action}.{attempt}"}

    replies = [text_reply("x"), tool_reply("add", {"n": 3}), tool_reply("add", {"n": 1})]
    client = FakeClient(replies)
    res = run(client, counter_task(4), AgentConfig(system_prompt="Be brief."), extra_body=extra)
    assert seen == [(0, 0), (0, 1), (1, 0)]
    assert [r["extra_body"]["script"] for r in client.requests] == ["0.0", "0.1", "1.0"]
    assert res.messages[0] == {"role": "system", "content": "Be brief."}
    assert all(r["temperature"] == 1.0 and r["max_tokens"] == 64 for r in client.requests)


def test_lookup_episode_through_the_loop():
    task = make_tasks("lookup", 1, seed=4)[0]
    a, b = task.data["asked"]
    replies = [tool_reply("lookup", {"item": a}), tool_reply("lookup", {"item": "durian"}),
               tool_reply("lookup", {"item": b}), tool_reply("answer", {"value": task.answer})]
    res = asyncio.run(run_episode(FakeClient(replies), make_env("lookup"), task, AgentConfig()))
    assert res.reward == 1.0 and res.rejected == 1 and res.actions == 3
    assert json.loads(assistant_turns(res.messages)[-1]["tool_calls"][0]["function"]["arguments"]) == {"value": task.answer}


@pytest.mark.parametrize("kw", [{"compaction": "summarize"}, {"every_k": 0}, {"max_resamples": -1}, {"max_actions": 0}])
def test_config_refuses_bad_values(kw):
    with pytest.raises(InputError):
        AgentConfig(**kw)
