"""`POST .../v1/messages/count_tokens` through the official `anthropic` SDK's
`client.messages.count_tokens`: the count is the exact length of the prompt the same body sent
to `messages.create` gives the engine (root and continuation), nothing is generated or written,
and a bad body is refused in Anthropic's shape."""

from __future__ import annotations

import sys
from pathlib import Path

import anthropic
import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_http import SPECS  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.toolcalls import format_assistant_text  # noqa: E402

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [{"name": "Bash", "description": "Run a command", "input_schema": SCHEMA},
         {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]
SYSTEM = [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]


@pytest.mark.parametrize("spec", list(SPECS))
def test_count_tokens_is_the_rendered_prompt_length(spec):
    with start_gateway(spec, engine="scripted") as gw:
        ro = gw.create_rollout("g")
        client = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"],
                                     max_retries=0)
        messages = [{"role": "user", "content": "list the files"},
                    {"role": "system", "content": "reminder: be brief"}]
        kw = dict(model="m", system=SYSTEM, tools=TOOLS, tool_choice={"type": "auto"},
                  thinking={"type": "enabled", "budget_tokens": 1024})
        n1 = client.messages.count_tokens(messages=messages, **kw).input_tokens
        assert gw.ledger.calls(ro["rollout_id"]) == []  # counting writes nothing
        bash = format_assistant_text(tool_calls=[("Bash", {"command": "ls"})])
        r1 = client.messages.create(max_tokens=64, messages=messages, extra_body={"script": bash}, **kw)
        (c1,) = gw.ledger.calls(ro["rollout_id"])
        assert n1 == c1.prompt_len == r1.usage.input_tokens
        use = next(b for b in r1.content if b.type == "tool_use")
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]}]
        n2 = client.messages.count_tokens(messages=messages, **kw).input_tokens
        assert len(gw.ledger.calls(ro["rollout_id"])) == 1
        client.messages.create(max_tokens=64, messages=messages, extra_body={"script": "done"}, **kw)
        c2 = gw.ledger.calls(ro["rollout_id"])[1]
        assert c2.parent_id == c1.id and n2 == c2.prompt_len > n1


def test_count_tokens_refusals_are_anthropic_shaped_sentences():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        url = ro["base_url"] + "/messages/count_tokens"
        r = httpx.post(url, headers={"x-api-key": ro["api_key"]}, json={"model": "m", "messages": []})
        assert r.status_code == 400 and r.json()["type"] == "error" and "messages" in r.json()["error"]["message"]
        r = httpx.post(url, headers={"x-api-key": "nope"}, json={"model": "m", "messages": []})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(url, headers={"x-api-key": ro["api_key"]}, content=b"[1")
        assert r.status_code == 400 and r.json()["type"] == "error"
        client = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"],
                                     max_retries=0)
        with pytest.raises(anthropic.BadRequestError):
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": 3}])
        assert gw.ledger.calls(ro["rollout_id"]) == []
