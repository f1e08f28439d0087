"""Reasoning parser `qwen3`: `<think>...</think>` before the answer (Qwen3, QwQ, and the
`<think>` families generally). The opening tag may be missing because the prompt opened it. No
`</think>` at all -> everything is content (thinking was off, or the output was cut short).

Matches vLLM's `qwen3` reasoning parser (`vllm/reasoning/qwen3_reasoning_parser.py`); newlines
around the reasoning and before the content are dropped, as the Qwen3 template drops them.
"""

from __future__ import annotations

from rowgrove.parsers._common import think_split

REASONING_NAMES = ("qwen3",)


def split(text: str) -> tuple[str | None, str | None]:
    return think_split(text)
