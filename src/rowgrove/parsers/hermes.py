"""`hermes`: Hermes / Qwen2.5 / Qwen3 tool calls, one JSON object per block:

    <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>

Matches vLLM's `hermes` parser (`vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py`),
except that content is all text outside the blocks (stripped when a call was read), a malformed
block stays in the content, and `"parameters"` or a JSON-string `"arguments"` is accepted too.
"""

from __future__ import annotations

import json

from rowgrove.parsers._common import RawCall, ToolParse, finish
from rowgrove.toolcalls import _BLOCK, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, _read_block

NAMES = ("hermes",)


def parse(text: str, tools: list | None = None) -> ToolParse:
    calls: list[RawCall] = []
    errors: list[str] = []
    pieces: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        pieces.append(text[pos:m.start()])
        got = _read_block(m.group(1).strip())
        if isinstance(got, str):
            errors.append(f"hermes block {len(calls) + len(errors) + 1}: {got}")
            pieces.append(m.group(0))
        else:
            calls.append(RawCall(got[0], got[1]))
        pos = m.end()
    tail = text[pos:]
    if TOOL_CALL_OPEN in tail:
        errors.append(f"hermes block {len(calls) + len(errors) + 1}: {TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE} (output cut short?)")
    pieces.append(tail)
    return finish(pieces, calls, errors)


def format_call(name: str, arguments: dict) -> str:
    """The text the Qwen templates render for one call."""
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n{TOOL_CALL_CLOSE}'
