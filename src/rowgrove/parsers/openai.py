"""`openai`: gpt-oss (harmony) output, both the tool parser and the reasoning parser. The sampled
text is a run of harmony messages after the prompt's `<|start|>assistant`:

    <|channel|>analysis<|message|>THOUGHT<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"city": "Paris"}
    <|channel|>final<|message|>ANSWER

(the recipient ` to=functions.NAME` may also sit before `<|channel|>`; the closing `<|call|>` or
`<|return|>` is usually already stripped). Matches vLLM's `openai` tool parser
(`vllm/entrypoints/openai/tool_parsers/openai_tool_parser.py`) and `openai_gptoss` reasoning parser
(`vllm/reasoning/gptoss_reasoning_parser.py`): a message to `functions.NAME` is a tool call, the
analysis channel is reasoning, the final channel is content. Here commentary messages without a
recipient (preambles) count as content too, and messages to other recipients (built-in tools such
as `browser.search`) are kept raw in the content; vLLM drops both. Arguments must be JSON even if the
content type says otherwise; a call whose arguments do not parse stays in the content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rowgrove.parsers._common import RawCall, ToolParse, arguments_json, finish

NAMES = ("openai",)
REASONING_NAMES = ("openai",)
START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_STOP = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>|<\|start\|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_][\w.-]*)")


@dataclass
class Harmony:
    """Everything read from harmony text."""

    reasoning: str | None
    tools: ToolParse


def read(text: str, *, tool_calls: bool = True) -> Harmony:
    """Read harmony messages. With `tool_calls` False, messages to functions stay raw in the content."""
    reasoning: list[str] = []
    pieces: list[str] = []
    calls: list[RawCall] = []
    errors: list[str] = []
    if MESSAGE not in text and CHANNEL not in text:
        return Harmony(None, ToolParse(text))
    pos = 0
    n = len(text)
    while pos < n:
        seg_start = pos
        if text.startswith(START, pos):
            pos += len(START)
        mi = text.find(MESSAGE, pos)
        si = _STOP.search(text, pos)
        if mi < 0 or (si is not None and si.start() < mi):
            # no header/body here: raw text up to the next message start
            nxt = text.find(START, pos)
            end = nxt if nxt >= 0 and nxt > seg_start else n
            raw = text[seg_start:end]
            if raw.strip() and not all(raw.strip() == e for e in ENDS):
                if MESSAGE not in raw and CHANNEL in raw:
                    errors.append(f"harmony message header without {MESSAGE} (output cut short?)")
                pieces.append(raw)
            pos = end
            continue
        header = text[pos:mi]
        body_start = mi + len(MESSAGE)
        stop = _STOP.search(text, body_start)
        body_end = stop.start() if stop else n
        pos = body_end
        if stop and stop.group(0) != START:
            pos = stop.end()
        body = text[body_start:body_end]
        raw_segment = text[seg_start:pos]
        clean = header.replace(CONSTRAIN, " ")
        rm = _RECIPIENT.search(clean)
        recipient = rm.group(1) if rm else None
        cm = _CHANNEL.search(clean)
        channel = cm.group(1) if cm else None
        if recipient and recipient.startswith("functions.") and tool_calls:
            name = recipient[len("functions."):]
            try:
                if not name:
                    raise ValueError("tool call recipient 'functions.' has no name")
                args = arguments_json(json.loads(body) if body.strip() else {}, name)
            except ValueError as e:
                msg = str(e)
                errors.append(f"harmony call {len(calls) + len(errors) + 1}: "
                              + (msg if msg.startswith("tool call") else f"tool call {name!r}: arguments do not parse as JSON ({msg})"))
                pieces.append(raw_segment)
                continue
            calls.append(RawCall(name, args))
        elif recipient:
            pieces.append(raw_segment)
        elif channel == "analysis":
            reasoning.append(body)
        else:  # final, commentary preambles, or no channel at all
            pieces.append(body)
    return Harmony("\n".join(reasoning) if reasoning else None, finish(pieces, calls, errors))


def parse(text: str, tools: list | None = None) -> ToolParse:
    return read(text).tools


def split(text: str) -> tuple[str | None, str | None]:
    h = read(text, tool_calls=False)
    return h.reasoning, h.tools.content
