"""`glm45`: GLM-4.5 / GLM-4.6 tool calls, name then key/value pairs:

    <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>

Matches vLLM's `glm45` tool parser (`vllm/entrypoints/openai/tool_parsers/glm4_moe_tool_parser.py`):
a value is JSON-decoded when it parses as JSON, else kept as the string, and kept as the string
whenever the request's tool schema types that argument as a string (the template writes string
values raw and everything else as JSON). Content is the text outside the blocks.

The reasoning parser `glm45` splits `<think>...</think>` (vLLM
`vllm/reasoning/glm4_moe_reasoning_parser.py`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rowgrove.parsers._common import RawCall, ToolParse, dumps, scan_blocks, schema_type, think_split, tool_properties

NAMES = ("glm45", "glm47")
REASONING_NAMES = ("glm45",)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _value(raw: str, prop: Any) -> Any:
    if schema_type(prop) == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _read(body: str, tools: list | None) -> RawCall | str:
    first = body.find("<arg_key>")
    head = body if first < 0 else body[:first]
    name = head.strip()
    if not name or "\n" in name or "<" in name:
        return "tool call has no name line"
    props = tool_properties(tools, name) or {}
    args: dict[str, Any] = {}
    rest = body[first:] if first >= 0 else ""
    pos = 0
    for m in _PAIR.finditer(rest):
        if rest[pos:m.start()].strip():
            return f"tool call {name!r}: unexpected text between arguments"
        args[m.group(1).strip()] = _value(m.group(2), props.get(m.group(1).strip()))
        pos = m.end()
    if rest[pos:].strip():
        return f"tool call {name!r}: unclosed or stray argument tags"
    return RawCall(name, dumps(args))


def parse(text: str, tools: list | None = None) -> ToolParse:
    return scan_blocks(text, _BLOCK.finditer(text), lambda m: _read(m.group(1), tools),
                       label="glm45 block", open_tag=OPEN, close_tag=CLOSE)


def split(text: str) -> tuple[str | None, str | None]:
    return think_split(text)
