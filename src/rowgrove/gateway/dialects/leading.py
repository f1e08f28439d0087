"""The leading run of system and developer messages as one turn (`merge_leading_system`), which
every dialect's edge applies to the conversation it hands the gateway."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str)
                                         and p.get("type") in ("text", "input_text", "output_text") for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def merge_leading_system(messages: list[Any]) -> list[Any]:
    """The conversation with its leading run of system and developer messages as one message
    (their texts joined by a blank line), where the run holds more than one. Codex sends its
    instructions as two developer items and no `instructions`; most chat templates render only a
    first system message (Mistral Nemo refuses a second, gpt-oss drops a developer message after
    a system one), so one turn is the only form every family's template keeps whole. The role is
    "developer" when the run holds one (a template that renders that role keeps it, the others get
    a system message, `preprocess.renders_developer`), else "system". A run with a part that is
    not text is left as it is. Deterministic, so the next call's prompt still continues this one."""
    n = 0
    while n < len(messages) and isinstance(messages[n], Mapping) and messages[n].get("role") in ("system", "developer"):
        n += 1
    if n < 2:
        return messages
    texts = [_text(m.get("content")) for m in messages[:n]]
    if any(t is None for t in texts):
        return messages
    role = "developer" if any(m.get("role") == "developer" for m in messages[:n]) else "system"
    return [{"role": role, "content": "\n\n".join(texts)}] + list(messages[n:])
