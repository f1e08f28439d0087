"""LangGraph with langchain-openai as a client: `ChatOpenAI(base_url=..., api_key=...)` in a
prebuilt ReAct (tool-calling) graph, then the graph's final state messages, converted by
langchain-core's own `convert_to_openai_messages`, sent to finish."""

from __future__ import annotations

import pytest
from frameworks_support import ANSWER, QUESTION, check_rollout, get_weather, openai_messages, weather_policy

pytestmark = pytest.mark.frameworks
pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")


# create_react_agent is deprecated for langchain.agents.create_agent (the `langchain` package,
# not a dependency here); the graph it builds is the same tool loop.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_langgraph_react_agent_tool_episode(gateway, case):
    from langchain_core.messages import convert_to_openai_messages
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from langgraph.prebuilt import create_react_agent

    gw = gateway(weather_policy(case))
    ro = gw.create_rollout("langgraph", {"framework": "langgraph"})
    llm = ChatOpenAI(model="tiny", base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0,
                     temperature=1.0)
    graph = create_react_agent(llm, [tool(get_weather)])
    state = graph.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 8})
    assert state["messages"][-1].content == ANSWER
    messages = openai_messages(convert_to_openai_messages(state["messages"]))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    gw.finish(ro["rollout_id"], messages=messages, reward=1.0)
    check_rollout(gw, ro["rollout_id"], calls=2, rows=1)
