"""`deepseek_v31` (and `deepseek_v3`): DeepSeek tool calls, both forms accepted by either name:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>    (V3.1, V3.2 chat)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>...   (V3, R1)

Match vLLM's `deepseek_v31` (`vllm/entrypoints/openai/tool_parsers/deepseekv31_tool_parser.py`) and
`deepseek_v3` (`vllm/entrypoints/openai/tool_parsers/deepseekv3_tool_parser.py`) parsers: content
is the text outside the calls section. Unlike vLLM, arguments must be JSON (they are
re-serialised canonically); a call whose arguments do not parse stays in the content.
"""

from __future__ import annotations

import json
import re

from rowgrove.parsers._common import RawCall, ToolParse, arguments_json, scan_blocks

NAMES = ("deepseek_v31", "deepseek_v3")
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_V3_BODY = re.compile(r"\s*([^\n]+?)\s*\n\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _read(head: str, body: str) -> RawCall | str:
    name, args = head.strip(), body
    if name == "function" or not name:
        m = _V3_BODY.match(body)
        if m:
            name, args = m.group(1).strip(), m.group(2)
    if not name:
        return "tool call has no name"
    try:
        return RawCall(name, arguments_json(json.loads(args) if args.strip() else {}, name))
    except ValueError as e:
        msg = str(e)
        return msg if msg.startswith("tool call") else f"tool call {name!r}: arguments do not parse as JSON ({msg})"


def parse(text: str, tools: list | None = None) -> ToolParse:
    if CALL_BEGIN not in text:
        if CALLS_BEGIN in text:
            return ToolParse(text, [], [f"deepseek call 1: {CALLS_BEGIN} without {CALL_BEGIN} (output cut short?)"])
        return ToolParse(text)
    return scan_blocks(text, _CALL.finditer(text), lambda m: _read(m.group(1), m.group(2)),
                       label="deepseek call", open_tag=CALL_BEGIN, close_tag=CALL_END,
                       markers=(CALLS_BEGIN, CALLS_END))  # the section markers are syntax, not content
