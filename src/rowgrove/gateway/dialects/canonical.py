"""The seam between the dialects a harness may speak and the one conversation the gateway knows.

Every dialect is translated at the HTTP edge into Chat Completions messages, the canonical
conversation that `decide`, the hashes and the ledger use (the Responses API in
`responses_api`, the Anthropic Messages API in `anthropic_api`), so the dialect never changes a
call's parent, its tokens or its rows, and one rollout may mix dialects. This module holds the
one place that names the dialects: the `format` of a finish body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rowgrove.errors import BadRequest

FORMATS = ("chat", "responses", "anthropic")


def chat_messages(value: Any, fmt: str, where: str) -> Any:
    """A conversation in dialect `fmt` as chat messages, its leading run of system / developer
    messages as one turn as the calls' edge gave it (`leading.merge_leading_system`; a chat
    conversation is otherwise returned as is, for the finish route's own checks)."""
    from rowgrove.gateway.dialects.leading import merge_leading_system

    if fmt == "chat":
        return merge_leading_system(value) if isinstance(value, list) else value
    if fmt == "responses":
        from rowgrove.gateway.dialects.responses_api import finish_messages
    elif fmt == "anthropic":
        from rowgrove.gateway.dialects.anthropic_api import finish_messages
    else:
        raise BadRequest(f"'format' must be one of {', '.join(FORMATS)}, got {fmt!r}", param="format")
    return merge_leading_system(finish_messages(value, where))


def canonical_finish(body: Any) -> Any:
    """A finish body with its `messages` / `conversations` translated from its `format`
    ("chat" when absent) into chat messages; other keys kept. Bodies that are not objects, or
    whose conversations are not lists, are returned as they are for the finish route to refuse."""
    if not isinstance(body, Mapping):
        return body
    fmt = body.get("format")
    if fmt is None:
        fmt = "chat"
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise BadRequest(f"'format' must be one of {', '.join(FORMATS)}, got {fmt!r}", param="format")
    out = {k: v for k, v in body.items() if k != "format"}
    if isinstance(out.get("messages"), list):
        out["messages"] = chat_messages(out["messages"], fmt, "messages")
    convs = out.get("conversations")
    if isinstance(convs, list) and all(isinstance(c, list) for c in convs):
        out["conversations"] = [chat_messages(c, fmt, f"conversations[{i}]") for i, c in enumerate(convs)]
    return out
