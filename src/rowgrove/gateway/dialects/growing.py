"""Decoding a rollout's request bodies at a cost that follows what each adds, not the whole.

A harness re-sends the whole conversation on every call: call 200 of an agent rollout is a
~190 KB body of which all but the last two messages are, byte for byte, the body of call 199.
Decoding it whole costs more than anything else the gateway does per call on a long rollout
(`orjson.loads` 0.3 ms, the depth probe 0.1 ms, and as much again freeing the decoded copy of
history afterwards; docs/gateway.md, "Long conversations").

`GrowingBody.load(raw)` keeps, per rollout, the last large body with the byte offset where each
element of its growing array (`messages`, or the Responses API's `input`) ends, and that array's
decoded elements. A body that starts, byte for byte, with the held one up to the end of element k
decodes as the held elements 0..k and the rest:

    synthetic = raw[:start] + "<nonce>" + raw[end_k:]      (start: just after the array's `[`)

is decoded by `orjson.loads` (a few KB) and its array's first element, the nonce, is replaced by
the held elements. Why it is the same value `orjson.loads(raw)` gives:
- the bytes before `end_k` are the held body's, which decoded without error with element k
  complete at `end_k`; a JSON parser's state after them (inside the top-level object, inside the
  array, after an element) is the state after `raw[:start] + "<nonce>"`, so the rest decodes
  alike, and is valid exactly when it is in `raw`;
- the array that holds the nonce is the value the top-level key ends up with: a later duplicate
  key would replace it, and the check that the decoded array starts with the nonce fails then (a
  random string per process: a client cannot forge it); the held offsets are those of the key's
  last occurrence, the one a decoder keeps;
- the held elements sat at the same depth (two levels down) in a body whose depth was checked, so
  checking the synthetic body's depth checks the whole.
Anything else (no held body, a body that differs earlier, an error anywhere) decodes `raw` whole,
so errors read exactly as before. The held elements are shared by the requests that decode them:
nothing may mutate a decoded request (the gateway never does; the shared validation memos
already rely on it).

Offsets are found with the standard library's JSON scanner over the body read as Latin-1 (one
character per byte; every structural byte of JSON is ASCII and no byte of a multi-byte UTF-8
character is): once, when a body first becomes worth holding (large, and sharing most of its
bytes with the rollout's previous body), then only over each new body's new elements.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import orjson

from rowgrove.gateway.core.messages import Kept
from rowgrove.gateway.dialects.openai_format import load_json

MIN_BYTES = 16384  # smaller bodies decode whole: the bookkeeping would cost what it saves
_NONCE = "rowgrove-held-" + secrets.token_hex(16)
_NONCE_JSON = orjson.dumps(_NONCE)
_SPACE = " \t\r\n"
_decoder = json.JSONDecoder()


class _Held:
    __slots__ = ("ends", "items", "raw", "start")

    def __init__(self, raw: bytes, start: int, ends: list[int], items: list[Any]):
        self.raw, self.start, self.ends, self.items = raw, start, ends, items


class GrowingBody:
    """One rollout's request bodies whose array under top-level key `key` grows call by call;
    `load` returns what `openai_format.load_json` returns, always."""

    __slots__ = ("_held", "_last", "key")

    def __init__(self, key: str = "messages"):
        self.key = key
        self._held: _Held | None = None
        self._last: bytes | None = None  # the previous body, held or not

    def load(self, raw: bytes, max_depth: int) -> Any:
        """`load_json(raw, max_depth)`, reusing the held body's decoded elements for the bytes
        `raw` repeats (module docstring)."""
        last, self._last = self._last, raw
        if len(raw) < MIN_BYTES:
            self._held = None
            return load_json(raw, max_depth)
        held = self._held
        if held is not None:
            k = _kept(raw, held)
            # only when the held part is most of the body: locating a large new part's messages
            # with the standard library's scanner would cost more than decoding the whole
            if k and held.ends[k - 1] >= len(raw) // 2:
                value = self._splice(raw, held, k, max_depth)
                if value is not None:
                    return value
        value = load_json(raw, max_depth)
        self._held = None
        if last is not None and _mostly_repeats(raw, last):
            self._held = _scan(raw, value, self.key)
        return value

    def _splice(self, raw: bytes, held: _Held, k: int, max_depth: int) -> Any:
        end = held.ends[k - 1]
        synthetic = b"".join((memoryview(raw)[:held.start], _NONCE_JSON, memoryview(raw)[end:]))
        try:
            value = load_json(synthetic, max_depth)
        except Exception:
            return None  # decoded whole, for the error exactly as `raw` words it
        items = value.get(self.key) if type(value) is dict else None
        if type(items) is not list or not items or type(items[0]) is not str or items[0] != _NONCE:
            return None
        new = items[1:]
        kept = value[self.key] = Kept(held.items[:k] + new, k, held.items)
        ends = _ends_after(raw, end, len(new))
        self._held = _Held(raw, held.start, held.ends[:k] + ends, kept) if ends is not None else None
        return value


def _kept(raw: bytes, held: _Held) -> int:
    """How many of the held body's elements `raw` repeats with every byte before them."""
    ends, old = held.ends, memoryview(held.raw)
    if not ends or not raw.startswith(old[:held.start]):
        return 0
    if raw.startswith(old[:ends[-1]]):  # the usual case: the previous conversation, then more
        return len(ends)
    lo, hi = 0, len(ends) - 1  # raw repeats the first lo elements; not the first hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if raw.startswith(old[:ends[mid - 1]]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _mostly_repeats(raw: bytes, last: bytes) -> bool:
    """Whether `raw` starts with at least the first half of the previous body (a continuing
    conversation: worth finding its offsets once)."""
    return len(last) >= MIN_BYTES // 2 and raw.startswith(memoryview(last)[: len(last) // 2])


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _SPACE:
        i += 1
    return i


def _ends_after(raw: bytes, at: int, count: int) -> list[int] | None:
    """The offsets just after each of the `count` array elements that follow offset `at` (the end
    of an element), or None if the bytes there are not that."""
    s = raw[at:].decode("latin-1")
    ends: list[int] = []
    i = 0
    try:
        for _ in range(count):
            i = _skip(s, i)
            if s[i] != ",":
                return None
            _, i = _decoder.raw_decode(s, _skip(s, i + 1))
            ends.append(at + i)
        i = _skip(s, i)
        return ends if s[i] == "]" else None
    except (ValueError, IndexError):
        return None


def _scan(raw: bytes, value: Any, key: str) -> _Held | None:
    """`raw`'s array under top-level `key` located element by element (its last occurrence, as a
    decoder keeps), or None if the body is not an object with such an array."""
    items = value.get(key) if type(value) is dict else None
    if type(items) is not list or not items:
        return None
    s = raw.decode("latin-1")
    found: tuple[int, list[int]] | None = None
    try:
        i = _skip(s, 0)
        if s[i] != "{":
            return None
        i = _skip(s, i + 1)
        while s[i] != "}":
            name, i = _decoder.raw_decode(s, i)
            i = _skip(s, i)
            if s[i] != ":":
                return None
            i = _skip(s, i + 1)
            if name == key and s[i] == "[":
                start, ends = i + 1, []
                i = _skip(s, start)
                while s[i] != "]":
                    _, i = _decoder.raw_decode(s, i)
                    ends.append(i)
                    i = _skip(s, i)
                    if s[i] == ",":
                        i = _skip(s, i + 1)
                i += 1
                found = (start, ends)
            else:
                _, i = _decoder.raw_decode(s, i)
                if name == key:
                    found = None
            i = _skip(s, i)
            if s[i] == ",":
                i = _skip(s, i + 1)
    except (ValueError, IndexError):
        return None
    if found is None or len(found[1]) != len(items):
        return None
    return _Held(raw, found[0], found[1], items)


__all__ = ["MIN_BYTES", "GrowingBody"]
