"""LiteLLM as a client: `litellm.completion(model="openai/...", api_base=<base_url>,
api_key=...)` in a hand-written tool loop; the loop's messages (LiteLLM's own response messages,
dumped) sent to finish. conftest.py sets LITELLM_LOCAL_MODEL_COST_MAP so that importing LiteLLM
does not try to fetch its model-cost map."""

from __future__ import annotations

import json

import pytest
from frameworks_support import ANSWER, QUESTION, check_rollout, get_weather, openai_messages, weather_policy

pytestmark = [pytest.mark.frameworks,
              # LiteLLM's lazily imported types trip pydantic's ReadOnly warning
              pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]
litellm = pytest.importorskip("litellm")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def test_litellm_manual_tool_loop(gateway, case):
    gw = gateway(weather_policy(case))
    ro = gw.create_rollout("litellm", {"framework": "litellm"})
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    for _ in range(4):
        r = litellm.completion(model="openai/tiny", api_base=ro["base_url"], api_key=ro["api_key"],
                               messages=messages, tools=TOOLS, num_retries=0)
        msg = r.choices[0].message
        messages.append(openai_messages([msg])[0])
        if not msg.tool_calls:
            break
        for tc in msg.tool_calls:
            result = get_weather(**json.loads(tc.function.arguments))
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    assert messages[-1]["content"] == ANSWER
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    gw.finish(ro["rollout_id"], messages=messages, reward=1.0)
    check_rollout(gw, ro["rollout_id"], calls=2, rows=1)
