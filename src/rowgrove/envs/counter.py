"""The `counter` task: reach a target total with `add(n)`, n in {1, 2, 3}, within a few calls.

It is built so that GRPO moves the 2-layer x 64-hidden tiny model within minutes on a CPU:
- targets 9..15 with 5 calls: reaching them needs mostly `add(3)`, a preference a uniform policy
  lacks and GRPO finds in a few steps (always `add(3)` scores about 0.67 against random's 0.49);
- the rest of the way to 1.0 needs the observation: every observation ends with `need K` and the
  expert's choice is `add(K)` when K <= 3, else `add(3)`. The deciding token (` K`) is the token
  the model writes as the argument (`{"n": K}`), but learning that copy takes the tiny model far
  more updates than the demo has (measured: its probability stays near chance after 20 steps);
- it is multi-turn (the expert needs 3..5 calls), so compaction policies trigger and one rollout
  becomes several rows;
- the reward is dense: 1.0 for landing exactly on the target, else partial credit
  0.5 * (1 - |target - total| / target) for getting close (overshoot or running out of calls).

A random policy (uniform n) scores about 0.49 on average and lands exactly about 17% of the
time; always `add(3)` scores about 0.67 (42% exact); the expert always lands (reward 1.0).
`make_counter_tasks(low=, high=, max_calls=)` sets another range. See `tests/envs`.
"""

from __future__ import annotations

import random
from typing import Any

from rowgrove.envs.base import Env, StepResult, Task, tool_schema

ADD_CHOICES = (1, 2, 3)

TOOLS: list[dict[str, Any]] = [
    tool_schema("add", "Add n to the total.",
                {"n": {"type": "integer", "enum": list(ADD_CHOICES)}}, ["n"]),
]


def make_counter_tasks(n: int, seed: int, *, low: int = 9, high: int = 15, max_calls: int = 5) -> list[Task]:
    """`n` counter tasks with targets drawn uniformly from [low, high] by `seed`."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        target = rng.randint(low, high)
        prompt = f"Reach {target} with add. total 0, need {target}"
        tasks.append(Task(task_id=f"counter-{seed}-{i}", prompt=prompt, tools=TOOLS, answer=target,
                          data={"max_calls": max_calls}))
    return tasks


def counter_reward(target: int, total: int) -> float:
    """1.0 on the target; else 0.5 * closeness, closeness = max(0, 1 - |target - total| / target)."""
    if total == target:
        return 1.0
    return 0.5 * max(0.0, 1.0 - abs(target - total) / target)


class CounterEnv(Env):
    """Reach `task.answer` by adding 1, 2 or 3 per call; done on reaching or passing the target
    or after `task.data["max_calls"]` calls."""

    name = "counter"
    tools = TOOLS

    def __init__(self) -> None:
        self.target = 0
        self.total = 0
        self.calls = 0
        self.max_calls = 0
        self.done = False
        self._started = False

    def reset(self, task: Task) -> str:
        self.target = int(task.answer)
        self.total = 0
        self.calls = 0
        self.max_calls = int(task.data.get("max_calls", 5))
        self.done = False
        self._started = True
        return task.prompt

    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        self._require_started(self._started)
        if self.done:
            return StepResult("episode is over", True, self.reward(), {"total": self.total})
        self.total += int(arguments["n"])
        self.calls += 1
        need = self.target - self.total
        if need == 0:
            obs, self.done = f"total {self.total}, reached {self.target}", True
        elif need < 0:
            obs, self.done = f"total {self.total}, over by {-need}", True
        elif self.calls >= self.max_calls:
            obs, self.done = f"total {self.total}, need {need}, out of calls", True
        else:
            obs = f"total {self.total}, need {need}"
        return StepResult(obs, self.done, self.reward(), {"total": self.total, "target": self.target})

    def reward(self) -> float:
        self._require_started(self._started)
        return counter_reward(self.target, self.total)

    def expert_action(self) -> tuple[str, dict[str, Any]]:
        return "add", {"n": min(self.target - self.total, ADD_CHOICES[-1])}

    def random_action(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        return "add", {"n": rng.choice(ADD_CHOICES)}
