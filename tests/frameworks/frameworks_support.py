"""Shared pieces of the agent-framework tests: the models they run on, an engine that answers
from the conversation it is shown, and the checks every episode ends with.

Agent frameworks give no easy per-call `extra_body`, so the scripted engine's `script` hint
cannot be set from the harness. `PolicyEngine` wraps the scripted engine instead: it decodes the
prompt the gateway built and lets a policy pick the reply text from it (a tool call until the
tool's result is in the prompt, then the answer). The tokens are still the scripted engine's: the
text's encoding plus end-of-turn, with the model's real teacher-forced logprobs.

Import from test modules: `from frameworks_support import ...` (pytest puts this directory on
sys.path).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rowgrove.engines.base import Generation, SamplingParams
from rowgrove.toolcalls import format_tool_call

# The episode every framework test plays: one tool call, its result, then the answer.
CITY = "Paris"
WEATHER = "sunny, 21 C"             # the tool's result; its presence in the prompt ends the episode
ANSWER = "It is sunny and 21 C in Paris."
QUESTION = "What is the weather in Paris? Use the get_weather tool."


def get_weather(city: str) -> str:
    """The episode's one tool (frameworks wrap it in their own tool type)."""
    return WEATHER if city == CITY else f"no data for {city}"


@dataclass(frozen=True)
class ModelCase:
    """A model the framework tests run on: its `rowgrove serve --model` spec, and how its model
    writes a tool call and an answer (the text the scripted engine samples)."""

    name: str
    spec: str
    tool_call: Callable[[str, Mapping[str, Any]], str] = format_tool_call
    answer: Callable[[str], str] = str        # a plain-text answer as the model samples it


def _family_case(family: str) -> ModelCase:
    """A tiny model with a real chat template, from tests/families.py, on the family's real
    vocabulary where it has one (`suite_model_dir`; the tiny one without it): its tool calls are what
    that family samples (`Family.native`, without the stop token, which the scripted engine adds).
    Skips, saying why, while tests/families.py or the real templates are missing; an error
    inside families.py fails the test."""
    import sys
    from pathlib import Path

    import pytest

    tests_dir = str(Path(__file__).resolve().parents[1])
    if tests_dir not in sys.path:   # pytest adds it only when a module directly in tests/ is collected
        sys.path.append(tests_dir)
    try:
        import families  # tests/families.py: tiny models with the real chat templates
    except ModuleNotFoundError as e:
        if e.name != "families":
            raise
        pytest.skip(f"tests/families.py does not exist yet: the {family} case runs once it does")
    fam = families.family(family)
    families.require_families([family])

    def sampled(text: str) -> str:
        for stop in fam.eos_tokens:
            if text.endswith(stop):
                return text[: -len(stop)]
        return text

    def tool_call(name: str, arguments: Mapping[str, Any]) -> str:
        return sampled(fam.native(tool_calls=[(name, dict(arguments))]))

    return ModelCase(family, str(families.suite_model_dir(family)), tool_call,
                     answer=lambda text: sampled(fam.native(content=text)))


def model_case(name: str) -> ModelCase:
    """"tiny" (ChatML, hermes tool calls); a family of tests/families.py ("qwen3", "llama3.1")."""
    if name == "tiny":
        return ModelCase("tiny", "tiny")
    return _family_case(name)


@functools.cache
def scripted_engine(spec: str):
    """One scripted engine per model spec for the whole test process (model load is the cost)."""
    import torch

    from rowgrove.engines import make_engine

    torch.set_num_threads(1)
    return make_engine("scripted", spec)


Policy = Callable[[str, int], str]


class PolicyEngine:
    """The scripted engine, replying with `policy(prompt_text, ordinal)`: the text is chosen from
    the conversation the gateway rendered, so a harness needs no `extra_body`. Records each
    prompt text and reply."""

    def __init__(self, inner: Any, policy: Policy):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.policy = policy
        self.prompts: list[str] = []
        self.replies: list[str] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        reply = self.policy(text, int((hints or {}).get("ordinal") or 0))
        self.prompts.append(text)
        self.replies.append(reply)
        return await self.inner.generate(prompt_ids, sampling, hints={**(hints or {}), "script": reply})

    async def aclose(self) -> None:
        """The inner engine is shared across tests: nothing to close."""


def weather_policy(case: ModelCase, *, final: Callable[[], str] | None = None) -> Policy:
    """Call get_weather(city=Paris) until its result is in the prompt, then answer (`final()`:
    the answer's text; plain ANSWER by default, a final_answer tool call for smolagents)."""

    def policy(prompt: str, ordinal: int) -> str:
        if WEATHER in prompt:
            return final() if final is not None else case.answer(ANSWER)
        return case.tool_call("get_weather", {"city": CITY})

    return policy


def openai_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain JSON dicts (pydantic models dumped, `None` fields dropped) for the finish body."""
    out = []
    for m in messages:
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        out.append(json.loads(json.dumps(m, default=str)))
    return out


def check_rollout(gw: Any, rollout_id: str, *, calls: int, continuation: bool = True,
                  rows: int | None = None) -> dict[str, Any]:
    """The checks every episode ends with; returns the rows answer.

    - the lineage has `calls` completed calls; with `continuation`, each later call continues the
      one before it (not a new root), else each is a root (a harness that rewrote the history);
    - the rollout is valid and every row is valid;
    - the rows' loss-masked tokens are exactly the sampled ids of the calls, in order, each once.
    """
    lineage = gw.lineage(rollout_id)
    got = lineage["calls"]
    assert [c["status"] for c in got] == ["completed"] * calls, got
    assert got[0]["root"] and got[0]["parent_id"] is None
    for prev, cur in zip(got, got[1:]):
        if continuation:
            assert cur["parent_id"] == prev["id"] and not cur["root"], f"call {cur['id']} is not a continuation: {got}"
        else:
            assert cur["root"] and cur["parent_id"] is None, got
    answer = gw.rows(rollout_id)
    assert answer["invalid_reason"] is None, answer["invalid_reason"]
    built = answer["rows"]
    assert built and all(r["valid"] and r["mask_reason"] is None for r in built)
    if rows is not None:
        assert len(built) == rows
    assert answer["metrics"]["delivered_fraction"] == 1.0
    ledger_calls = gw.ledger.calls(rollout_id)
    sampled = [t for c in ledger_calls for t in c.sampled_ids.tolist()]
    trained = [t for r in built for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m]
    assert trained == sampled
    for r in built:
        assert len(r["input_ids"]) == len(r["loss_mask"]) == len(r["logprobs"])
        assert r["call_ids"] and all(cid in {c.id for c in ledger_calls} for cid in r["call_ids"])
    return answer
