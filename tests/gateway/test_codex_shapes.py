"""A Codex CLI 0.171-shaped Responses request, written by hand from the shape Codex sends (no
`instructions`; two developer input items and a user item; function tools with `strict`, the
`multi_agent_v1` namespace tool holding spawn_agent / wait_agent, a hosted `web_search`; store
false, include, reasoning, prompt_cache_key, client_metadata, parallel_tool_calls), through the
official `openai` SDK: served, a call to a namespaced function returns as a `function_call` item
with its `namespace`, the item sent back continues the call, and `--hosted-tools refuse` names
the hosted tool."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_http import assert_continuation  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.toolcalls import format_assistant_text  # noqa: E402

OBJ = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"], "additionalProperties": False}
SPAWN = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"],
         "additionalProperties": False}
TOOLS = [
    {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False, "parameters": OBJ},
    {"type": "function", "name": "apply_patch", "description": "Edits files", "strict": False, "parameters": OBJ},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent", "strict": False,
         "parameters": SPAWN},
        {"type": "function", "name": "wait_agent", "description": "Wait for sub-agents", "strict": False,
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}]},
    {"type": "web_search", "external_web_access": False},
]
INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "DEV-ONE permissions"}]},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "DEV-TWO collaboration"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the failing test"}]},
]
EXTRA = dict(tool_choice="auto", parallel_tool_calls=True, reasoning={"effort": "medium", "summary": "auto"},
             store=False, include=["reasoning.encrypted_content"], prompt_cache_key="0199-session")


def test_a_codex_first_request_is_served_and_a_namespaced_call_continues():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        spawn = format_assistant_text(tool_calls=[("spawn_agent", {"message": "look at tests/"})])
        r1 = client.responses.create(model="m", input=INPUT, tools=TOOLS, **EXTRA,
                                     extra_body={"client_metadata": {"x-codex": "1"}, "script": spawn})
        calls = [o for o in r1.output if o.type == "function_call"]
        assert len(calls) == 1
        item = calls[0].model_dump(exclude_none=True)
        assert item["name"] == "spawn_agent" and item["namespace"] == "multi_agent_v1", item
        (c1,) = gw.ledger.calls(ro["rollout_id"])
        prompt = gw.gateway.renderer.decode(c1.prompt_ids.tolist()) if hasattr(gw.gateway, "renderer") else None
        items = INPUT + [{k: item[k] for k in ("type", "call_id", "name", "arguments", "namespace")},
                         {"type": "function_call_output", "call_id": item["call_id"], "output": "agent-1 spawned"}]
        r2 = client.responses.create(model="m", input=items, tools=TOOLS, **EXTRA, extra_body={"script": "done"})
        assert r2.output_text == "done"
        c1, c2 = gw.ledger.calls(ro["rollout_id"])
        assert_continuation(gw.ledger, c2, c1)
        if prompt is not None:
            assert "DEV-ONE permissions" in prompt and "DEV-TWO collaboration" in prompt and "spawn_agent" in prompt


def test_a_custom_tool_is_refused_in_one_sentence():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        r = httpx.post(f"{ro['base_url']}/responses", headers={"authorization": f"Bearer {ro['api_key']}"},
                       json={"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]})
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("'tools[0]' is a custom (free-form) tool")


@pytest.mark.parametrize("policy", ["drop", "refuse"])
def test_hosted_tools_are_left_out_or_refused(policy):
    with start_gateway("tiny", engine="scripted", hosted_tools=policy) as gw:
        ro = gw.create_rollout("g")
        r = httpx.post(f"{ro['base_url']}/responses", headers={"authorization": f"Bearer {ro['api_key']}"},
                       json={"model": "m", "input": "hi", "tools": TOOLS, "script": "ok"})
        if policy == "drop":
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 400
            assert "'web_search'" in r.json()["error"]["message"]
