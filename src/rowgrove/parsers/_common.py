"""Pieces shared by the per-family parsers: the result types, canonical argument JSON, schema
look-ups, and the `<think>`-style reasoning split.

A tool parser module exposes `parse(text, tools) -> ToolParse`; a reasoning parser module exposes
`split(text) -> (reasoning, content)`. Neither ever raises on any text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

_DECODER = json.JSONDecoder()


@dataclass
class RawCall:
    """One tool call read from text: name, arguments as a canonical JSON object string, and the
    id the model sampled (None when the format has none)."""

    name: str
    arguments: str
    id: str | None = None


@dataclass
class ToolParse:
    """What a tool parser read: the text outside tool-call syntax (malformed blocks included),
    the calls, and one message per malformed block."""

    content: str
    calls: list[RawCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def dumps(obj: Any) -> str:
    """The canonical arguments string: json.dumps with non-ASCII kept and key order kept."""
    return json.dumps(obj, ensure_ascii=False)


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """json raw_decode from `pos` (leading whitespace skipped); raises ValueError."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return _DECODER.raw_decode(text, pos)


def arguments_json(args: Any, name: str) -> str:
    """Canonical arguments string of an arguments value (an object, or a JSON string holding one);
    raises ValueError saying what is wrong."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise ValueError(f"tool call {name!r}: arguments string is not JSON ({e})") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"tool call {name!r}: arguments is a JSON {type(args).__name__}, expected an object")
    return dumps(args)


def call_from_object(obj: Any, *, keys: tuple[str, ...] = ("arguments", "parameters")) -> RawCall:
    """A RawCall from a `{"name": .., "arguments"|"parameters": {..}}` object; raises ValueError."""
    if not isinstance(obj, dict):
        raise ValueError(f"tool call is a JSON {type(obj).__name__}, expected an object with name and arguments")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool call has no string 'name'")
    args: Any = {}
    for k in keys:
        if k in obj:
            args = obj[k]
            break
    return RawCall(name, arguments_json(args, name))


def finish(pieces: list[str], calls: list[RawCall], errors: list[str]) -> ToolParse:
    """Join the text outside tool-call syntax; with any call parsed, strip surrounding whitespace
    (the templates put a separator between content and calls)."""
    content = "".join(pieces)
    if calls:
        content = content.strip()
    return ToolParse(content, calls, errors)


def scan_blocks(text: str, blocks: Iterable[re.Match[str]],
                read: Callable[[re.Match[str]], RawCall | list[RawCall] | str], *,
                label: str, open_tag: str, close_tag: str, markers: tuple[str, ...] = ()) -> ToolParse:
    """Read the delimited tool-call `blocks` (matches in `text`, in order) with `read`.

    `read(match)` gives a RawCall, a list of them, or a message for a malformed block. Promises:
    calls come out in text order; a malformed block stays in the content verbatim and adds the
    error `"{label} N: message"`, N counting calls plus errors so far; an `open_tag` left after
    the last block adds `"{label} N: {open_tag} without {close_tag} (output cut short?)"`; when
    any call was read, each of `markers` (section tags around the calls) is removed from the
    content. The content is then joined as `finish` does. Never raises unless `read` does.
    """
    calls: list[RawCall] = []
    errors: list[str] = []
    pieces: list[str] = []
    pos = 0
    for m in blocks:
        pieces.append(text[pos:m.start()])
        got = read(m)
        if isinstance(got, str):
            errors.append(f"{label} {len(calls) + len(errors) + 1}: {got}")
            pieces.append(m.group(0))
        elif isinstance(got, list):
            calls.extend(got)
        else:
            calls.append(got)
        pos = m.end()
    tail = text[pos:]
    if open_tag in tail:
        errors.append(f"{label} {len(calls) + len(errors) + 1}: {open_tag} without {close_tag} (output cut short?)")
    pieces.append(tail)
    if calls:
        for marker in markers:
            pieces = [p.replace(marker, "") for p in pieces]
    return finish(pieces, calls, errors)


def tool_properties(tools: list | None, name: str) -> dict[str, Any] | None:
    """The JSON-schema `properties` of tool `name` in an OpenAI `tools` list (entries shaped
    `{"type": "function", "function": {...}}` or bare `{"name", "parameters"}`); None when the
    tool or its schema is unknown."""
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function", tool)
        if not isinstance(fn, dict) or fn.get("name") != name:
            continue
        params = fn.get("parameters")
        if not isinstance(params, dict):
            return None
        props = params.get("properties")
        return props if isinstance(props, dict) else None
    return None


def schema_type(prop: Any) -> str | None:
    """The declared JSON-schema type of one property, lower-cased; the first non-null type of a
    list (or of an anyOf/oneOf); None when undeclared."""
    if not isinstance(prop, dict):
        return None
    t = prop.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None:
        for key in ("anyOf", "oneOf"):
            for sub in prop.get(key) or ():
                st = schema_type(sub)
                if st and st != "null":
                    return st
        if "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
            return "string"
        return None
    return str(t).strip().lower()


def think_split(text: str, open_tag: str = "<think>", close_tag: str = "</think>", *,
                unclosed: str = "content") -> tuple[str | None, str | None]:
    """Split `[open]reasoning close content`; the opening tag may be absent (the prompt opened it).
    Without a closing tag: `unclosed="content"` gives (None, text); `"reasoning"` gives everything
    (opening tag dropped) as reasoning and None content. Reasoning loses surrounding newlines and
    content its leading newlines, the way the templates write them."""
    if close_tag not in text:
        if unclosed == "reasoning":
            before, tag, after = text.partition(open_tag)
            body = after if tag and not before.strip() else text
            return body.strip("\n"), None
        return None, text
    before, _, after = text.partition(close_tag)
    lead = ""
    if open_tag in before:
        lead, _, before = before.partition(open_tag)
        lead = lead.strip()
    content = after.lstrip("\n")
    if lead:
        content = lead + ("\n\n" + content if content else "")
    return before.strip("\n"), content
