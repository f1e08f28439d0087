"""`developer` messages at the Chat Completions edge. That every family's real template gets a
harness's developer messages whole (Codex's two developer items through Responses, two leading
developer messages, a developer message after a system one, through Chat Completions), token-exact
and continued, is the conformance matrix's developer cells (tests/gateway/test_conformance.py);
what is left here is the edge's own error for a merged leading run."""

from __future__ import annotations

import pytest


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
