"""Hermes-style tool calls in assistant text: writing them (`format_tool_call`, the exact text the
templates in `rowgrove.model.templates` render and the model should sample) and reading them back
(`parse_assistant_text`, which turns sampled text into an OpenAI assistant message).

The assistant body grammar (shared by all three shipped templates):

    [<think>\\n{reasoning}\\n</think>\\n\\n]{content}[\\n]<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>[\\n<tool_call>…]

Parsing never raises: a block whose JSON is malformed (or unclosed, e.g. cut by max_tokens) stays
in the content, and `.errors` says what was wrong with it. Text is only ever parsed for the
response shown to the harness; training uses the sampled token ids, never a re-encoding.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass
class ParsedMessage:
    """An assistant message read from sampled text.

    `content` is None when nothing but reasoning/tool calls was said. `tool_calls` are OpenAI-shaped
    (`{"id", "type": "function", "function": {"name", "arguments": JSON string}}`). `errors` names
    each malformed tool-call block left in the content.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    errors: list[str] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message (`reasoning_content` only when there is reasoning)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        return msg


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The exact text of one tool call as the templates render it and the model should sample it:
    `<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>` (json.dumps, non-ASCII kept,
    argument order kept)."""
    body = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + json.dumps(dict(arguments), ensure_ascii=False) + "}"
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def format_assistant_text(content: str | None = None, tool_calls: Sequence[tuple[str, Mapping[str, Any]]] = (),
                          reasoning: str | None = None) -> str:
    """The whole assistant body the templates render between the generation prompt and the
    end-of-turn token: optional think block, content, then the tool calls (name, arguments)."""
    out = f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n" if reasoning else ""
    out += content or ""
    for i, (name, args) in enumerate(tool_calls):
        if content or i:
            out += "\n"
        out += format_tool_call(name, args)
    return out


def tool_call_id(id_seed: str, index: int, name: str, arguments: str) -> str:
    """A deterministic call id: `call_` + 24 hex chars of sha256(seed, index, name, arguments).
    Give a seed unique to the model call (e.g. the gateway's call id) so ids are unique too."""
    h = hashlib.sha256(f"{id_seed}\x00{index}\x00{name}\x00{arguments}".encode()).hexdigest()
    return "call_" + h[:24]


def _read_block(body: str) -> tuple[str, str] | str:
    """(name, arguments JSON string) of one block's body, or a message saying what is wrong."""
    try:
        obj = json.loads(body)
    except ValueError as e:
        return f"tool call JSON does not parse ({e})"
    if not isinstance(obj, dict):
        return f"tool call is a JSON {type(obj).__name__}, expected an object with name and arguments"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError as e:
            return f"tool call {name!r}: arguments string is not JSON ({e})"
    if not isinstance(args, dict):
        return f"tool call {name!r}: arguments is a JSON {type(args).__name__}, expected an object"
    return name, json.dumps(args, ensure_ascii=False)


def parse_assistant_text(text: str, *, id_seed: str = "") -> ParsedMessage:
    """Read sampled assistant text (end-of-turn token excluded) into content, reasoning and tool
    calls. Never raises. Reasoning comes from a leading `<think>…</think>` (or text before a lone
    `</think>` when the prompt opened the block). Tool-call ids are `tool_call_id(id_seed, i, ...)`.
    Without tool calls the content is the text as sampled (after the think block); with tool
    calls it is the remaining text stripped of surrounding whitespace. Empty content is None.
    """
    reasoning: str | None = None
    rest = text
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        inner, _, rest = stripped[len(THINK_OPEN):].partition(THINK_CLOSE)
        reasoning = inner.strip("\n")
        rest = rest.lstrip("\n")
    elif THINK_CLOSE in text and THINK_OPEN not in text.partition(THINK_CLOSE)[0]:
        inner, _, rest = text.partition(THINK_CLOSE)
        reasoning = inner.strip("\n")
        rest = rest.lstrip("\n")

    tool_calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(rest):
        got = _read_block(m.group(1).strip())
        kept.append(rest[pos:m.start()])
        if isinstance(got, str):
            errors.append(f"block {len(tool_calls) + len(errors) + 1}: {got}")
            kept.append(m.group(0))
        else:
            name, args = got
            tool_calls.append({"id": tool_call_id(id_seed, len(tool_calls), name, args), "type": "function",
                               "function": {"name": name, "arguments": args}})
        pos = m.end()
    tail = rest[pos:]
    if TOOL_CALL_OPEN in tail:
        errors.append(f"block {len(tool_calls) + len(errors) + 1}: {TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE} (output cut short?)")
    kept.append(tail)
    content = "".join(kept)
    if tool_calls:
        content = content.strip()
    return ParsedMessage(content=content or None, tool_calls=tool_calls, reasoning=reasoning, errors=errors)
