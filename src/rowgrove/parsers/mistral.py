"""`mistral`: Mistral tool calls after the `[TOOL_CALLS]` token, in either form:

    [TOOL_CALLS][{"name": "NAME", "arguments": {...}, "id": "abcDEF123"}, ...]    (Nemo, v3 tokenizers)
    [TOOL_CALLS]NAME[ARGS]{...}[TOOL_CALLS]OTHER[ARGS]{...}                       (v11+: Ministral 3, Magistral)

(also `[TOOL_CALLS]NAME{...}` and `[TOOL_CALLS]NAME[CALL_ID]abcDEF123[ARGS]{...}`). Matches vLLM's
`mistral` parser (`vllm/entrypoints/openai/tool_parsers/mistral_tool_parser.py`): content is the text
before the first `[TOOL_CALLS]`. An id the model sampled is kept when it is valid for the Mistral
templates (9 alphanumerics); otherwise the caller makes one (use id style "mistral").

The reasoning parser `mistral` splits `[THINK]...[/THINK]` (vLLM
`vllm/reasoning/mistral_reasoning_parser.py`).
"""

from __future__ import annotations

import re

from rowgrove.parsers._common import RawCall, ToolParse, arguments_json, call_from_object, finish, raw_decode, think_split

NAMES = ("mistral",)
REASONING_NAMES = ("mistral",)
BOT = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"\s*([^\s\[\]{}]+)")
_ID = re.compile(r"\s*([A-Za-z0-9]+)")


def valid_id(value: object) -> bool:
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()


def _read_one(text: str, pos: int) -> tuple[list[RawCall], int]:
    """The call(s) right after one `[TOOL_CALLS]` at `pos`; raises ValueError."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    if text.startswith("[", pos) and not text.startswith(ARGS, pos) and not text.startswith(CALL_ID, pos):
        arr, end = raw_decode(text, pos)
        if isinstance(arr, dict):
            arr = [arr]
        if not isinstance(arr, list) or not arr:
            raise ValueError("expected a JSON array of tool calls")
        calls = []
        for obj in arr:
            call = call_from_object(obj)
            sampled = obj.get("id")
            call.id = sampled if valid_id(sampled) else None
            calls.append(call)
        return calls, end
    m = _NAME.match(text, pos)
    if not m:
        raise ValueError("no function name after [TOOL_CALLS]")
    name, pos = m.group(1), m.end()
    call_id = None
    if text.startswith(CALL_ID, pos):
        idm = _ID.match(text, pos + len(CALL_ID))
        if not idm:
            raise ValueError(f"tool call {name!r}: [CALL_ID] without an id")
        call_id, pos = idm.group(1), idm.end()
    if text.startswith(ARGS, pos):
        pos += len(ARGS)
    try:
        args, end = raw_decode(text, pos)
    except ValueError as e:
        raise ValueError(f"tool call {name!r}: arguments do not parse as JSON ({e})") from None
    return [RawCall(name, arguments_json(args, name), call_id if valid_id(call_id) else None)], end


def parse(text: str, tools: list | None = None) -> ToolParse:
    first = text.find(BOT)
    if first < 0:
        return ToolParse(text)
    calls: list[RawCall] = []
    errors: list[str] = []
    pieces = [text[:first]]
    pos = first
    while pos < len(text):
        if not text.startswith(BOT, pos):
            nxt = text.find(BOT, pos)
            if nxt < 0:
                pieces.append(text[pos:])
                break
            pieces.append(text[pos:nxt])
            pos = nxt
        try:
            got, end = _read_one(text, pos + len(BOT))
        except ValueError as e:
            errors.append(f"mistral call {len(calls) + len(errors) + 1}: {e}")
            nxt = text.find(BOT, pos + len(BOT))
            end = nxt if nxt >= 0 else len(text)
            pieces.append(text[pos:end])
            pos = end
            continue
        calls.extend(got)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n,":
            if text.startswith(BOT, pos):
                break
            pos += 1
    return finish(pieces, calls, errors)


def split(text: str) -> tuple[str | None, str | None]:
    return think_split(text, "[THINK]", "[/THINK]")
