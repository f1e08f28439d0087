"""`kimi_k2`: Kimi K2 tool calls, each with the id the model samples (`functions.NAME:IDX`):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|>

Matches vLLM's `kimi_k2` tool parser (`vllm/entrypoints/openai/tool_parsers/kimi_k2_tool_parser.py`):
the sampled `functions.NAME:IDX` is the call's id and NAME its name; content is the text outside
the section. Arguments must be JSON here (re-serialised canonically).

The reasoning parser `kimi_k2` splits `<think>...</think>` like `qwen3` (vLLM
`vllm/reasoning/kimi_k2_reasoning_parser.py`).
"""

from __future__ import annotations

import json
import re

from rowgrove.parsers._common import RawCall, ToolParse, arguments_json, scan_blocks, think_split

NAMES = ("kimi_k2",)
REASONING_NAMES = ("kimi_k2",)
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_CALL = re.compile(re.escape(CALL_BEGIN) + r"\s*(.*?)\s*" + re.escape(ARG_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_ID = re.compile(r"(?:functions\.)?([^\s:<>]+):(\d+)")


def _read(call_id: str, body: str) -> RawCall | str:
    m = _ID.fullmatch(call_id)
    if not m:
        return f"tool call id {call_id!r} is not functions.NAME:IDX"
    name = m.group(1)
    try:
        return RawCall(name, arguments_json(json.loads(body) if body.strip() else {}, name), id=call_id)
    except ValueError as e:
        msg = str(e)
        return msg if msg.startswith("tool call") else f"tool call {name!r}: arguments do not parse as JSON ({msg})"


def parse(text: str, tools: list | None = None) -> ToolParse:
    if CALL_BEGIN not in text:
        if SECTION_BEGIN in text:
            return ToolParse(text, [], [f"kimi_k2 call 1: {SECTION_BEGIN} without {CALL_BEGIN} (output cut short?)"])
        return ToolParse(text)
    return scan_blocks(text, _CALL.finditer(text), lambda m: _read(m.group(1), m.group(2)),
                       label="kimi_k2 call", open_tag=CALL_BEGIN, close_tag=CALL_END,
                       markers=(SECTION_BEGIN, SECTION_END))


def split(text: str) -> tuple[str | None, str | None]:
    return think_split(text)
