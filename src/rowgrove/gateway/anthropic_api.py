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

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field

from rowgrove.errors import BadRequest
from rowgrove.gateway.openai_format import ChatRequest, parse_chat_request
from rowgrove.gateway.validation import Strict, checked

# -- the request, as pydantic models -------------------------------------------------------------


class TextBlock(Strict):
    type: Literal["text"]
    text: str


class Base64Source(Strict):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(Strict):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(Strict):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool | None = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class MessageParam(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


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
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    script: str | None = None                          # extra_body: the scripted engine's reply
    chat_template_kwargs: dict[str, Any] | None = None  # extra_body: template variables


# -- messages -> chat messages ----------------------------------------------------------------------


def _part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    src = block.source
    url = f"data:{src.media_type};base64,{src.data}" if isinstance(src, Base64Source) else src.url
    return {"type": "image_url", "image_url": {"url": url}}


def _content(parts: Sequence[dict[str, Any]]) -> Any:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return list(parts)


def messages_to_chat(system: str | Sequence[TextBlock] | None, messages: Sequence[MessageParam], *,
                     where: str = "messages") -> list[dict[str, Any]]:
    """Chat messages for a checked Messages API conversation (see the module docstring).
    BadRequest (param `where`) for blocks in the wrong role and for a tool_result that answers no
    earlier tool_use."""
    out: list[dict[str, Any]] = []
    if isinstance(system, str):
        if system:
            out.append({"role": "system", "content": system})
    elif system:
        out.append({"role": "system", "content": _content([_part(b) for b in system])})
    known: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            if m.role == "assistant":
                out.append({"role": "assistant", "content": m.content})
            else:
                out.append({"role": "user", "content": m.content})
            continue
        if m.role == "assistant":
            out.append(_assistant(m.content, i, where))
            known.update(tc["id"] for tc in out[-1].get("tool_calls") or ())
            continue
        run: list[dict[str, Any]] = []
        for k, b in enumerate(m.content):
            if isinstance(b, TextBlock | ImageBlock):
                run.append(_part(b))
                continue
            if not isinstance(b, ToolResultBlock):
                raise BadRequest(f"{where}[{i}].content[{k}]: a {b.type} block belongs in an assistant message",
                                 param=where)
            if b.tool_use_id not in known:
                raise BadRequest(f"{where}[{i}].content[{k}]: tool_result tool_use_id {b.tool_use_id!r} answers no "
                                 "earlier tool_use block: send the id of the tool_use it answers", param=where)
            if run:
                out.append({"role": "user", "content": _content(run)})
                run = []
            result = b.content if isinstance(b.content, str) else _content([_part(p) for p in b.content])
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
        if run:
            out.append({"role": "user", "content": _content(run)})
        elif not m.content:
            raise BadRequest(f"{where}[{i}].content: a user message needs at least one block", param=where)
    return out


def _assistant(blocks: Sequence[Any], i: int, where: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(_part(b))
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, RedactedThinkingBlock):
            continue  # encrypted elsewhere: nothing a template could render
        elif isinstance(b, ToolUseBlock):
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": orjson.dumps(b.input).decode()}})
        else:
            raise BadRequest(f"{where}[{i}].content[{k}]: a {b.type} block belongs in a user message", param=where)
    msg: dict[str, Any] = {"role": "assistant", "content": _content(texts) if texts else (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def finish_messages(value: Any, where: str = "messages") -> list[dict[str, Any]]:
    """`finish` with `"format": "anthropic"`: a Messages API conversation as chat messages. A
    leading `{"role": "system", "content": ...}` entry stands for the request's `system`."""
    if not isinstance(value, list):
        raise BadRequest(f"'{where}' must be a list of Messages API messages", param=where)
    system = None
    if value and isinstance(value[0], Mapping) and value[0].get("role") == "system":
        system, value = value[0].get("content"), value[1:]
    try:
        req = checked(_FinishConversation, {"messages": value, "system": system})
    except BadRequest as e:  # name the finish body's field
        raise BadRequest(str(e).replace("'messages", f"'{where}", 1), param=where, code=e.code) from None
    return messages_to_chat(req.system, req.messages, where=where)


class _FinishConversation(Strict):
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None


def parse_messages_request(body: Any, *, default_max_tokens: int) -> tuple[MessagesRequest, ChatRequest]:
    """Check a decoded `messages.create` body and translate it; BadRequest names the field."""
    req = checked(MessagesRequest, body)
    messages = messages_to_chat(req.system, req.messages)
    tools = []
    for t in req.tools or ():
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
    return req, parse_chat_request(chat_body, default_max_tokens=default_max_tokens)


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
            events.append(_event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}}))
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
