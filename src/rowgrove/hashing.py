"""Canonical message hashing: the evidence the gateway uses to decide root or continuation, and
that reassembly uses to match the harness's accepted messages back to the calls that made them.

Two messages hash the same exactly when a chat template would have to render them the same
and the model would have produced the same turn:
- role, content (text, or parts with media hashed by their bytes), tool calls as name + parsed
  arguments (argument JSON compared as data, not text; tool-call ids ignored), `tool_call_id`,
  `name`, and reasoning (`reasoning_content` or `reasoning`) are kept;
- fields the SDK adds as `null` (`refusal`, `annotations`, `audio`, `function_call`, …) are ignored;
- on an assistant message content `""`, `null` and an absent content are the same.

Requests are chain-hashed: h0 = H(render options, tools), h_i = H(h_{i-1} ‖ H(m_i)). A call's
summary is its request chain extended by its own response message, so a later request whose
prefix ends in that response carries the same h_j. Each step costs O(|m_i|), never O(history).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from rowgrove.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
DIGEST = 16  # bytes of sha256 kept: 128 bits, collision-free for any realistic ledger

_ORJSON = orjson.OPT_SORT_KEYS


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:DIGEST]


def _decode_data_url(url: str) -> bytes | None:
    """The bytes of a `data:` URL (base64 or not); None for another URL. binascii.Error for a
    base64 payload that does not decode."""
    if not (url.startswith("data:") and "," in url):
        return None
    head, payload = url.split(",", 1)
    if head.endswith(";base64"):
        return base64.b64decode(payload)  # not validate=True: line-wrapped base64 decodes, as before
    return payload.encode("utf-8", "surrogatepass")


def _media_digest(url: str) -> str:
    """An inline image (or one the ledger stores, `rowgrove-media:`) is identified by its decoded
    pixels (`rowgrove.media`), so a re-encoded image hashes the same; other inline media by its
    decoded bytes, remote media by its URL. Never raises: a payload that does not decode (refused
    at the gateway, but a record may hold one) is identified by its text. For a record's messages
    (reassembly); a gateway request's images come resolved from its edge (`pixels` below)."""
    from rowgrove.media import digest_of_url

    pixels = digest_of_url(url)
    return pixels if pixels is not None else _url_identity(url)


def _url_identity(url: str) -> str:
    """A media URL that names no pixels: its decoded bytes' digest (`data:`), else the URL."""
    try:
        raw = _decode_data_url(url)
    except (binascii.Error, ValueError):
        raw = url.encode("utf-8", "surrogatepass")
    return url if raw is None else "sha256:" + hashlib.sha256(raw).hexdigest()


class _Blind:
    """A `pixels` map that names every image part alike (the image-blind hash)."""

    def get(self, k: int, default: Any = None) -> str:
        return ""


_BLIND: Any = _Blind()


def _part_url(part: Mapping[str, Any]) -> Any:
    img = part.get("image_url") or {}
    return img.get("url", "") if isinstance(img, Mapping) else img


def media_part_problem(part: Mapping[str, Any]) -> str | None:
    """What is wrong with an image or audio content part (None: nothing, or not a media part):
    `image_url`/`input_image` need a URL string (`{"url": ...}` or the string itself) whose
    `data:...;base64,` payload, if any, decodes; `input_audio` needs `{"data": base64}`."""
    kind = part.get("type")
    if kind in ("image_url", "input_image"):
        url = _part_url(part)
        if not isinstance(url, str) or not url:
            return f'an {kind} part needs {{"image_url": {{"url": "https://... or data:image/png;base64,..."}}}}'
        try:
            _decode_data_url(url)
        except (binascii.Error, ValueError) as e:
            return f"the image's data URL is not valid base64 ({e}): send the file's bytes base64-encoded"
    elif kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else None
        if not isinstance(data, str):
            return 'an input_audio part needs {"input_audio": {"data": "<base64>", "format": "wav"}}'
        try:
            base64.b64decode(data)
        except (binascii.Error, ValueError) as e:
            return f"the audio data is not valid base64 ({e})"
    return None


def _canonical_part(part: Any, k: int, pixels: Mapping[int, str | None] | None) -> Any:
    if not isinstance(part, Mapping):
        raise BadRequest("content parts must be objects with a 'type'", param="messages")
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text", "")}
    if kind in ("image_url", "input_image"):
        url = _part_url(part)
        url = url if isinstance(url, str) else str(url)
        if pixels is None:
            return {"type": "image", "media": _media_digest(url)}
        digest = pixels.get(k)
        return {"type": "image", "media": digest if digest is not None else _url_identity(url)}
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        data = audio.get("data", "") if isinstance(audio, Mapping) else ""
        data = data if isinstance(data, str) else str(data)
        return {"type": "audio", "media": "sha256:" + hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()}
    return {k: v for k, v in part.items() if v is not None}


def _canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments compared as parsed JSON; unparseable text is kept as text."""
    if isinstance(arguments, str):
        try:
            return {"json": orjson.loads(arguments)}
        except orjson.JSONDecodeError:
            return {"text": arguments}
    return {"json": arguments}


def canonical_message(msg: Mapping[str, Any], pixels: Mapping[int, str | None] | None = None) -> dict[str, Any]:
    """The fields of a chat message that decide what a template renders, SDK noise removed.
    `pixels`: part index -> the pixel digest of that image part as the gateway's edge resolved it
    (`RequestImages.by_message`; a part it names no digest for is identified by its bytes or URL);
    None: each image URL is read for its pixels here (a record's messages)."""
    if not isinstance(msg, Mapping):
        raise BadRequest("each message must be a JSON object", param="messages")
    role = msg.get("role")
    if role not in ROLES:
        raise BadRequest(
            f"unknown message role {role!r}: use one of {', '.join(ROLES)}", param="messages"
        )
    out: dict[str, Any] = {"role": role}
    content = msg.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping) \
            and content[0].get("type") == "text" and isinstance(content[0].get("text"), str):
        content = content[0]["text"]  # one text part renders as its string for every template
    if isinstance(content, list):
        out["content"] = [_canonical_part(p, k, pixels) for k, p in enumerate(content)]
    elif content is not None and not isinstance(content, str):
        raise BadRequest(f"{role} message content must be a string or a list of parts", param="messages")
    elif role != "assistant" or content:
        out["content"] = content
    tool_calls = msg.get("tool_calls")
    if tool_calls:
        calls = []
        for tc in tool_calls:
            fn = tc.get("function") if isinstance(tc, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise BadRequest("each tool call needs function.name", param="messages")
            calls.append({"name": fn["name"], "arguments": _canonical_arguments(fn.get("arguments"))})
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if msg.get(key) is not None:
            out[key] = msg[key]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out["reasoning"] = reasoning
    return out


def message_hash(msg: Mapping[str, Any], pixels: Mapping[int, str | None] | None = None) -> bytes:
    """H(canonical(msg)): equal for messages a template must render alike (`pixels`: see
    `canonical_message`)."""
    return _h(orjson.dumps(canonical_message(msg, pixels), option=_ORJSON))


def chain_start(tools: Sequence[Any] | None = None, options: Mapping[str, Any] | None = None) -> bytes:
    """h0: what the template renders before any message. Tools keep the key order the client
    sent (templates render a schema in that order, so two orders are two different prompts);
    template kwargs are compared as a mapping."""
    tools_blob = orjson.dumps(list(tools or ()))
    return _h(tools_blob + b"\x00" + orjson.dumps(dict(options or {}), option=_ORJSON))


def chain_step(prev: bytes, msg_digest: bytes) -> bytes:
    """h_i = H(h_{i-1} ‖ H(m_i))."""
    return _h(prev + msg_digest)


def blind_message_hash(msg: Mapping[str, Any]) -> bytes:
    """The message's hash with each image part counted without its pixels (the kept-image check's
    evidence, docs/images.md); no image is read."""
    c = canonical_message(msg, _BLIND)
    content = c.get("content")
    if isinstance(content, list):
        c["content"] = [{"type": "image"} if isinstance(p, dict) and p.get("type") == "image" else p for p in content]
    return _h(orjson.dumps(c, option=_ORJSON))


def blind_chain(messages: Sequence[Mapping[str, Any]], h0: bytes) -> bytes:
    """The image-blind chain hash of `messages` after `h0`."""
    h = h0
    for m in messages:
        h = chain_step(h, blind_message_hash(m))
    return h


def chain_hashes(messages: Iterable[Mapping[str, Any]], h0: bytes) -> list[bytes]:
    """[h_1, …, h_n] for a request; h_i covers h0 and messages[:i]."""
    out: list[bytes] = []
    h = h0
    for m in messages:
        h = chain_step(h, message_hash(m))
        out.append(h)
    return out


class PrefixHasher:
    """SHA-256 of byte strings that mostly extend a recent one (a rollout's request bodies: each
    is the previous conversation plus a reply and new messages), at a cost that follows what is
    new, not the whole: `hexdigest(raw)` equals `hashlib.sha256(raw).hexdigest()`, always.

    The hash state is kept at every `STEP` bytes of the `KEEP` most recent strings. A new string
    that starts with one of them up to a kept point (a C-speed `startswith`, found by bisection)
    resumes from that state and hashes only the rest; any other string is hashed in full. Memory:
    the recent strings themselves and one hash state (~0.2 KB) per `STEP` bytes of each."""

    STEP = 16384
    KEEP = 2

    def __init__(self) -> None:
        self._recent: list[tuple[bytes, list[Any]]] = []  # (string, state after string[:k*STEP] for each k)

    def hexdigest(self, raw: bytes) -> str:
        """`hashlib.sha256(raw).hexdigest()`, resumed from the longest kept prefix `raw` starts with."""
        step = self.STEP
        k, states = 0, None
        for old, kept in self._recent:
            hi = min(len(kept) - 1, len(raw) // step)
            if hi <= k:
                continue
            if raw.startswith(old[:hi * step]):  # the usual case: all of the old string but its tail
                k, states = hi, kept
                continue
            lo = k  # raw[:lo*step] == old[:lo*step] is known (lo = 0: trivially)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if raw.startswith(old[:mid * step]):
                    lo = mid
                else:
                    hi = mid
            if lo > k:
                k, states = lo, kept
        new_states = [hashlib.sha256()] if states is None else states[:k + 1]
        h = new_states[-1].copy()
        view = memoryview(raw)
        pos, end = k * step, len(raw)
        while pos + step <= end:
            h.update(view[pos:pos + step])
            pos += step
            new_states.append(h.copy())
        h.update(view[pos:])
        self._recent.insert(0, (raw, new_states))
        del self._recent[self.KEEP:]
        return h.hexdigest()
