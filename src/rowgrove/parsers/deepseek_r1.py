"""Reasoning parsers `deepseek_r1` and `deepseek_v3`.

`deepseek_r1` matches vLLM's `vllm/reasoning/deepseek_r1_reasoning_parser.py`: the prompt usually
ends with `<think>\\n`, so the sampled text holds only `</think>`; text before it is reasoning,
after it content. No `</think>` at all -> everything is reasoning (content None), as in vLLM.

`deepseek_v3` (vLLM `vllm/reasoning/deepseek_v3_reasoning_parser.py`, for DeepSeek V3.1 /
V3.2 whose templates switch thinking on and off): vLLM reads the request's `thinking` flag; here
thinking counts as on exactly when `</think>` was sampled -- then as `deepseek_r1`, else all content.
"""

from __future__ import annotations

from rowgrove.parsers._common import think_split

REASONING_NAMES = ("deepseek_r1", "deepseek_v3")


def split_r1(text: str) -> tuple[str | None, str | None]:
    return think_split(text, unclosed="reasoning")


def split_v3(text: str) -> tuple[str | None, str | None]:
    return think_split(text, unclosed="content")


split = split_r1
