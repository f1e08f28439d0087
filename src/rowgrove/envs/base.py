"""What every rowgrove environment is: a `Task` (one prompt with its ground truth), an `Env` that
an agent drives through tool calls (`reset`, `step`, `reward`), and the argument check the agent
harness runs before a call reaches the environment.

Environments are plain Python, with no I/O and no model: the reward is computed from the actions
alone, so it is verifiable (the same actions always give the same reward) and tests can replay an
expert or a random policy without a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import random
from dataclasses import dataclass, field
from typing import Any

from rowgrove.errors import InputError


@dataclass(frozen=True)
class Task:
    """One prompt of an environment.

    `prompt` is the user message; `tools` the OpenAI tool schemas the agent offers the model;
    `answer` the ground truth the reward is checked against; `data` any other fields the
    environment needs to replay the task (hidden tables, budgets).
    """

    task_id: str
    prompt: str
    tools: list[dict[str, Any]]
    answer: Any
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """What one tool call did. `observation` is the tool message's content (or a list of content
    parts with images: the harness sends their text as the tool message and the images in a user
    message after it, as computer-use harnesses send screenshots); `done` ends the
    episode; `reward` is the episode's reward so far (not an increment: the same number
    `Env.reward()` returns now); `info` holds environment-specific details."""

    observation: str
    done: bool
    reward: float
    info: dict[str, Any] = field(default_factory=dict)


def tool_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function-tool schema with no extra properties allowed."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": False},
        },
    }


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


def check_arguments(tool: dict[str, Any], arguments: Any) -> str | None:
    """Why `arguments` do not fit the function schema `tool`, or None when they do.

    Checks the subset of JSON Schema the rowgrove environments use: an object, `required`,
    `additionalProperties: false`, and per property `type`, `enum`, `minimum`, `maximum`.
    (`True` is not an integer here, unlike in Python.)
    """
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(arguments, dict):
        return f"arguments of {fn['name']} must be a JSON object, got {type(arguments).__name__}"
    props: dict[str, Any] = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"{fn['name']} is missing required argument(s) {', '.join(missing)}"
    if params.get("additionalProperties") is False:
        extra = sorted(k for k in arguments if k not in props)
        if extra:
            return f"{fn['name']} got unknown argument(s) {', '.join(extra)}"
    for key, value in arguments.items():
        spec = props.get(key, {})
        kind = spec.get("type")
        if kind is not None:
            ok = isinstance(value, _JSON_TYPES.get(kind, (object,))) and not (
                kind in ("integer", "number") and isinstance(value, bool))
            if not ok:
                return f"{fn['name']}: argument {key} must be {kind}, got {value!r}"
        if "enum" in spec and value not in spec["enum"]:
            return f"{fn['name']}: argument {key} must be one of {spec['enum']}, got {value!r}"
        if "minimum" in spec and value < spec["minimum"]:
            return f"{fn['name']}: argument {key} must be >= {spec['minimum']}, got {value!r}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"{fn['name']}: argument {key} must be <= {spec['maximum']}, got {value!r}"
    return None


class Env(ABC):
    """An environment the agent harness drives through tool calls.

    Subclasses set `name` and `tools` and implement `reset`, `step`, `reward`, `expert_action` and
    `random_action`; `check_action` validates a call against the tool schemas and may be extended
    with task rules. An Env holds one episode's state: use one instance per concurrent episode.
    """

    name: str = "env"
    tools: list[dict[str, Any]] = []

    @abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode of `task`; return the first observation (the user message)."""

    @abstractmethod
    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        """Apply one tool call that `check_action` accepted."""

    @abstractmethod
    def reward(self) -> float:
        """The episode's reward so far, in [0, 1]; the final reward once `done`."""

    @abstractmethod
    def expert_action(self) -> tuple[str, dict[str, Any]]:
        """The best next tool call from the current state (for synthetic transcripts and tests)."""

    @abstractmethod
    def random_action(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """A well-formed, schema-valid, uniformly chosen tool call."""

    def check_action(self, tool_name: str, arguments: Any) -> str | None:
        """Why this call must be rejected (unknown tool, arguments off-schema), or None."""
        for tool in self.tools:
            if tool["function"]["name"] == tool_name:
                return check_arguments(tool, arguments)
        names = ", ".join(t["function"]["name"] for t in self.tools)
        return f"unknown tool {tool_name!r}: this task has {names}"

    def _require_started(self, started: bool) -> None:
        if not started:
            raise InputError(f"{self.name} env has no episode: call reset(task) first")
