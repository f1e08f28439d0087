"""pydantic-ai as a client: `OpenAIChatModel` with an `OpenAIProvider(base_url=<base_url>, api_key=...)` and
one tool; the run's messages (`result.all_messages()`) mapped to Chat Completions messages by the
model itself (`OpenAIChatModel._map_messages`, what it sends on the wire; private, so a change
there shows up here first) plus the final response, sent to finish."""

from __future__ import annotations

import asyncio

import pytest
from frameworks_support import ANSWER, QUESTION, check_rollout, get_weather, openai_messages, weather_policy

pytestmark = pytest.mark.frameworks
pytest.importorskip("pydantic_ai")


def test_pydantic_ai_tool_episode(gateway, case):
    from pydantic_ai import Agent
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    gw = gateway(weather_policy(case))
    ro = gw.create_rollout("pydantic-ai", {"framework": "pydantic-ai"})

    async def episode():
        provider = OpenAIProvider(base_url=ro["base_url"], api_key=ro["api_key"])
        try:
            model = OpenAIChatModel("tiny", provider=provider)
            agent = Agent(model, tools=[get_weather])
            result = await agent.run(QUESTION)
            # the whole run, as the model renders it for its next request
            sent = await model._map_messages(result.all_messages(), ModelRequestParameters())
            return result, sent
        finally:
            await provider.client.close()

    result, sent = asyncio.run(episode())
    assert result.output == ANSWER
    messages = openai_messages(sent)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    gw.finish(ro["rollout_id"], messages=messages, reward=1.0)
    check_rollout(gw, ro["rollout_id"], calls=2, rows=1)
