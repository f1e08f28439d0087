"""A Claude Code 2.1.197-shaped Messages request, written by hand from the shape it sends (system
as text blocks with cache_control, a system-role message inside `messages`, client tools with
cache_control, a `web_search_20250305` server tool, thinking, context_management, output_config,
metadata.user_id, the anthropic-beta header), through the official `anthropic` SDK: served, and
the next call continues the first."""

from __future__ import annotations

import sys
from pathlib import Path

import anthropic
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_http import assert_continuation  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.toolcalls import format_assistant_text  # noqa: E402

CC = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": CC},
          {"type": "text", "text": "SYS-MAIN instructions", "cache_control": CC}]
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"name": "Bash", "description": "Run a command", "input_schema": SCHEMA},
         {"name": "Agent", "description": "Launch a sub-agent", "input_schema": {
             "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
          "cache_control": CC},
         {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]
EXTRA = {"thinking": {"type": "enabled", "budget_tokens": 1024},
         "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
         "output_config": {"effort": "medium"}}


def test_a_claude_code_request_is_served_and_continues():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        client = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"],
                                     max_retries=0, default_headers={"anthropic-beta": "claude-code-20250219"})
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "fix the test", "cache_control": CC}]},
            {"role": "system", "content": "SYS-REMINDER the todo list is empty"},
            {"role": "user", "content": "go"},
        ]
        bash = format_assistant_text(tool_calls=[("Bash", {"command": "ls"})])
        r1 = client.messages.create(model="m", max_tokens=256, system=SYSTEM, messages=messages, tools=TOOLS,
                                    metadata={"user_id": "user_abc_session_1"},
                                    extra_body={**EXTRA, "script": bash})
        use = next(b for b in r1.content if b.type == "tool_use")
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]}]
        r2 = client.messages.create(model="m", max_tokens=256, system=SYSTEM, messages=messages, tools=TOOLS,
                                    extra_body={**EXTRA, "script": "done"})
        assert r2.content[0].text == "done"
        c1, c2 = gw.ledger.calls(ro["rollout_id"])
        assert_continuation(gw.ledger, c2, c1)


def test_a_server_tool_is_refused_by_name_under_refuse():
    with start_gateway("tiny", engine="scripted", hosted_tools="refuse") as gw:
        ro = gw.create_rollout("g")
        r = httpx.post(f"{ro['base_url']}/messages", headers={"x-api-key": ro["api_key"]},
                       json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                             "tools": TOOLS})
        assert r.status_code == 400 and "'web_search_20250305'" in r.text


def test_head_and_get_on_the_base_urls_answer_200():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        root = ro["base_url"].removesuffix("/rollouts/" + ro["rollout_id"] + "/v1")
        for url in (ro["base_url"], ro["base_url"].removesuffix("/v1"), root + "/v1"):
            for method in ("HEAD", "GET"):
                r = httpx.request(method, url, headers={"x-api-key": ro["api_key"]})
                assert r.status_code == 200, (method, url, r.text)
        assert httpx.head(root + "/rollouts/ro_nope").status_code == 404
