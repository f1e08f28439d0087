"""The environments: rewards are verifiable (expert gets the maximum, random less), schemas reject
what they should, and the warm-up transcripts are valid OpenAI messages the chat templates render."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.envs import (ENV_NAMES, check_arguments, counter_reward, make_env, make_tasks, play, synth_transcripts,
                           task_corpus)
from rowgrove.envs.counter import TOOLS as COUNTER_TOOLS
from rowgrove.errors import InputError


def mean_reward(name: str, policy: str, n: int = 300, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    env = make_env(name)
    rewards = [play(env, t, policy, rng)[1] for t in make_tasks(name, n, seed)]
    return sum(rewards) / n, sum(r == 1.0 for r in rewards) / n


@pytest.mark.parametrize("name", ENV_NAMES)
def test_expert_gets_max_reward_random_gets_clearly_less(name):
    assert mean_reward(name, "expert") == (1.0, 1.0)
    rand_mean, rand_exact = mean_reward(name, "random")
    noisy_mean, _ = mean_reward(name, "noisy")
    assert rand_mean < 0.75 and rand_exact < 0.5
    assert rand_mean < noisy_mean < 1.0


def test_counter_random_policy_numbers_documented():
    # pinned in the counter module docstring and docs/agents.md: random ~0.49 mean, ~17% exact
    rand_mean, rand_exact = mean_reward("counter", "random", n=2000)
    assert 0.44 < rand_mean < 0.54 and 0.12 < rand_exact < 0.22


def test_counter_rewards_a_preference_for_three_before_it_rewards_reading():
    # what GRPO finds first in the demo: always add(3) beats uniform, the expert beats both
    env = make_env("counter")
    rewards = []
    for task in make_tasks("counter", 2000, 0):
        env.reset(task)
        while not env.done:
            env.step("add", {"n": 3})
        rewards.append(env.reward())
    three = sum(rewards) / len(rewards)
    assert 0.62 < three < 0.72 and three > mean_reward("counter", "random", n=2000)[0] + 0.1


def test_counter_expert_is_multi_turn():
    calls = [sum(m["role"] == "assistant" for m in msgs) for msgs in synth_transcripts("counter", 200, 1, "expert")]
    assert min(calls) >= 3 and max(calls) <= 5
    calls = [sum(m["role"] == "assistant" for m in msgs) for msgs in synth_transcripts("counter", 200, 1, "random")]
    assert max(calls) == 5


@given(target=st.integers(1, 30), total=st.integers(0, 40))
@settings(max_examples=50, deadline=None)
def test_counter_reward_bounds_and_exactness(target, total):
    r = counter_reward(target, total)
    assert 0.0 <= r <= 1.0
    assert (r == 1.0) == (total == target)
    assert r <= 0.5 or total == target


def test_counter_steps_and_observations():
    env = make_env("counter")
    task = make_tasks("counter", 1, 0)[0]
    assert env.reset(task) == task.prompt and task.prompt.endswith(f"need {task.answer}")
    target = task.answer
    r = env.step("add", {"n": 3})
    assert r.observation == f"total 3, need {target - 3}" and not r.done
    assert r.reward == env.reward() == counter_reward(target, 3)


def test_lookup_rewards_partial_credit_for_lookups():
    task = make_tasks("lookup", 1, 7)[0]
    env = make_env("lookup")
    env.reset(task)
    a, b = task.data["asked"]
    assert env.step("lookup", {"item": a}).observation == f"{a} = {task.data['prices'][a]}"
    assert env.reward() == pytest.approx(0.125)
    env.step("lookup", {"item": b})
    r = env.step("answer", {"value": task.answer + 1})
    assert r.done and r.observation == "wrong" and r.reward == pytest.approx(0.25)


@pytest.mark.parametrize(("args", "ok"), [
    ({"n": 2}, True), ({"n": 4}, False), ({"n": True}, False), ({"n": 2.0}, False), ({}, False),
    ({"n": 1, "m": 1}, False), ([1], False),
])
def test_check_arguments(args, ok):
    assert (check_arguments(COUNTER_TOOLS[0], args) is None) == ok


def test_check_action_names_unknown_tool():
    reason = make_env("counter").check_action("sub", {"n": 1})
    assert reason is not None and "sub" in reason and "add" in reason


def test_make_env_and_tasks_refuse_unknown_names():
    with pytest.raises(InputError, match="counter"):
        make_env("chess")
    with pytest.raises(InputError, match="lookup"):
        make_tasks("chess", 3)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_tasks_and_transcripts_are_deterministic(name):
    assert make_tasks(name, 5, 3) == make_tasks(name, 5, 3)
    assert make_tasks(name, 5, 3) != make_tasks(name, 5, 4)
    assert synth_transcripts(name, 4, 2, "noisy") == synth_transcripts(name, 4, 2, "noisy")


@pytest.mark.parametrize("name", ENV_NAMES)
def test_transcripts_are_valid_openai_messages(name):
    for msgs in synth_transcripts(name, 20, 0, "noisy", system_prompt="sys"):
        assert msgs[0] == {"role": "system", "content": "sys"} and msgs[1]["role"] == "user"
        pending = None
        for m in msgs[2:]:
            if m["role"] == "assistant":
                assert pending is None
                (tc,) = m["tool_calls"]
                assert tc["type"] == "function" and isinstance(json.loads(tc["function"]["arguments"]), dict)
                assert make_env(name).check_action(tc["function"]["name"], json.loads(tc["function"]["arguments"])) is None
                pending = tc["id"]
            else:
                assert m["role"] == "tool" and m["tool_call_id"] == pending
                pending = None
        assert msgs[-1]["role"] == "tool"


def test_transcripts_render_with_the_tiny_chatml_template_as_hermes_tool_calls():
    from rowgrove.model.load import load_tokenizer
    from rowgrove.toolcalls import format_tool_call, parse_assistant_text

    tok = load_tokenizer("tiny")
    msgs = synth_transcripts("counter", 1, 0, "expert")[0]
    text = tok.apply_chat_template(msgs, tools=COUNTER_TOOLS, tokenize=False)
    for m in msgs:
        if m["role"] == "assistant":
            fn = m["tool_calls"][0]["function"]
            call = format_tool_call(fn["name"], json.loads(fn["arguments"]))
            assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
            parsed = parse_assistant_text(call)
            assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in parsed.tool_calls] == [
                (fn["name"], json.loads(fn["arguments"]))]
        elif m["role"] == "tool":
            assert f"<tool_response>\n{m['content']}\n</tool_response>" in text


def test_task_corpus_covers_prompts_and_tool_call_text():
    corpus = task_corpus("counter", 20, 0)
    assert any(s.startswith("Reach ") for s in corpus)
    assert any(s.startswith('<tool_call>\n{"name": "add", "arguments": {"n": ') for s in corpus)
    assert all(isinstance(s, str) and s for s in corpus)
