"""smolagents as a client: `OpenAIServerModel(api_base=<base_url>)` driving a `ToolCallingAgent`
with one tool and its `final_answer` tool.

smolagents keeps its own memory and re-sends each model turn rewritten: the tool calls become
assistant text (`"Calling tools:\\n[{'id': ..., ...}]"`) and every content a list of parts. So
the second call is a new root (the history it sends is not what the model sampled), and no
assistant message of its final conversation matches a call. The harness therefore names the
calls it kept, `accepted_call_ids` (the `id` of each chat.completion, which smolagents keeps as
`step.model_output_message.raw.id`), and the rollout yields one row per call (see docs/rows.md,
"Harnesses that rewrite the model's turns")."""

from __future__ import annotations

import httpx
import pytest
from frameworks_support import ANSWER, QUESTION, check_rollout, get_weather, openai_messages, weather_policy

pytestmark = pytest.mark.frameworks
pytest.importorskip("smolagents")


def _episode(gateway, case):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    from smolagents.memory import ActionStep
    from smolagents.models import get_clean_message_list, tool_role_conversions

    @tool
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return get_weather(city)

    weather.name = "get_weather"
    final = lambda: case.tool_call("final_answer", {"answer": ANSWER})  # noqa: E731
    gw = gateway(weather_policy(case, final=final))
    ro = gw.create_rollout("smolagents", {"framework": "smolagents"})
    model = OpenAIServerModel(model_id="tiny", api_base=ro["base_url"], api_key=ro["api_key"])
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=3, verbosity_level=0)
    assert agent.run(QUESTION) == ANSWER
    # the conversation as smolagents holds it and sends it (tool-call / tool-response roles mapped)
    messages = openai_messages(get_clean_message_list(agent.write_memory_to_messages(),
                                                      role_conversions=tool_role_conversions))
    kept = [s.model_output_message.raw.id for s in agent.memory.steps if isinstance(s, ActionStep)]
    return gw, ro, messages, kept


def _finish(gw, ro, body):
    r = httpx.post(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish", json=body,
                   headers={"authorization": f"Bearer {ro['api_key']}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_smolagents_rewritten_turns_yield_rows_with_accepted_call_ids(gateway, case):
    gw, ro, messages, kept = _episode(gateway, case)
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert len(assistants) == 2 and all(isinstance(m["content"], list) for m in assistants)
    assert assistants[0]["content"][0]["text"].startswith("Calling tools:\n")
    calls = gw.lineage(ro["rollout_id"])["calls"]
    assert kept == [c["id"] for c in calls]
    # the rewritten tool call carries the exact tool-call id the gateway returned
    first = gw.ledger.get_call(calls[0]["id"]).response["choices"][0]["message"]["tool_calls"][0]["id"]
    assert first in assistants[0]["content"][0]["text"]
    _finish(gw, ro, {"messages": messages, "reward": 1.0, "accepted_call_ids": kept})
    # two roots (the second request's history is smolagents' rewrite), so two rows
    check_rollout(gw, ro["rollout_id"], calls=2, continuation=False, rows=2)


def test_smolagents_without_accepted_call_ids_is_invalid(gateway, case):
    gw, ro, messages, _ = _episode(gateway, case)
    _finish(gw, ro, {"messages": messages, "reward": 1.0})
    answer = gw.rows(ro["rollout_id"])
    assert answer["metrics"]["unmatched_messages"] == 2
    assert "match no call" in answer["invalid_reason"] and not any(r["valid"] for r in answer["rows"])

