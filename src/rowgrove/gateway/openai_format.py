"""The OpenAI Chat Completions wire format, both ways: a request body checked field by field into a
`ChatRequest` (with the engine's `SamplingParams`), and the gateway's answer built as the
`chat.completion` object or the `chat.completion.chunk` stream the official SDK parses.

Pure functions over dicts and bytes, no I/O: the HTTP app (`rowgrove.gateway.app`) calls them.
Every refusal is a `BadRequest` naming the field (`param`) and what to send instead, raised before
anything touches the ledger.
"""

from __future__ import annotations

import functools
import hashlib
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from rowgrove.engines.base import SamplingParams
from rowgrove.errors import BadRequest

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


def _type_error(name: str, want: str, value: Any) -> BadRequest:
    return BadRequest(
        f"'{name}' must be {want}, got {type(value).__name__} {_short(value)}",
        param=name,
        code="invalid_type",
    )


_REPR = reprlib.Repr()  # attributes set one by one: Python 3.11's Repr takes no arguments
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 3, 3, 30, 30, 30


def _short(value: Any) -> str:
    """A short repr of a request value for an error message: bounded in depth and length, so a
    deeply nested or huge value never costs (or crashes) the message."""
    text = _REPR.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    if json_depth_over(value, max_depth):
        raise _too_deep(max_depth)
    return value


def _too_deep(max_depth: int) -> BadRequest:
    return BadRequest(f"the request body nests arrays and objects more than {max_depth} levels deep: send "
                      "flatter JSON, or start the server with a larger --max-json-depth", code="json_too_deep")


def _number(body: Mapping[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    if not lo <= value <= hi:
        raise BadRequest(f"'{name}' must be between {lo} and {hi}, got {value}", param=name,
                         code="invalid_value")
    return float(value)


def _int(body: Mapping[str, Any], name: str, lo: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if value < lo:
        raise BadRequest(f"'{name}' must be at least {lo}, got {value}", param=name, code="invalid_value")
    return value


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(name, "true or false", value)
    return value


def parse_chat_request(body: Any, *, default_max_tokens: int = 256) -> ChatRequest:
    """Check a decoded request body and return it as a `ChatRequest`; `BadRequest` names the field.

    Accepted: messages, model, stream, stream_options.include_usage, tools, tool_choice, logprobs,
    top_logprobs, temperature, top_p, max_tokens / max_completion_tokens, stop (string or list),
    seed, n (only 1), and the extra_body keys `script` and `chat_template_kwargs`. Other keys the
    SDK may send (user, metadata, penalties, …) are ignored.
    """
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object", code="invalid_body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of chat messages", param="messages",
                         code="invalid_type")
    model = body.get("model")
    if model is None:
        model = ""
    elif not isinstance(model, str):
        raise _type_error("model", "a string", model)
    n = _int(body, "n", 1, 1)
    if n != 1:
        raise BadRequest(f"'n' must be 1 (got {n}): send {n} separate requests instead", param="n",
                         code="unsupported_value")
    stream = _bool(body, "stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, Mapping):
            raise _type_error("stream_options", "an object", opts)
        include_usage = _bool(opts, "include_usage")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise _type_error("tools", "a list of tool objects", tools)
        for i, t in enumerate(tools):
            fn = t.get("function")
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"tools[{i}] needs function.name (a string)", param="tools",
                                 code="invalid_value")
        tools = tools or None
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and not (
        tool_choice in ("none", "auto", "required") or isinstance(tool_choice, Mapping)
    ):
        raise BadRequest(
            f"'tool_choice' must be 'none', 'auto', 'required' or a tool object, got {_short(tool_choice)}",
            param="tool_choice", code="invalid_value",
        )
    logprobs = _bool(body, "logprobs")
    top_logprobs = _int(body, "top_logprobs", 0, 0) or 0
    if top_logprobs > MAX_TOP_LOGPROBS:
        raise BadRequest(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top_logprobs}",
                         param="top_logprobs", code="invalid_value")
    if top_logprobs and not logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                         code="invalid_value")
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p == 0.0:
        raise BadRequest("'top_p' must be greater than 0", param="top_p", code="invalid_value")
    max_tokens = _int(body, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, default_max_tokens)
    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,) if stop_raw else ()
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(s for s in stop_raw if s)
    else:
        raise _type_error("stop", "a string or a list of strings", stop_raw)
    seed = _int(body, "seed", -(2**63), None)
    script = body.get("script")
    if script is not None and not isinstance(script, str):
        raise _type_error("script", "a string (the scripted engine's reply text)", script)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, Mapping):
        raise _type_error("chat_template_kwargs", "an object", kwargs)
    sampling = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_tokens=int(max_tokens or default_max_tokens),
        stop=stop,
        seed=seed,
        top_logprobs=top_logprobs if logprobs else 0,
    )
    return ChatRequest(
        messages=messages, model=model, sampling=sampling, stream=stream,
        include_usage=include_usage, logprobs=logprobs, top_logprobs=top_logprobs, tools=tools,
        tool_choice=tool_choice, script=script, chat_template_kwargs=dict(kwargs),
    )


def request_key(body: Any) -> str:
    """Hash of the canonical request body (keys sorted): equal for an SDK retry of the same request."""
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
