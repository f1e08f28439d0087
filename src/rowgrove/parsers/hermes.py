"""`hermes`: Hermes / Qwen2.5 / Qwen3 tool calls, one JSON object per block:

    <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>

Matches vLLM's `hermes` parser (`vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py`),
except that content is all text outside the blocks (stripped when a call was read), a malformed
block stays in the content, and `"parameters"` or a JSON-string `"arguments"` is accepted too.
"""

from __future__ import annotations

import json
import re

from rowgrove.parsers._common import RawCall, ToolParse, scan_blocks
from rowgrove.toolcalls import _BLOCK, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, _read_block

NAMES = ("hermes",)


def _read(m: re.Match[str]) -> RawCall | str:
    got = _read_block(m.group(1).strip())
    return got if isinstance(got, str) else RawCall(got[0], got[1])


def parse(text: str, tools: list | None = None) -> ToolParse:
    return scan_blocks(text, _BLOCK.finditer(text), _read,
                       label="hermes block", open_tag=TOOL_CALL_OPEN, close_tag=TOOL_CALL_CLOSE)


def format_call(name: str, arguments: dict) -> str:
    """The text the Qwen templates render for one call."""
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n{TOOL_CALL_CLOSE}'
