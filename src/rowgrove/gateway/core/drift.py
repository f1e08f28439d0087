"""The two string helpers of the renderer's history-drift probe (`render.Renderer.continuation`):
where two renderings first differ, and a message with one character of its content changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (bisection on slices: C-speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def change_one_char(msg: dict[str, Any]) -> tuple[dict[str, Any], str, str] | None:
    """`msg` with the non-space character nearest the middle of its content changed (so a
    template's startswith / endswith / emptiness checks see the same content), with the original
    and new character."""
    content = msg.get("content")
    if isinstance(content, str):
        text, where = content, None
    elif isinstance(content, list):
        where = next((k for k, p in enumerate(content)
                      if isinstance(p, Mapping) and isinstance(p.get("text"), str) and p["text"]), None)
        if where is None:
            return None
        text = content[where]["text"]
    else:
        return None
    # the non-space character nearest the middle (a space may be stripped or split on)
    mid = len(text) // 2
    k = next((i for d in range(len(text)) for i in (mid - d, mid + d)
              if 0 <= i < len(text) and not text[i].isspace()), None)
    if k is None:
        return None
    original = text[k]
    replacement = "y" if original == "x" else "x"
    new_text = text[:k] + replacement + text[k + 1:]
    alt = dict(msg)
    if where is None:
        alt["content"] = new_text
    else:
        parts = list(content)
        parts[where] = {**parts[where], "text": new_text}
        alt["content"] = parts
    return alt, original, replacement


__all__ = ["change_one_char", "common_prefix"]
