"""The OpenAI Chat Completions wire format, both ways: a request body checked field by field into a
`ChatRequest` (with the engine's `SamplingParams`), and the gateway's answer built as the
`chat.completion` object or the `chat.completion.chunk` stream the official SDK parses.

Pure functions over dicts and bytes, no I/O: the HTTP app (`rowgrove.gateway.app`) calls them.
Every refusal is a `BadRequest` naming the field (`param`) and what to send instead, raised before
anything touches the ledger. The body's top-level fields are checked by a pydantic model
(`ChatCompletionRequest`, a TypedDict), as vLLM's and SGLang's protocol modules check theirs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, TypeAdapter, with_config
from typing_extensions import NotRequired, TypedDict

from rowgrove.engines.base import SamplingParams
from rowgrove.errors import BadRequest
from rowgrove.gateway.dialects.leading import merge_leading_system
from rowgrove.gateway.dialects.validation import STRICT_DICT, checked_dict

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ChatRequest:
    """A checked Chat Completions request.

    `messages`/`tools` are the JSON values as sent (validated by `decide.validate_messages` later);
    `script` and `chat_template_kwargs` are the SDK's `extra_body` keys, which arrive top-level.
    """

    messages: list[Any]
    model: str
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[Any] | None = None
    tool_choice: Any = None
    script: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # the hosted tools' types (Responses web_search, Anthropic web_search_20250305, ...) the request
    # named and the model is not shown (they run at the provider): recorded on the call, counted
    hosted_tools: tuple[str, ...] = ()


# -- the body as JSON --------------------------------------------------------------------------


@functools.cache
def _orjson_depth_limit() -> int | None:
    """How many nested arrays/objects `orjson.dumps` writes before "Recursion limit reached"
    (254 in orjson 3.x); None if it has no limit below 2048."""
    v: Any = []
    for depth in range(1, 2048):
        try:
            orjson.dumps(v)
        except orjson.JSONEncodeError:
            return depth - 1
        v = [v]
    return None


def json_depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests arrays/objects more than `limit` deep (a top-level object is depth
    1; scalars add nothing). Costs one `orjson.dumps` (C speed): `value` wrapped in
    `orjson_limit - limit` lists fails to serialize exactly when it is deeper than `limit`."""
    cap = _orjson_depth_limit()
    if cap is None or limit >= cap:
        return _walk_depth_over(value, limit)
    wrapped = value
    for _ in range(cap - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        return True
    return False


def _walk_depth_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            items: Any = v.values()
        elif isinstance(v, list | tuple):
            items = v
        else:
            continue
        if d > limit:
            return True
        stack.extend((x, d + 1) for x in items if isinstance(x, Mapping | list | tuple))
    return False


def load_json(raw: bytes, max_depth: int) -> Any:
    """The decoded request body; BadRequest (400) for malformed JSON (code `invalid_json`) and
    for JSON nested deeper than `max_depth` (code `json_too_deep`), which nothing downstream
    (error messages, templates, the ledger's JSON) is ever handed."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if "depth" in str(e).lower() or "recursion" in str(e).lower():
            raise _too_deep(max_depth) from None
        raise BadRequest(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    # a value nested d deep takes at least 2d bytes, and every array or object opens with a
    # bracket, so a short body, or a small one with at most `max_depth` brackets (strings'
    # counted too), cannot nest deeper: two C-speed counts spare the probe. A large body goes
    # straight to the probe (one `orjson.dumps`), which costs less than counting its bytes
    # (0.07 against 0.11 ms for a 180 KB request; docs/gateway.md, "Long conversations")
    if len(raw) > 2 * max_depth and (len(raw) > _COUNT_BELOW or raw.count(b"[") + raw.count(b"{") > max_depth) \
            and json_depth_over(value, max_depth):
        raise _too_deep(max_depth)
    return value


_COUNT_BELOW = 8192  # bodies up to this many bytes are ruled out by counting brackets first


def _too_deep(max_depth: int) -> BadRequest:
    return BadRequest(f"the request body nests arrays and objects more than {max_depth} levels deep: send "
                      "flatter JSON, or start the server with a larger --max-json-depth", code="json_too_deep")


@with_config(STRICT_DICT)
class ChatFunction(TypedDict):
    name: str
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]


@with_config(STRICT_DICT)
class ChatTool(TypedDict):
    type: NotRequired[Literal["function"]]
    function: ChatFunction


@with_config(STRICT_DICT)
class StreamOptions(TypedDict):
    include_usage: NotRequired[bool | None]


@with_config(STRICT_DICT)
class ChatCompletionRequest(TypedDict):
    """A Chat Completions body: the top-level fields, their types and ranges (a TypedDict, so
    pydantic-core checks it without building a Python object). `messages` are checked message by
    message by `decide.validate_messages`, once per message per rollout (so a call's cost does not
    grow with the history already checked). Other keys the SDK may send (user, metadata,
    penalties, ...) are ignored."""

    messages: Annotated[list[Any], Field(min_length=1)]
    model: NotRequired[str | None]
    n: NotRequired[Annotated[int | None, Field(ge=1)]]
    stream: NotRequired[bool | None]
    stream_options: NotRequired[StreamOptions | None]
    tools: NotRequired[list[ChatTool] | None]
    tool_choice: NotRequired[Literal["none", "auto", "required"] | dict[str, Any] | None]
    logprobs: NotRequired[bool | None]
    top_logprobs: NotRequired[Annotated[int | None, Field(ge=0, le=MAX_TOP_LOGPROBS)]]
    temperature: NotRequired[Annotated[float | None, Field(ge=0.0, le=2.0)]]
    top_p: NotRequired[Annotated[float | None, Field(gt=0.0, le=1.0)]]
    max_completion_tokens: NotRequired[Annotated[int | None, Field(ge=1)]]
    max_tokens: NotRequired[Annotated[int | None, Field(ge=1)]]
    stop: NotRequired[str | list[str] | None]
    seed: NotRequired[int | None]
    script: NotRequired[str | None]                          # extra_body: the scripted engine's reply
    chat_template_kwargs: NotRequired[dict[str, Any] | None]  # extra_body: template variables


CHAT_REQUEST = TypeAdapter(ChatCompletionRequest)


def parse_chat_request(body: Any, *, default_max_tokens: int = 256) -> ChatRequest:
    """Check a decoded request body (`ChatCompletionRequest`, pydantic) and return it as a
    `ChatRequest`; `BadRequest` names the field.

    Accepted: messages, model, stream, stream_options.include_usage, tools, tool_choice, logprobs,
    top_logprobs, temperature, top_p, max_tokens / max_completion_tokens, stop (string or list),
    seed, n (only 1), and the extra_body keys `script` and `chat_template_kwargs`.
    """
    req = checked_dict(CHAT_REQUEST, body)
    n = req.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"'n' must be 1 (got {n}): send {n} separate requests instead", param="n",
                         code="unsupported_value")
    logprobs = bool(req.get("logprobs"))
    top_logprobs = req.get("top_logprobs") or 0
    if top_logprobs and not logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                         code="invalid_value")
    max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or default_max_tokens
    stop_raw = req.get("stop")
    if isinstance(stop_raw, str):
        stop: tuple[str, ...] = (stop_raw,) if stop_raw else ()
    else:
        stop = tuple(s for s in stop_raw or () if s)
    temperature, top_p = req.get("temperature"), req.get("top_p")
    sampling = SamplingParams(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        max_tokens=int(max_tokens),
        stop=stop,
        seed=req.get("seed"),
        top_logprobs=top_logprobs if logprobs else 0,
    )
    opts = req.get("stream_options")
    # messages and tools as sent (templates render a schema in the client's key order), the leading
    # run of system / developer messages as one turn, as every dialect's edge gives it
    messages = body["messages"]
    if isinstance(messages, list):
        merged = merge_leading_system(messages)
        if merged is not messages:
            # checked as sent first, so that an error names the message by its index in the request
            # (a harness with several leading system / developer messages: rare, so the cost is too)
            from rowgrove.gateway.core.messages import validate_messages

            validate_messages(messages)
            messages = merged
    return ChatRequest(
        messages=messages, model=req.get("model") or "", sampling=sampling, stream=bool(req.get("stream")),
        include_usage=bool(opts and opts.get("include_usage")), logprobs=logprobs,
        top_logprobs=top_logprobs, tools=body.get("tools") or None, tool_choice=body.get("tool_choice"),
        script=req.get("script"), chat_template_kwargs=dict(req.get("chat_template_kwargs") or {}),
    )


def request_key(body: Any) -> str:
    """The retry key of a request (32 hex digits): the SHA-256 of its body's bytes as sent, which
    an SDK retry sends again unchanged; a decoded body (no bytes at hand) is hashed as its JSON
    with sorted keys. The HTTP routes hash the bytes per rollout with `hashing.PrefixHasher`
    (the same digest, at a cost that follows only what a request adds to the previous one)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return hashlib.sha256(body).hexdigest()[:32]
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


# -- responses ---------------------------------------------------------------------------------


def completion_body(
    *,
    call_id: str,
    created: int,
    model: str,
    message: Mapping[str, Any],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The `chat.completion` object: one choice, usage, and `logprobs.content` when asked for."""
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": dict(message),
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chunk(body: Mapping[str, Any], delta: dict[str, Any], *, finish_reason: str | None = None,
           logprobs: Any = None, usage: bool = False) -> bytes:
    chunk: dict[str, Any] = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if usage:
        chunk["usage"] = None
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def stream_events(body: Mapping[str, Any], *, include_usage: bool) -> list[bytes]:
    """The SSE events that stream a finished `chat.completion`: role delta, reasoning and content
    delta (carrying all logprobs), one delta per tool call, the finish chunk, the usage chunk when
    asked for, then `data: [DONE]`. Only a complete stream carries a finish_reason."""
    choice = body["choices"][0]
    msg = choice["message"]
    events = [_chunk(body, {"role": "assistant", "content": ""}, usage=include_usage)]
    delta: dict[str, Any] = {}
    if msg.get("reasoning_content"):
        delta["reasoning_content"] = msg["reasoning_content"]
    if msg.get("content"):
        delta["content"] = msg["content"]
    if delta or choice.get("logprobs") is not None:
        events.append(_chunk(body, delta, logprobs=choice.get("logprobs"), usage=include_usage))
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        events.append(_chunk(body, {"tool_calls": [{
            "index": i, "id": tc["id"], "type": "function",
            "function": {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]},
        }]}, usage=include_usage))
    events.append(_chunk(body, {}, finish_reason=choice["finish_reason"], usage=include_usage))
    if include_usage:
        events.append(b"data: " + orjson.dumps({
            "id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
            "model": body["model"], "choices": [], "usage": body["usage"],
        }) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def error_body(message: str, *, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# -- logprobs ----------------------------------------------------------------------------------


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE token text → raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = _byte_decoder()


class TokenText:
    """Per-token (text, bytes) for `logprobs.content`, cached by id.

    Byte-level BPE tokens are mapped back to their raw bytes (a token may hold part of a UTF-8
    character, so its text alone cannot say); special and other tokens use their decoded text.
    """

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if (
            token_id not in self._special
            and isinstance(piece, str)
            and piece
            and all(ch in _BYTE_DECODER for ch in piece)
        ):
            raw = bytes(_BYTE_DECODER[ch] for ch in piece)
            text = raw.decode("utf-8", errors="replace")
        else:
            text = self._tok.decode([int(token_id)], skip_special_tokens=False)
            raw = text.encode("utf-8")
        out = (text, list(raw))
        self._cache[token_id] = out
        return out


def logprobs_content(
    token_text: TokenText,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Any] | None,
    top_n: int,
) -> list[dict[str, Any]]:
    """`logprobs.content`: one entry per sampled token (end-of-turn included), with the engine's
    logprob and up to `top_n` alternatives. `top[i]` is the engine's per-position alternatives as
    (token_id, logprob) pairs or a {token_id: logprob} mapping."""
    out = []
    for i, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        text, raw = token_text(int(tid))
        alts: list[dict[str, Any]] = []
        if top_n and top is not None and i < len(top) and top[i] is not None:
            pairs = top[i].items() if isinstance(top[i], Mapping) else top[i]
            for alt_id, alt_lp in list(pairs)[:top_n]:
                a_text, a_raw = token_text(int(alt_id))
                alts.append({"token": a_text, "bytes": a_raw, "logprob": float(alt_lp)})
        out.append({"token": text, "bytes": raw, "logprob": float(lp), "top_logprobs": alts})
    return out
