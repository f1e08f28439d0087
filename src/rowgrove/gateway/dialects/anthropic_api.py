"""The Anthropic Messages API (`POST /rollouts/{rollout_id}/v1/messages`, which the official
`anthropic` SDK calls with `base_url=http://HOST:PORT/rollouts/{rollout_id}`) translated at the
edge into the one canonical conversation the gateway knows (Chat Completions messages), and the
gateway's answer translated back into a `message` object or Anthropic's SSE events.

Wire format as the `anthropic` SDK defines it (`anthropic/types/message_create_params.py`,
`message_param.py`, `message.py`, `raw_message_stream_event.py`, `shared/error_response.py`):

    Messages API                                  chat message
    system (string or text blocks)                {"role": "system", "content": ...}
    user: text / image blocks                     {"role": "user", "content": ...}
    user: tool_result block                       {"role": "tool", "tool_call_id": tool_use_id, ...}
    assistant: thinking blocks                    reasoning_content
    assistant: text blocks                        content
    assistant: tool_use {id, name, input}         tool_calls[k] (id, function.name, arguments = JSON of input)
    tools [{name, description, input_schema}]     [{"type": "function", "function": {name, description, parameters}}]

A user message's blocks keep their order: each tool_result is one tool message, each run of
text/image blocks one user message. One text block becomes its string, as every template renders
it. The reply's `content` is built from the chat message the gateway returned: a `thinking` block
(signature "") when the model family splits reasoning off, a `text` block when there is text, a
`tool_use` block per tool call; `stop_reason` is `tool_use`, `max_tokens` or `end_turn`.

Errors on this route leave in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`
(`error_body`), with the same statuses as the OpenAI-shaped errors of the other routes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, TypeAdapter, ValidationError, with_config
from typing_extensions import NotRequired, TypedDict

from rowgrove.errors import BadRequest
from rowgrove.gateway.dialects.openai_format import ChatRequest, parse_chat_request
from rowgrove.gateway.dialects.leading import merge_leading_system
from rowgrove.gateway.dialects.validation import (
    STRICT_DICT,
    Snapshot,
    Strict,
    bad_request,
    checked,
    checked_items,
    extended_blob,
    reuse,
    snapshot_key,
    tool_call_ids,
)

# -- the request, as pydantic models -------------------------------------------------------------
# Messages and their blocks are TypedDicts (validated in pydantic-core into plain dicts, once per
# message per rollout: `validation.checked_items`); the top level is a model.


@with_config(STRICT_DICT)
class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


@with_config(STRICT_DICT)
class Base64Source(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


@with_config(STRICT_DICT)
class UrlSource(TypedDict):
    type: Literal["url"]
    url: Annotated[str, Field(min_length=1)]


@with_config(STRICT_DICT)
class ImageBlock(TypedDict):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


@with_config(STRICT_DICT)
class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]


@with_config(STRICT_DICT)
class ToolResultBlock(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: NotRequired[str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]]]
    is_error: NotRequired[bool | None]


@with_config(STRICT_DICT)
class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: NotRequired[str | None]


@with_config(STRICT_DICT)
class RedactedThinkingBlock(TypedDict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


@with_config(STRICT_DICT)
class MessageParam(TypedDict):
    role: Literal["user", "assistant", "system"]  # system: Claude Code puts some inside `messages`
    content: str | list[Block]


MESSAGE = TypeAdapter(MessageParam)


class ToolParam(Strict):
    type: Literal["custom"] | None = None   # server tools (bash_..., web_search_...) are not served here
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(Strict):
    """A `messages.create` body: the fields that change what the model sees or how it samples.
    Others the SDK sends (metadata, service_tier, thinking, ...) are ignored."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Any] = Field(min_length=1)          # checked one by one against `MessageParam`
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[Any] | None = None                     # checked one by one: `checked_tools`
    tool_choice: ToolChoice | None = None
    script: str | None = None                          # extra_body: the scripted engine's reply
    chat_template_kwargs: dict[str, Any] | None = None  # extra_body: template variables


# -- messages -> chat messages ----------------------------------------------------------------------


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    src = block["source"]
    url = f"data:{src['media_type']};base64,{src['data']}" if src["type"] == "base64" else src["url"]
    return {"type": "image_url", "image_url": {"url": url}}


def _content(parts: Sequence[dict[str, Any]]) -> Any:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return list(parts)


def system_message(system: Any) -> list[dict[str, Any]]:
    """The chat system message for a checked `system` (none when it is absent or empty)."""
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    return [{"role": "system", "content": _content([_part(b) for b in system])}] if system else []


def messages_to_chat(system: Any, messages: Sequence[Mapping[str, Any]], *, where: str = "messages",
                     known: Any = (), offset: int = 0) -> list[dict[str, Any]]:
    """Chat messages for a checked Messages API conversation (see the module docstring); `known`:
    the tool_use ids of the messages before these. BadRequest (param `where`, message index +
    `offset`) for blocks in the wrong role and for a tool_result that answers no earlier tool_use."""
    out = system_message(system)
    known = set(known)
    for i0, m in enumerate(messages):
        i = offset + i0
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if m["role"] == "system":  # at its place, its text blocks as the system message's content
            if any(b["type"] != "text" for b in content):
                raise BadRequest(f"{where}[{i}].content: a system message holds only text blocks", param=where)
            out.append({"role": "system", "content": _content([_part(b) for b in content])})
            continue
        if m["role"] == "assistant":
            out.append(_assistant(content, i, where))
            known.update(tc["id"] for tc in out[-1].get("tool_calls") or ())
            continue
        if not content:
            raise BadRequest(f"{where}[{i}].content: a user message needs at least one block", param=where)
        run: list[dict[str, Any]] = []
        for k, b in enumerate(content):
            kind = b["type"]
            if kind in ("text", "image"):
                run.append(_part(b))
                continue
            if kind != "tool_result":
                raise BadRequest(f"{where}[{i}].content[{k}]: a {kind} block belongs in an assistant message",
                                 param=where)
            if b["tool_use_id"] not in known:
                raise BadRequest(f"{where}[{i}].content[{k}]: tool_result tool_use_id {b['tool_use_id']!r} answers "
                                 "no earlier tool_use block: send the id of the tool_use it answers", param=where)
            if run:
                out.append({"role": "user", "content": _content(run)})
                run = []
            result = b.get("content", "")
            if not isinstance(result, str):
                result = _content([_part(p) for p in result])
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        if run:
            out.append({"role": "user", "content": _content(run)})
    return out


def _assistant(blocks: Sequence[Mapping[str, Any]], i: int, where: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, b in enumerate(blocks):
        kind = b["type"]
        if kind == "text":
            texts.append(_part(b))
        elif kind == "thinking":
            thinking.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted elsewhere: nothing a template could render
        elif kind == "tool_use":
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()}})
        else:
            raise BadRequest(f"{where}[{i}].content[{k}]: a {kind} block belongs in a user message", param=where)
    msg: dict[str, Any] = {"role": "assistant", "content": _content(texts) if texts else (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


_SYSTEM = TypeAdapter(str | list[TextBlock] | None)


def finish_messages(value: Any, where: str = "messages") -> list[dict[str, Any]]:
    """`finish` with `"format": "anthropic"`: a Messages API conversation as chat messages. A
    leading `{"role": "system", "content": ...}` entry stands for the request's `system`."""
    if not isinstance(value, list):
        raise BadRequest(f"'{where}' must be a list of Messages API messages", param=where)
    system = None
    if value and isinstance(value[0], Mapping) and value[0].get("role") == "system":
        try:
            system = _SYSTEM.validate_python(value[0].get("content"), strict=True)
        except ValidationError as e:
            raise bad_request(e, (where, 0, "content")) from None
        value = value[1:]
    return messages_to_chat(system, checked_items(MESSAGE, value, where), where=where)


def _translate(raw: list[Any], memo: dict[bytes, Any] | None) -> list[dict[str, Any]]:
    """`messages` as chat messages, reusing the rollout's snapshot of its last request when this one
    repeats it (`validation.Snapshot`; every message boundary is a clean cut), and leaving a
    snapshot for the next."""
    snap = reuse(memo, b"a", raw)
    start, head, known = (snap.cut, snap.messages, snap.known) if snap is not None else (0, [], frozenset())
    tail = messages_to_chat(None, checked_items(MESSAGE, raw[start:], "messages", memo, b"a", offset=start),
                            known=known, offset=start)
    conversation = head + tail
    if memo is not None:
        memo[snapshot_key(b"a")] = Snapshot(len(raw), extended_blob(snap, raw, len(raw)), conversation,
                                            known | tool_call_ids(tail))
    return conversation


# server tools: Anthropic runs them (the "Server tools" page of Anthropic's tool-use docs); the
# Anthropic-defined client tools (bash_*, text_editor_*, computer_*, memory_*) run on the client
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")


def checked_tools(raw: Any, refuse_hosted: bool = False) -> tuple[list[ToolParam], list[str]]:
    """(the client tools the model sees, the server tools' types left out). BadRequest names the
    one tool at fault: a server tool under `refuse_hosted`, an Anthropic-defined client tool (it
    has no input_schema to render)."""
    tools: list[ToolParam] = []
    hosted: list[str] = []
    for i, t in enumerate(raw or ()):
        kind = t.get("type") if isinstance(t, Mapping) else None
        if isinstance(kind, str) and kind.startswith(SERVER_TOOLS):
            if refuse_hosted:
                raise BadRequest(f"the server tool {kind!r} ('tools[{i}]') cannot run on this gateway's engine "
                                 "(served with --hosted-tools refuse): remove it from 'tools'", param="tools")
            hosted.append(kind)
            continue
        if kind not in (None, "custom"):
            raise BadRequest(f"'tools[{i}].type' {kind!r} is not served here: declare the tool with a name, "
                             "description and input_schema", param="tools")
        try:
            tools.append(checked(ToolParam, t))
        except BadRequest as e:
            raise BadRequest(f"tools[{i}]: {e}", param="tools", code=e.code) from None
    return tools, hosted


def parse_messages_request(body: Any, *, default_max_tokens: int, memo: dict[bytes, Any] | None = None,
                           refuse_hosted: bool = False) -> tuple[MessagesRequest, ChatRequest]:
    """Check a decoded `messages.create` body and translate it; BadRequest names the field.
    `memo`: the rollout's memo of checked messages (`validation.checked_items`)."""
    req = checked(MessagesRequest, body)
    messages = merge_leading_system(system_message(req.system) + _translate(req.messages, memo))
    client_tools, hosted = checked_tools(req.tools, refuse_hosted)
    tools = []
    for t in client_tools:
        fn: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        fn["parameters"] = t.input_schema
        tools.append({"type": "function", "function": fn})
    choice: Any = None
    if req.tool_choice is not None:
        kind = req.tool_choice.type
        if kind == "tool":
            if not req.tool_choice.name:
                raise BadRequest("'tool_choice.name' is required when tool_choice.type is 'tool'", param="tool_choice")
            choice = {"type": "function", "function": {"name": req.tool_choice.name}}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    chat_body = {
        "messages": messages, "model": req.model, "tools": tools or None, "tool_choice": choice,
        "temperature": req.temperature, "top_p": req.top_p, "max_tokens": req.max_tokens,
        "stop": list(req.stop_sequences or ()), "script": req.script,
        "chat_template_kwargs": req.chat_template_kwargs,
    }
    chat = parse_chat_request(chat_body, default_max_tokens=default_max_tokens)
    return req, dataclasses.replace(chat, hosted_tools=tuple(hosted)) if hosted else chat


# -- chat.completion -> message ---------------------------------------------------------------------


def message_id(call_id: str) -> str:
    return "msg_" + call_id


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_body(chat_body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API `message` for the gateway's `chat.completion` answer."""
    choice = chat_body["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for tc in msg.get("tool_calls") or ():
        content.append({"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                        "input": _input(tc["function"]["arguments"])})
    finish = choice["finish_reason"]
    stop = "tool_use" if finish == "tool_calls" else "max_tokens" if finish == "length" else "end_turn"
    usage = chat_body["usage"]
    return {
        "id": message_id(chat_body["id"]), "type": "message", "role": "assistant", "model": chat_body["model"],
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def message_events(body: Mapping[str, Any]) -> list[bytes]:
    """The SSE events that stream a finished `message`, as Anthropic sends them: message_start
    (content empty), per block content_block_start / content_block_delta (text_delta,
    thinking_delta + signature_delta, input_json_delta) / content_block_stop, then message_delta
    (stop_reason, output usage) and message_stop."""
    usage = body["usage"]
    events = [_event("message_start", {"message": {
        **body, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0}}})]
    for i, block in enumerate(body["content"]):
        kind = block["type"]
        if kind == "text":
            events.append(_event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            events.append(_event("content_block_delta", {"index": i, "delta": {
                "type": "text_delta", "text": block["text"]}}))
        elif kind == "thinking":
            events.append(_event("content_block_start", {"index": i, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            events.append(_event("content_block_delta", {"index": i, "delta": {
                "type": "thinking_delta", "thinking": block["thinking"]}}))
            events.append(_event("content_block_delta", {"index": i, "delta": {
                "type": "signature_delta", "signature": block["signature"]}}))
        else:
            events.append(_event("content_block_start", {"index": i, "content_block": {**block, "input": {}}}))
            events.append(_event("content_block_delta", {"index": i, "delta": {
                "type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}}))
        events.append(_event("content_block_stop", {"index": i}))
    events.append(_event("message_delta", {"delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                           "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(_event("message_stop", {}))
    return events


# -- errors -----------------------------------------------------------------------------------------

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 408: "timeout_error", 409: "conflict_error", 413: "request_too_large",
          429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape for an HTTP status: `{"type": "error", "error": {"type", "message"}}`
    (types from `anthropic.types.shared`; `invalid_request_error` for any other 4xx, `api_error`
    for any other 5xx)."""
    kind = _TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
