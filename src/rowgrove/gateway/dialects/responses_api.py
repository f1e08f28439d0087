"""The OpenAI Responses API (`POST {base_url}/responses`) translated at the edge into the one
canonical conversation the gateway knows (Chat Completions messages), and the gateway's answer
translated back into a `response` object or the typed SSE events the official SDK parses.

Wire format as the `openai` SDK defines it (`openai/types/responses/`: `response_create_params`,
`response_input_item_param`, `response.py`, `response_stream_event.py`):

    input item                                   chat message
    "text" (input as a string)                   {"role": "user", "content": "text"}
    {"role": r, "content": str | parts}          {"role": r, "content": ...}   (type "message")
    {"type": "reasoning", "content": [...]}      reasoning_content of the assistant turn
    {"type": "message", "role": "assistant"}     content of the assistant turn
    {"type": "function_call", call_id, ...}      tool_calls[k] of the assistant turn (id = call_id)
    {"type": "function_call_output", ...}        {"role": "tool", "tool_call_id": call_id, ...}
    instructions                                 a system message before everything else

One assistant turn is the run of reasoning / assistant message / function_call items that a
response's `output` is (reasoning, then text, then calls); a second reasoning item, or text after a
call, starts the next turn. `previous_response_id` prepends the stored conversation of that
response (its input items and its output, without its instructions, as OpenAI documents), which
the gateway keeps per rollout in memory (`RolloutSession.responses`) unless `store` is false.

The reply's `output` is built from the chat message the gateway returned: a `reasoning` item
(its text in `content`, `summary` empty) when the model family splits reasoning off, a `message`
with one `output_text` part when there is text, then one `function_call` per tool call with
`call_id` = the tool call's id. Nothing below this module learns that the request came in this
dialect: the same conversation over Chat Completions gives the same call and the same tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from pydantic import Discriminator, Field, Tag, TypeAdapter, with_config
from typing_extensions import NotRequired, TypedDict

from rowgrove.errors import BadRequest, RowgroveError
from rowgrove.gateway.dialects.leading import merge_leading_system
from rowgrove.gateway.dialects.openai_format import ChatRequest, parse_chat_request
from rowgrove.gateway.dialects.validation import (
    STRICT_DICT,
    Snapshot,
    Strict,
    checked,
    checked_items,
    extended_blob,
    reuse,
    snapshot_key,
    tool_call_ids,
)

# -- the request, as pydantic models -------------------------------------------------------------
# Input items are TypedDicts (validated in pydantic-core into plain dicts, once per item per
# rollout: `validation.checked_items`); the top level is a model.


@with_config(STRICT_DICT)
class TextPart(TypedDict):
    type: Literal["input_text", "output_text", "text"]
    text: str


@with_config(STRICT_DICT)
class RefusalPart(TypedDict):
    type: Literal["refusal"]
    refusal: str


@with_config(STRICT_DICT)
class ImagePart(TypedDict):
    type: Literal["input_image"]
    image_url: Annotated[str, Field(min_length=1)]   # an https:// or data: URL (file ids are not served here)


Part = Annotated[TextPart | RefusalPart | ImagePart, Field(discriminator="type")]


@with_config(STRICT_DICT)
class MessageItem(TypedDict):
    type: NotRequired[Literal["message"]]
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]


@with_config(STRICT_DICT)
class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str
    namespace: NotRequired[str]  # a call to a function of a namespace tool, as Codex sends it back


@with_config(STRICT_DICT)
class FunctionCallOutputItem(TypedDict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[Part]


@with_config(STRICT_DICT)
class ReasoningText(TypedDict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


@with_config(STRICT_DICT)
class ReasoningItem(TypedDict):
    type: Literal["reasoning"]
    summary: NotRequired[list[ReasoningText]]
    content: NotRequired[list[ReasoningText] | None]


def _item_kind(value: Any) -> str | None:
    if isinstance(value, Mapping):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else None
    return None


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind, custom_error_type="unsupported_item",
                  custom_error_message="an input item must be a message, function_call, function_call_output "
                                       "or reasoning item (other item types are not served here)"),
]
ITEM = TypeAdapter(Item)


class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(Strict):
    """`{"type": "namespace", "name": ..., "tools": [function tools]}` (Codex's multi_agent_v1):
    the model sees the functions it holds; a call to one returns with `"namespace": name`."""

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[FunctionTool]


# hosted tools: the provider runs them, an inference engine cannot (OpenAI's Responses API tools guide)
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "computer_use_preview", "computer_use", "image_generation", "mcp",
    "local_shell",
})


def _tool(model: Any, raw: Any, where: str) -> Any:
    try:
        return checked(model, raw)
    except BadRequest as e:
        raise BadRequest(f"{where}: {e}", param="tools", code=e.code) from None


def checked_tools(raw: Any) -> tuple[list[FunctionTool], dict[str, str], list[str]]:
    """(the function tools the model sees, function name -> its namespace, the hosted tools'
    types left out), from a request's `tools`. BadRequest names the one tool at fault."""
    if raw is None:
        return [], {}, []
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list of tools", param="tools")
    fns: list[FunctionTool] = []
    spaces: dict[str, str] = {}
    hosted: list[str] = []
    for i, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, Mapping) else None
        if kind in HOSTED_TOOLS:
            hosted.append(kind)
        elif kind == "namespace":
            ns = _tool(NamespaceTool, t, f"tools[{i}]")
            fns.extend(ns.tools)
            spaces.update({f.name: ns.name for f in ns.tools})
        elif kind == "custom":
            raise BadRequest(f"'tools[{i}]' is a custom (free-form) tool, which is not served here: declare it as "
                             "a function tool with a JSON-schema input", param="tools")
        elif kind == "function":
            fns.append(_tool(FunctionTool, t, f"tools[{i}]"))
        else:
            raise BadRequest(f"'tools[{i}].type' must be function or namespace (or a hosted tool, left out), "
                             f"got {kind!r}", param="tools")
    return fns, spaces, hosted


class NamedToolChoice(Strict):
    type: Literal["function"]
    name: str


class ResponsesRequest(Strict):
    """A `responses.create` body: the fields that change what the model sees or how it samples.
    Others the SDK sends (include, text, reasoning, truncation, metadata, ...) are ignored."""

    input: str | list[Any]                             # items: checked one by one against `Item`
    model: str = ""
    instructions: str | None = None
    tools: list[Any] | None = None                     # checked one by one: `checked_tools`
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    script: str | None = None                          # extra_body: the scripted engine's reply
    chat_template_kwargs: dict[str, Any] | None = None  # extra_body: template variables


# -- input items -> chat messages -----------------------------------------------------------------


def _content(parts: Any) -> Any:
    """A string stays a string; one text part becomes its string (as every template renders it);
    other lists become chat content parts."""
    if isinstance(parts, str):
        return parts
    out: list[dict[str, Any]] = []
    for p in parts:
        kind = p["type"]
        if kind == "refusal":
            out.append({"type": "text", "text": p["refusal"]})
        elif kind == "input_image":
            out.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            out.append({"type": "text", "text": p["text"]})
    if len(out) == 1 and out[0]["type"] == "text":
        return out[0]["text"]
    return out


def items_to_messages(items: Sequence[Mapping[str, Any]], *, where: str = "input",
                      prior: Sequence[Mapping[str, Any]] = (), known: Any = None, offset: int = 0,
                      cut: list[int] | None = None) -> list[dict[str, Any]]:
    """Chat messages for checked Responses input items (see the module docstring). `prior` is the
    conversation they continue (previous_response_id), consulted for the call ids that
    function_call_output items answer (`known`, when given, are those ids). BadRequest (param `where`,
    item index + `offset`) for an output that answers no earlier function_call. With `cut`, it is
    set to [items, messages] at the last clean point (after the last item outside an assistant
    turn)."""
    out: list[dict[str, Any]] = []
    known = set(known) if known is not None else tool_call_ids(prior)
    turn: dict[str, Any] | None = None   # the assistant turn being assembled
    stage = 0                            # 0 nothing yet, 1 reasoning, 2 text, 3 calls

    def assistant(at_stage: int) -> dict[str, Any]:
        nonlocal turn, stage
        if turn is None or at_stage < stage or (at_stage == stage and at_stage != 3):
            turn = {"role": "assistant", "content": None}
            out.append(turn)
        stage = at_stage
        return turn

    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            texts = [t["text"] for t in item.get("content") or ()]
            t = assistant(1)
            if texts:
                t["reasoning_content"] = "".join(texts)
        elif kind == "function_call":
            t = assistant(3)
            t.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item["arguments"]}})
            known.add(item["call_id"])
        elif kind == "message" and item["role"] == "assistant":
            t = assistant(2)
            t["content"] = _content(item["content"])
        else:
            turn, stage = None, 0
            if kind == "function_call_output":
                if item["call_id"] not in known:
                    raise BadRequest(f"{where}[{offset + i}]: function_call_output call_id {item['call_id']!r} answers no "
                                     "earlier function_call: send the call_id of the function_call item it answers",
                                     param=where)
                out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _content(item["output"])})
            else:
                out.append({"role": item["role"], "content": _content(item["content"])})
            if cut is not None:
                cut[:] = [i + 1, len(out)]
    for m in out:
        if m["role"] == "assistant" and m["content"] is None and not m.get("tool_calls"):
            m["content"] = ""
    return out


def finish_messages(value: Any, where: str = "messages") -> list[dict[str, Any]]:
    """`finish` with `"format": "responses"`: a list of Responses input items (the run's input plus
    every response's output items, in order) as chat messages."""
    if not isinstance(value, list):
        raise BadRequest(f"'{where}' must be a list of Responses input items", param=where)
    return items_to_messages(checked_items(ITEM, value, where), where=where)


def chat_tool(tool: FunctionTool) -> dict[str, Any]:
    """A Responses function tool as the Chat Completions tool the template renders (same keys, same
    order: name, description, parameters, strict, each when given)."""
    fn: dict[str, Any] = {"name": tool.name}
    for key in ("description", "parameters", "strict"):
        v = getattr(tool, key)
        if v is not None:
            fn[key] = v
    return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ResponsesCall:
    """A checked `responses.create` request: the chat request the gateway serves, the conversation
    it continues (chat messages without the instructions, kept for previous_response_id), and the
    fields the reply echoes."""

    chat: ChatRequest
    conversation: list[dict[str, Any]]
    request: ResponsesRequest
    tools: list[dict[str, Any]]
    namespaces: dict[str, str] = field(default_factory=dict)  # function name -> its namespace tool
    hosted_tools: list[str] = field(default_factory=list)      # hosted tools' types left out of the prompt


LOGPROBS = "message.output_text.logprobs"


def parse_responses_request(body: Any, *, default_max_tokens: int, previous: Any = None,
                            memo: dict[bytes, Any] | None = None, refuse_hosted: bool = False) -> ResponsesCall:
    """Check a decoded `responses.create` body and translate it; BadRequest names the field.
    `previous(response_id)` → the stored conversation of that response (BadRequest when there is
    none in this rollout); called only when the body names one. `memo`: the rollout's memo of
    checked items (`validation.checked_items`)."""
    req = checked(ResponsesRequest, body)
    if req.previous_response_id is not None:
        if previous is None:
            raise BadRequest("previous_response_id is not served here", param="previous_response_id")
        prior = list(previous(req.previous_response_id))
        items = ([{"role": "user", "content": req.input}] if isinstance(req.input, str)
                 else checked_items(ITEM, req.input, "input", memo, b"r"))
        conversation = prior + items_to_messages(items, prior=prior)
    elif isinstance(req.input, str):
        conversation = [{"role": "user", "content": req.input}]
    else:
        conversation = _translate(req.input, memo)
    messages = merge_leading_system(
        ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation)
    if not messages:
        raise BadRequest("'input' is empty and no previous_response_id gives a conversation: send at least one "
                         "input item", param="input")
    fns, spaces, hosted = checked_tools(req.tools)
    if hosted and refuse_hosted:
        raise BadRequest(f"the hosted tool {hosted[0]!r} cannot run on this gateway's engine (served with "
                         "--hosted-tools refuse): remove it from 'tools'", param="tools")
    tools = [chat_tool(t) for t in fns]
    choice: Any = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    logprobs = LOGPROBS in (req.include or ()) or bool(req.top_logprobs)
    chat_body: dict[str, Any] = {
        "messages": messages, "model": req.model, "tools": tools or None, "tool_choice": choice,
        "temperature": req.temperature, "top_p": req.top_p, "max_tokens": req.max_output_tokens,
        "logprobs": logprobs, "top_logprobs": req.top_logprobs if logprobs else None,
        "script": req.script, "chat_template_kwargs": req.chat_template_kwargs,
    }
    chat = parse_chat_request(chat_body, default_max_tokens=default_max_tokens)
    if hosted:
        chat = dataclasses.replace(chat, hosted_tools=tuple(hosted))
    return ResponsesCall(chat=chat, conversation=conversation, request=req,
                         tools=[t if isinstance(t, dict) else dict(t) for t in req.tools or ()],
                         namespaces=spaces, hosted_tools=hosted)


def _translate(raw: list[Any], memo: dict[bytes, Any] | None) -> list[dict[str, Any]]:
    """`input` items as chat messages, reusing the rollout's snapshot of its last request when
    this one repeats it (`validation.Snapshot`), and leaving a snapshot for the next."""
    snap = reuse(memo, b"r", raw)
    start, head, known = (snap.cut, snap.messages, snap.known) if snap is not None else (0, [], frozenset())
    cut = [0, 0]
    tail = items_to_messages(checked_items(ITEM, raw[start:], "input", memo, b"r", offset=start),
                             known=known, offset=start, cut=cut)
    conversation = head + tail
    if memo is not None:
        items, msgs = start + cut[0], len(head) + cut[1]
        memo[snapshot_key(b"r")] = Snapshot(items, extended_blob(snap, raw, items), conversation[:msgs],
                                            known | tool_call_ids(tail[:cut[1]]))
    return conversation


def resolve_previous(stored: Mapping[str, list[dict[str, Any]]], rollout_id: str, response_id: str,
                     owner: Any) -> list[dict[str, Any]]:
    """The conversation of response `response_id` of this rollout. `owner(call_id)` → the rollout
    id of a call in the ledger (None when there is no such call). Refused (400,
    previous_response_not_found): a response of another rollout (rollouts never link), one made
    with store=false or before the server restarted, and an unknown id."""
    conv = stored.get(response_id)
    if conv is not None:
        return conv
    call_id = response_id.removeprefix("resp_")
    try:
        other = owner(call_id) if response_id.startswith("resp_") else None
    except RowgroveError:
        other = None
    if other is not None and other != rollout_id:
        raise BadRequest(f"previous_response_id {response_id!r} is a response of another rollout: a rollout "
                         "continues only its own responses; send the conversation as input instead",
                         param="previous_response_id", code="previous_response_not_found")
    why = ("was made with store=false or before the server restarted" if other == rollout_id
           else "is not a response of this rollout")
    raise BadRequest(f"previous_response_id {response_id!r} {why}: send the conversation as input instead",
                     param="previous_response_id", code="previous_response_not_found")


# -- chat.completion -> response -----------------------------------------------------------------


def response_id(call_id: str) -> str:
    return "resp_" + call_id


def _output(call_id: str, message: Mapping[str, Any], logprobs: Any, status: str,
            namespaces: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        out.append({"id": f"rs_{call_id}", "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}], "status": status})
    if message.get("content"):
        part: dict[str, Any] = {"type": "output_text", "text": message["content"], "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        out.append({"id": f"msg_{call_id}", "type": "message", "role": "assistant", "status": status,
                    "content": [part]})
    if not out and not message.get("tool_calls"):  # an empty reply is still a turn the next request re-sends
        out.append({"id": f"msg_{call_id}", "type": "message", "role": "assistant", "status": status,
                    "content": [{"type": "output_text", "text": "", "annotations": []}]})
    for k, tc in enumerate(message.get("tool_calls") or ()):
        fn = tc["function"]
        item = {"id": f"fc_{call_id}_{k}", "type": "function_call", "call_id": tc["id"], "name": fn["name"],
                "arguments": fn["arguments"], "status": status}
        ns = (namespaces or {}).get(fn["name"])
        if ns is not None:
            item["namespace"] = ns
        out.append(item)
    return out


def response_body(chat_body: Mapping[str, Any], call: ResponsesCall, created: float | None = None) -> dict[str, Any]:
    """The `response` object for the gateway's `chat.completion` answer to `call`."""
    choice = chat_body["choices"][0]
    message = choice["message"]
    incomplete = choice["finish_reason"] == "length"
    status = "incomplete" if incomplete else "completed"
    lp = choice.get("logprobs")
    logprobs = None if lp is None else [dict(e) for e in lp.get("content") or ()]
    usage = chat_body["usage"]
    req = call.request
    return {
        "id": response_id(chat_body["id"]),
        "object": "response",
        "created_at": float(chat_body["created"] if created is None else created),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions,
        "model": chat_body["model"],
        "output": _output(chat_body["id"], message, logprobs, status, call.namespaces),
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "temperature": call.chat.sampling.temperature,
        "top_p": call.chat.sampling.top_p,
        "max_output_tokens": req.max_output_tokens,
        "tool_choice": _echo_choice(req.tool_choice),
        "tools": call.tools,
        "store": req.store is not False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def _echo_choice(choice: Any) -> Any:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _event(kind: str, seq: int, data: dict[str, Any]) -> bytes:
    payload = {"type": kind, "sequence_number": seq, **data}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def response_events(body: Mapping[str, Any]) -> list[bytes]:
    """The SSE events that stream a finished `response`, in the order OpenAI sends them:
    response.created, response.in_progress, then per output item output_item.added, its deltas
    (reasoning_text, output_text with content_part.added/done, function_call_arguments) and
    output_item.done, then response.completed (response.incomplete when max_output_tokens cut it)."""
    events: list[bytes] = []
    seq = 0

    def emit(kind: str, **data: Any) -> None:
        nonlocal seq
        events.append(_event(kind, seq, data))
        seq += 1

    start = {**body, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for i, item in enumerate(body["output"]):
        iid = item["id"]
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            emit("response.output_item.added", output_index=i, item={**item, "content": [], "status": "in_progress"})
            emit("response.reasoning_text.delta", item_id=iid, output_index=i, content_index=0, delta=text)
            emit("response.reasoning_text.done", item_id=iid, output_index=i, content_index=0, text=text)
        elif item["type"] == "message":
            part = item["content"][0]
            lps = part.get("logprobs") or []
            emit("response.output_item.added", output_index=i, item={**item, "content": [], "status": "in_progress"})
            emit("response.content_part.added", item_id=iid, output_index=i, content_index=0,
                 part={"type": "output_text", "text": "", "annotations": []})
            emit("response.output_text.delta", item_id=iid, output_index=i, content_index=0, delta=part["text"],
                 logprobs=lps)
            emit("response.output_text.done", item_id=iid, output_index=i, content_index=0, text=part["text"],
                 logprobs=lps)
            emit("response.content_part.done", item_id=iid, output_index=i, content_index=0, part=part)
        else:
            emit("response.output_item.added", output_index=i,
                 item={**item, "arguments": "", "status": "in_progress"})
            emit("response.function_call_arguments.delta", item_id=iid, output_index=i, delta=item["arguments"])
            emit("response.function_call_arguments.done", item_id=iid, output_index=i, name=item["name"],
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=i, item=item)
    emit("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=dict(body))
    return events


def stored_conversation(call: ResponsesCall, chat_body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a later previous_response_id to this response continues: the request's conversation
    (without instructions) followed by the assistant message the gateway answered."""
    return [*call.conversation, dict(chat_body["choices"][0]["message"])]
