"""The `lookup` task: answer a sum of hidden prices by looking each one up, then answering.

Tools: `lookup(item)` returns `item = price` from a hidden table of a few items (an unknown item
is rejected by the schema's enum); `answer(value)` ends the episode. Reward: 1.0 for the right
sum; a wrong answer earns 0.25 x the fraction of the asked items that were looked up, so looking
things up is rewarded before the arithmetic is right. The expert looks up each asked item once
and answers the sum (3 calls for 2 items); a budget of `max_calls` calls ends the episode with the
partial credit if no answer came.
"""

from __future__ import annotations

import random
from typing import Any

from rowgrove.envs.base import Env, StepResult, Task, tool_schema

ITEMS = ("apple", "pear", "plum", "fig", "lime", "kiwi")


def lookup_tools(items: tuple[str, ...] = ITEMS) -> list[dict[str, Any]]:
    """The two tools, with `item` restricted to `items`."""
    return [
        tool_schema("lookup", "Look up the price of an item.",
                    {"item": {"type": "string", "enum": list(items)}}, ["item"]),
        tool_schema("answer", "Give the final answer and end.", {"value": {"type": "integer"}}, ["value"]),
    ]


TOOLS = lookup_tools()


def make_lookup_tasks(n: int, seed: int, *, asked: int = 2, max_calls: int = 5) -> list[Task]:
    """`n` tasks: prices 1..9 for every item, `asked` distinct items to sum, drawn by `seed`."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        prices = {item: rng.randint(1, 9) for item in ITEMS}
        keys = rng.sample(ITEMS, asked)
        prompt = "What is " + " + ".join(keys) + "? Use lookup, then answer."
        tasks.append(Task(task_id=f"lookup-{seed}-{i}", prompt=prompt, tools=TOOLS,
                          answer=sum(prices[k] for k in keys),
                          data={"prices": prices, "asked": keys, "max_calls": max_calls}))
    return tasks


class LookupEnv(Env):
    """Look up the asked items' prices and answer their sum."""

    name = "lookup"
    tools = TOOLS

    def __init__(self) -> None:
        self.prices: dict[str, int] = {}
        self.asked: list[str] = []
        self.expected = 0
        self.seen: set[str] = set()
        self.answered: int | None = None
        self.calls = 0
        self.max_calls = 0
        self.done = False
        self._started = False

    def reset(self, task: Task) -> str:
        self.prices = dict(task.data["prices"])
        self.asked = list(task.data["asked"])
        self.expected = int(task.answer)
        self.seen = set()
        self.answered = None
        self.calls = 0
        self.max_calls = int(task.data.get("max_calls", 5))
        self.done = False
        self._started = True
        return task.prompt

    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        self._require_started(self._started)
        if self.done:
            return StepResult("episode is over", True, self.reward())
        self.calls += 1
        if tool_name == "lookup":
            item = arguments["item"]
            self.seen.add(item)
            obs = f"{item} = {self.prices[item]}"
        else:
            self.answered = int(arguments["value"])
            obs = "correct" if self.answered == self.expected else "wrong"
            self.done = True
        if not self.done and self.calls >= self.max_calls:
            obs, self.done = obs + ", out of calls", True
        return StepResult(obs, self.done, self.reward(), {"seen": sorted(self.seen)})

    def reward(self) -> float:
        self._require_started(self._started)
        if self.answered == self.expected:
            return 1.0
        return 0.25 * len(self.seen & set(self.asked)) / len(self.asked)

    def expert_action(self) -> tuple[str, dict[str, Any]]:
        for item in self.asked:
            if item not in self.seen:
                return "lookup", {"item": item}
        return "answer", {"value": self.expected}

    def random_action(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        if rng.random() < 0.7:
            return "lookup", {"item": rng.choice(ITEMS)}
        return "answer", {"value": rng.randint(2, 18)}
