"""The OpenAI Agents SDK as a client: `OpenAIChatCompletionsModel` over an `AsyncOpenAI` client on
the rollout's base_url, one function tool, then the run's own conversation (its input items as
the SDK converts them to Chat Completions messages) sent to finish."""

from __future__ import annotations

import asyncio

import pytest
from frameworks_support import ANSWER, QUESTION, check_rollout, get_weather, openai_messages, weather_policy

pytestmark = pytest.mark.frameworks
pytest.importorskip("agents")


def test_agents_sdk_tool_episode(gateway, case):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.models.chatcmpl_converter import Converter
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    gw = gateway(weather_policy(case))
    ro = gw.create_rollout("agents-sdk", {"framework": "openai-agents"})

    async def episode():
        client = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        try:
            model = OpenAIChatCompletionsModel(model="tiny", openai_client=client)
            agent = Agent(name="weather", instructions="Answer with the tool's help.", model=model,
                          tools=[function_tool(get_weather)])
            return await Runner.run(agent, QUESTION, max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(episode())
    assert result.final_output == ANSWER
    messages = openai_messages(Converter.items_to_messages(result.to_input_list()))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    gw.finish(ro["rollout_id"], messages=messages, reward=1.0)
    check_rollout(gw, ro["rollout_id"], calls=2, rows=1)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_default_responses_model_tool_episode(gateway, case, stream):
    """The Agents SDK's default model, `OpenAIResponsesModel`, on the rollout's base_url: the
    episode goes through `POST {base_url}/responses`, and the run's own input list (Responses
    items) is sent to finish with `"format": "responses"`."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    gw = gateway(weather_policy(case))
    ro = gw.create_rollout("agents-sdk-responses", {"framework": "openai-agents", "api": "responses"})
    instructions = "Answer with the tool's help."

    async def episode():
        client = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        try:
            model = OpenAIResponsesModel(model="tiny", openai_client=client)
            agent = Agent(name="weather", instructions=instructions, model=model,
                          tools=[function_tool(get_weather)])
            if not stream:
                return await Runner.run(agent, QUESTION, max_turns=4)
            result = Runner.run_streamed(agent, QUESTION, max_turns=4)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    result = asyncio.run(episode())
    assert result.final_output == ANSWER
    items = openai_messages(result.to_input_list())
    assert [i.get("type", "message") for i in items] == ["message", "function_call", "function_call_output", "message"]
    gw.finish(ro["rollout_id"], messages=[{"role": "system", "content": instructions}, *items], reward=1.0,
              format="responses")
    check_rollout(gw, ro["rollout_id"], calls=2, rows=1)
