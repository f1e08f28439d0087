"""Synthetic transcripts for the supervised warm-up, and the text the tiny tokenizer must cover.

A random-init tiny model emits no tool calls, so the demo first fine-tunes it on transcripts of
the task written by a scripted policy. The transcripts use the exact message shapes the agent
harness sends and the gateway returns (OpenAI chat format: user, assistant with `tool_calls`,
tool, ...), so the warm-up teaches the *format* the harness will see.

Policies (what the warm-up teaches besides the format):
- "random": every action uniform over the valid ones. The warm-up teaches the format only; all
  of the task skill must come from RL. This is the clean split for reporting.
- "noisy": expert with probability `expert_prob`, else random: a mediocre policy.
- "expert": always the best action (for tests and upper bounds).

Transcripts end with the tool message of the last action: the harness makes no model call after
the environment says done, so there is no final assistant turn to imitate.
"""

from __future__ import annotations

import json
import random
from typing import Any

from rowgrove.envs.base import Env, Task
from rowgrove.errors import InputError

POLICIES = ("random", "noisy", "expert")


def tool_call_message(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """An assistant message holding one tool call, as the gateway returns it (arguments as the
    JSON string `json.dumps(arguments, ensure_ascii=False)`, which is what the templates write)."""
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }]}


def play(env: Env, task: Task, policy: str, rng: random.Random, *, expert_prob: float = 0.5,
         max_actions: int = 8, system_prompt: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """Play `task` in `env` with a scripted policy; (messages, final reward)."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    messages: list[dict[str, Any]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": env.reset(task)})
    for k in range(max_actions):
        use_expert = policy == "expert" or (policy == "noisy" and rng.random() < expert_prob)
        name, args = env.expert_action() if use_expert else env.random_action(rng)
        call_id = f"call_{k}"
        messages.append(tool_call_message(name, args, call_id))
        result = env.step(name, args)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result.observation})
        if result.done:
            break
    return messages, env.reward()


def synth_transcripts(env_name: str, n: int, seed: int, policy: str = "noisy", *, expert_prob: float = 0.5,
                      system_prompt: str | None = None) -> list[list[dict[str, Any]]]:
    """`n` OpenAI-format conversations of `env_name` tasks played by `policy` (see the module
    docstring), deterministic in `seed`. Tasks come from `make_tasks(env_name, n, seed)`."""
    from rowgrove.envs.registry import make_env, make_tasks

    rng = random.Random(seed)
    env = make_env(env_name, seed)
    return [play(env, task, policy, rng, expert_prob=expert_prob, system_prompt=system_prompt)[0]
            for task in make_tasks(env_name, n, seed)]


def task_corpus(env_name: str, n: int = 200, seed: int = 0) -> list[str]:
    """Sample strings of `env_name` (prompts, observations, tool-call JSON as the templates write
    it, the tool schemas) for `build_tiny_model(extra_corpus=...)`, so that the tokenizer's merges
    cover the task's words and numbers."""
    from rowgrove.envs.registry import make_env

    env = make_env(env_name, seed)
    out = [json.dumps(tool, ensure_ascii=False) for tool in env.tools]
    for messages in synth_transcripts(env_name, n, seed, policy="noisy"):
        for m in messages:
            if m["role"] in ("user", "tool"):
                out.append(m["content"])
            else:
                for tc in m["tool_calls"]:
                    fn = tc["function"]
                    out.append(f'<tool_call>\n{{"name": {json.dumps(fn["name"])}, "arguments": {fn["arguments"]}}}\n</tool_call>')
    return out
