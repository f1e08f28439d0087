"""`developer` messages (Codex sends its instructions as two developer input items and no
`instructions`) reach every family's real template: a template that does not render the role
itself gets them as system messages (`preprocess.renders_developer`), so none is dropped or
refused. The leading run of system/developer messages is one turn (`leading.merge_leading_system`, as the
Responses edge applies it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import FAMILIES, family_model_dir, require_families  # noqa: E402

from rowgrove.gateway.core.render import Renderer  # noqa: E402
from rowgrove.gateway.dialects.leading import merge_leading_system  # noqa: E402

CODEX = [
    {"role": "developer", "content": [{"type": "input_text", "text": "DEV-ONE sandbox and approvals"}]},
    {"role": "developer", "content": [{"type": "input_text", "text": "DEV-TWO collaboration mode"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "USER-TASK fix the test"}]},
]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_codex_requests_developer_messages_are_in_every_familys_prompt(name):
    require_families([name])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(family_model_dir(name))
    text = Renderer(tok).render_text(merge_leading_system(CODEX))
    for needle in ("DEV-ONE sandbox and approvals", "DEV-TWO collaboration mode", "USER-TASK fix the test"):
        assert needle in text, f"{name}: {needle!r} missing from the prompt:\n{text}"


CHAT = [
    {"role": "developer", "content": "DEV-ONE sandbox and approvals"},
    {"role": "developer", "content": [{"type": "text", "text": "DEV-TWO collaboration mode"}]},
    {"role": "user", "content": "USER-TASK fix the test"},
]


@pytest.mark.parametrize("name", ["gpt-oss", "mistral-nemo"])
def test_a_chat_completions_request_with_two_developer_messages_is_served_whole(name):
    """Chat Completions merges the leading run as Responses and Messages do: Mistral Nemo refuses a
    second system message and gpt-oss drops a developer message after a system one, so without the
    merge one of the two would be a 400 or lost. The call is served, both texts reach the engine's
    prompt, and a finish sending the conversation as the harness holds it (two developer
    messages) still matches the call."""
    require_families([name])
    import httpx
    from openai import OpenAI

    from rowgrove.gateway.testing import start_gateway

    with start_gateway(str(family_model_dir(name)), engine="scripted") as gw:
        ro = gw.create_rollout("g")
        client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        r = client.chat.completions.create(model="m", messages=CHAT, extra_body={"script": "ok"})
        assert r.choices[0].message.content == "ok"
        (call,) = gw.ledger.calls(ro["rollout_id"])
        prompt = gw.gateway.renderer.decode(call.prompt_ids.tolist())
        for needle in ("DEV-ONE sandbox and approvals", "DEV-TWO collaboration mode", "USER-TASK fix the test"):
            assert needle in prompt, f"{name}: {needle!r} missing from the prompt:\n{prompt}"
        done = httpx.post(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish", json={
            "messages": CHAT + [{"role": "assistant", "content": "ok"}], "reward": 1.0})
        assert done.status_code == 200, done.text
        rows = httpx.get(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/rows").json()
        assert len(rows["rows"]) == 1 and rows["invalid_reason"] is None, rows


def test_a_chat_error_after_a_merged_run_names_the_message_by_its_index_as_sent():
    from rowgrove.errors import BadRequest
    from rowgrove.gateway.dialects.openai_format import parse_chat_request

    body = {"model": "m", "messages": [{"role": "developer", "content": "a"}, {"role": "system", "content": "b"},
                                       {"role": "user", "content": "u"},
                                       {"role": "tool", "tool_call_id": "x", "content": "r"}]}
    with pytest.raises(BadRequest, match=r"^messages\[3\]"):
        parse_chat_request(body)
    merged = parse_chat_request({**body, "messages": body["messages"][:3]}).messages
    assert merged == [{"role": "developer", "content": "a\n\nb"}, {"role": "user", "content": "u"}]
