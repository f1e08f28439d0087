"""What a request's messages must be (refused as an OpenAI-compatible server refuses them, each
error naming the message and the fix), and the assistant message the gateway returns and hashes
for a sampled reply. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rowgrove.errors import BadRequest
from rowgrove.hashing import ROLES, media_part_problem

if TYPE_CHECKING:
    from rowgrove.toolcalls import ParsedMessage


# -- messages the edge decoded by what they add to the last request ---------------------------------


class Kept(list):
    """A request's decoded messages whose first `kept` are the very objects, unchanged, of the list
    `source` (the same rollout's previous request, as `gateway.dialects.growing` decodes it): so
    they are what that request sent, byte for byte, and `RolloutIndex.chain` reuses that request's
    hashes for them without serializing them again. Only the edge builds one, from bytes it
    decoded; nothing mutates a decoded request."""

    __slots__ = ("kept", "source")

    def __init__(self, items: list[Any], kept: int, source: list[Any]):
        super().__init__(items)
        self.kept, self.source = kept, source


# -- a request's images, as the edge resolved them ---------------------------------------------------


@dataclass(frozen=True)
class RequestImages:
    """A request's images resolved once, at the edge (`gateway.images.load_request_images`), before
    `decide`: what the decision and rendering core reads instead of the image parts' URLs.

    `images`: the decoded images (`rowgrove.media.Image`) in prompt order, one per image part.
    `digests`: (message index, part index) of each image part -> the pixel digest its URL names,
    or None for a URL that names none (a data URL without an image type)."""

    images: list[Any] = field(default_factory=list)
    digests: dict[tuple[int, int], str | None] = field(default_factory=dict)

    @cached_property
    def by_message(self) -> dict[int, dict[int, str | None]]:
        """message index -> {part index -> pixel digest} of its image parts."""
        out: dict[int, dict[int, str | None]] = {}
        for (i, k), digest in self.digests.items():
            out.setdefault(i, {})[k] = digest
        return out

    @cached_property
    def by_digest(self) -> dict[str, Any]:
        """pixel digest -> the request's first image with those pixels."""
        out: dict[str, Any] = {}
        for img in self.images:
            out.setdefault(img.digest, img)
        return out


NO_IMAGES = RequestImages()


# -- validation ------------------------------------------------------------------------------------

_ROLE_LIST = ", ".join(ROLES)


def validate_messages(messages: Any, tools: Any = None) -> None:
    """Refuse what an OpenAI-compatible server refuses, naming the message and the fix (BadRequest,
    param "messages", or "tools" for the tools): not a non-empty list, a message that is not an
    object, an unknown role, content of the wrong type, malformed assistant tool calls, a tool
    message whose tool_call_id answers no earlier assistant tool call."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of message objects", param="messages")
    for i in range(len(messages)):
        _check_message(messages, i)
    validate_tools(tools)


def validate_tools(tools: Any) -> None:
    """Tools must be null or a list of `{"type": "function", "function": {"name": str, ...}}`."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise BadRequest(f"tools must be a list of tool objects, got {type(tools).__name__}", param="tools")
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise BadRequest(f'tools[{k}] must be {{"type": "function", "function": {{"name": ...}}}}', param="tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{k}].function.name must be a non-empty string", param="tools")


def _bad(i: int, what: str) -> BadRequest:
    return BadRequest(f"messages[{i}]: {what}", param="messages")


def _check_message(messages: Sequence[Any], i: int) -> None:
    m = messages[i]
    if not isinstance(m, Mapping):
        raise _bad(i, f"each message must be an object with a 'role', got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES:
        raise _bad(i, f"unknown role {role!r}: use one of {_ROLE_LIST}")
    content = m.get("content")
    if content is None:
        if role not in ("assistant",):
            raise _bad(i, f"a {role} message needs content: a string or a list of content parts")
    elif isinstance(content, list):
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise _bad(i, f'content[{k}] must be an object with a "type" (e.g. {{"type": "text", "text": ...}})')
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise _bad(i, f"content[{k}] is a text part without a string 'text'")
            problem = media_part_problem(part)
            if problem is not None:
                raise _bad(i, f"content[{k}]: {problem}")
    elif not isinstance(content, str):
        raise _bad(i, f"content must be a string, null or a list of content parts, got {type(content).__name__}")
    for key in ("name", "reasoning_content", "reasoning"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise _bad(i, f"{key} must be a string, got {type(m[key]).__name__}")
    tool_calls = m.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise _bad(i, f"only assistant messages carry tool_calls, this one is {role}")
        _check_tool_calls(i, tool_calls)
    if role == "tool":
        tcid = m.get("tool_call_id")
        if not isinstance(tcid, str) or not tcid:
            raise _bad(i, "a tool message needs the tool_call_id of the assistant tool call it answers")
        if not _answers_earlier_call(messages, i, tcid):
            raise _bad(i, f"tool_call_id {tcid!r} matches no tool call of an earlier assistant message: "
                          "send the id the assistant's tool call carried")


def _check_tool_calls(i: int, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise _bad(i, f"tool_calls must be a list, got {type(tool_calls).__name__}")
    for k, tc in enumerate(tool_calls):
        where = f"tool_calls[{k}]"
        if not isinstance(tc, Mapping):
            raise _bad(i, f"{where} must be an object with id, type and function")
        if not isinstance(tc.get("id"), str) or not tc["id"]:
            raise _bad(i, f"{where}.id must be a non-empty string (tool messages answer it by this id)")
        if tc.get("type", "function") != "function":
            raise _bad(i, f'{where}.type must be "function", got {tc.get("type")!r}')
        fn = tc.get("function")
        if not isinstance(fn, Mapping):
            raise _bad(i, f"{where}.function must be an object with name and arguments")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(i, f"{where}.function.name must be a non-empty string")
        if not isinstance(fn.get("arguments"), str):
            raise _bad(i, f"{where}.function.arguments must be a JSON string (as OpenAI sends it), "
                          f"got {type(fn.get('arguments')).__name__}")


def _answers_earlier_call(messages: Sequence[Any], i: int, tcid: str) -> bool:
    """Whether an assistant message before `i` has a tool call with id `tcid` (searched backwards,
    so the usual case, the assistant just before, costs O(1))."""
    for k in range(i - 1, -1, -1):
        m = messages[k]
        if isinstance(m, Mapping) and m.get("role") == "assistant":
            for tc in m.get("tool_calls") or ():
                if isinstance(tc, Mapping) and tc.get("id") == tcid:
                    return True
    return False


# -- the response message --------------------------------------------------------------------------


def response_message(parsed: ParsedMessage, call_id: str | None = None) -> dict[str, Any]:
    """The assistant message the gateway returns and hashes, from a parsed sampled text: role,
    content (None when only tool calls were said, else a string), tool_calls (arguments as JSON
    strings) when there are any, reasoning_content when there is reasoning. With `call_id`, tool
    call ids are derived from it (`toolcalls.tool_call_id`); without, the parser's ids (made in the
    form the template demands, or sampled by the model) are kept."""
    msg: dict[str, Any] = {"role": "assistant"}
    tool_calls = [dict(tc, function=dict(tc["function"])) for tc in parsed.tool_calls]
    if call_id is not None:
        from rowgrove.toolcalls import tool_call_id

        for k, tc in enumerate(tool_calls):
            tc["id"] = tool_call_id(call_id, k, tc["function"]["name"], tc["function"]["arguments"])
    msg["content"] = parsed.content if parsed.content else (None if tool_calls else "")
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    return msg
