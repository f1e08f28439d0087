"""`llama3_json`: Llama 3.1 / 3.2 (and 4) JSON tool calls, a bare object, possibly after
`<|python_tag|>`, several separated by `;`:

    <|python_tag|>{"name": "NAME", "parameters": {...}}; {"name": "OTHER", "parameters": {...}}

Matches vLLM's `llama3_json` parser (`vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py`):
`"parameters"` or `"arguments"` are the arguments. vLLM returns no content when calls are found;
here any text around the JSON is kept as (stripped) content. A run of JSON only counts when it
follows `<|python_tag|>` or starts with `{"name":` -- other JSON in prose stays content. After
`<|python_tag|>` (or when the whole reply starts with `{"name":`) JSON that does not read is an error.
"""

from __future__ import annotations

import re

from rowgrove.parsers._common import RawCall, ToolParse, call_from_object, finish, raw_decode

NAMES = ("llama3_json", "llama4_json")
PYTHON_TAG = "<|python_tag|>"
_START = re.compile(r'\{\s*"name"\s*:')


def _read_run(text: str, pos: int) -> tuple[list[RawCall], int]:
    """The `;`-separated call objects from `pos`; raises ValueError on the first bad one."""
    calls: list[RawCall] = []
    while True:
        obj, end = raw_decode(text, pos)
        if not isinstance(obj, dict) or not ("parameters" in obj or "arguments" in obj):
            call_from_object(obj)  # raises with the reason, when there is one
            raise ValueError("tool call object has no 'parameters' or 'arguments'")
        calls.append(call_from_object(obj, keys=("parameters", "arguments")))
        rest = end
        while rest < len(text) and text[rest] in " \t\r\n":
            rest += 1
        if rest < len(text) and text[rest] == ";":
            pos = rest + 1
            if not text[pos:].strip():
                return calls, len(text)
            continue
        return calls, end


def parse(text: str, tools: list | None = None) -> ToolParse:
    tag = text.find(PYTHON_TAG)
    if tag >= 0:
        start = tag + len(PYTHON_TAG)
        try:
            calls, end = _read_run(text, start)
        except ValueError as e:
            return ToolParse(text, [], [f"llama3_json call after {PYTHON_TAG}: {e}"])
        return finish([text[:tag], text[end:]], calls, [])
    for m in _START.finditer(text):
        try:
            calls, end = _read_run(text, m.start())
        except ValueError as e:
            if not text[:m.start()].strip():  # the reply itself is a (broken) call
                return ToolParse(text, [], [f"llama3_json call 1: {e}"])
            continue
        return finish([text[:m.start()], text[end:]], calls, [])
    return ToolParse(text)
