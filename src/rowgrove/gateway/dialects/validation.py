"""Request bodies checked by pydantic v2 models, as vLLM's and SGLang's `protocol.py` modules
check theirs: the models of each dialect live with the dialect (`responses_api.py`,
`anthropic_api.py`); this module holds what they share.

`Strict` is the base of every request model: types are checked without coercion (a string is not
an integer, `1` is not `true`), unknown keys are ignored (the SDKs send many that do not change
what the model is shown). `checked(model, body)` validates a decoded body and turns the first
pydantic error into the gateway's `BadRequest`, naming the field by its JSON path (`input[2].call_id`)
and, as `param`, the top-level field, so that each dialect's error shape can carry it.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from rowgrove.errors import BadRequest

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Base of the request models: strict types, unknown keys ignored, frozen once checked."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _is_branch(part: Any) -> bool:
    """A loc segment that names a branch of a union (`str`, `list[str]`, `literal['a','b']`, a model
    class), not a field: dropped from the JSON path."""
    return isinstance(part, str) and (part in _SCALARS or "[" in part or part[:1].isupper())


_SCALARS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def json_path(loc: tuple[Any, ...]) -> str:
    """`("input", 2, "function_call", "call_id")` → `input[2].function_call.call_id` (union branch
    names dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_branch(part):
            out += ("." if out else "") + str(part)
    return out or "the body"


_REPR = reprlib.Repr()  # attributes set one by one: Python 3.11's Repr takes no arguments
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 3, 3, 30, 30, 30


def _short(value: Any) -> str:
    """A bounded repr of a request value: a deep or huge value never costs (or crashes) the message."""
    text = _REPR.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_TAGS = frozenset({"type", "role"})  # the fields whose literal says which branch of a union an object means


def _branch(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The loc up to its first union-branch segment (the whole loc when it names none)."""
    for k, part in enumerate(loc):
        if _is_branch(part):
            return loc[:k + 1]
    return loc


def _depth(loc: tuple[Any, ...]) -> int:
    return sum(1 for part in loc if not _is_branch(part))


def bad_request(e: ValidationError, prefix: tuple[Any, ...] = ()) -> BadRequest:
    """The gateway's BadRequest for a pydantic error, in one sentence: the one wrong field by its
    JSON path (under `prefix`, for an element validated on its own), why, what it got, and as
    `param` the top-level field. A value that fits no branch of a union fails once per branch;
    the error said is the one of the branch the value meant (its `type` / `role` literal matched),
    else the deepest, else the first."""
    errors = e.errors(include_url=False)
    first = errors[0]
    loc = prefix + tuple(first.get("loc", ()))
    top = loc[0] if loc else None
    mine = [(prefix + tuple(err.get("loc", ())), err) for err in errors
            if (prefix + tuple(err.get("loc", ())))[:1] == loc[:1]]
    paths = [json_path(l) for l, _ in mine]
    # a branch whose container type did not fit is left out when another branch got deeper
    kept = [(l, err) for (l, err), path in zip(mine, paths)
            if not (str(err.get("type", "")).endswith("_type")
                    and any(p != path and p.startswith(path) for p in paths))] or mine
    # a branch whose tag literal did not match the value is not the one the value meant
    missed = {_branch(l) for l, err in kept
              if l and l[-1] in _TAGS and err.get("type") in ("literal_error", "missing")}
    meant = [(l, err) for l, err in kept if _branch(l) not in missed] or kept
    at, err = max(meant, key=lambda c: _depth(c[0]))  # the first of the deepest
    got = "" if err.get("type") == "missing" else f" (got {_short(err.get('input'))})"
    msg = str(err.get("msg", "invalid")).replace("; ", ", ")
    here = json_path(at)
    if str(err.get("type", "")).endswith("_type"):  # the value is of no type the field takes: say them all
        kinds = [str(o.get("msg", "")).removeprefix("Input should be ") for l, o in meant
                 if json_path(l) == here and str(o.get("type", "")).endswith("_type")]
        kinds = list(dict.fromkeys(k for k in kinds if k))
        if len(kinds) > 1:
            msg = "Input should be " + " or ".join(kinds).replace("; ", ", ")
    kind = str(err.get("type", ""))
    code = ("missing_required_parameter" if kind == "missing"
            else "invalid_type" if kind.endswith("_type") else "invalid_value")
    return BadRequest(f"'{here}': {msg}{got}", param=str(top) if top is not None else None, code=code)


def checked(model: type[M], body: Any) -> M:
    """`model` validated from the decoded JSON `body`; BadRequest (400) naming the first wrong field
    and what it got. Never raises anything else for any JSON value."""
    return _validated(model.model_validate, body)


def checked_dict(adapter: TypeAdapter[Any], body: Any) -> Any:
    """`body` validated by `adapter` (a TypedDict: pydantic-core returns a plain dict, without
    building a model object); BadRequest as `checked`."""
    return _validated(adapter.validate_python, body)


def _validated(validate: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_body")
    try:
        return validate(body)
    except ValidationError as e:
        raise bad_request(e) from None


MEMO_MAX = 50_000  # validated elements remembered per rollout; beyond, new ones are checked every time


def checked_items(adapter: TypeAdapter[Any], items: list[Any], where: str,
                  memo: dict[bytes, Any] | None = None, tag: bytes = b"", offset: int = 0) -> list[Any]:
    """Each element of `items` validated by `adapter` (TypedDicts: validated in pydantic-core,
    returned as plain dicts). With `memo` (one per rollout), an element whose JSON (prefixed by
    `tag`) this rollout already sent is not validated again: harnesses re-send the whole
    conversation each call, so a call costs one `orjson.dumps` per element it repeats and a full
    check only of what is new. The returned dicts may be shared across calls: never mutate them.
    `offset`: the index of `items[0]` in the request (for error paths)."""
    out: list[Any] = []
    for i, item in enumerate(items):
        key = tag + orjson.dumps(item) if memo is not None else b""
        hit = memo.get(key) if memo is not None else None
        if hit is None:
            try:
                hit = adapter.validate_python(item)
            except ValidationError as e:
                raise bad_request(e, (where, offset + i)) from None
            if memo is not None and len(memo) < MEMO_MAX:
                memo[key] = hit
        out.append(hit)
    return out


STRICT_DICT = ConfigDict(strict=True, extra="ignore")  # the config of every request TypedDict


@dataclass(frozen=True)
class Snapshot:
    """A rollout's last request in a dialect, translated up to a clean cut (a point after which
    translation starts afresh): the next request that repeats those items byte for byte reuses
    their translation and translates only what follows, so a call that re-sends its history pays
    one C-speed `orjson.dumps` of it rather than a Python pass over it. Kept in the rollout's memo
    under a key no item's JSON can have (`snapshot_key`)."""

    cut: int                           # items translated
    blob: bytes                        # orjson.dumps(items[:cut])
    messages: list[dict[str, Any]]     # their chat messages (shared: never mutate)
    known: frozenset[str]              # the tool-call ids among those messages


def snapshot_key(tag: bytes) -> bytes:
    return tag + b"\x00snapshot"   # item keys are tag + a JSON object, which starts with "{"


def reuse(memo: dict[bytes, Any] | None, tag: bytes, items: list[Any]) -> Snapshot | None:
    """The rollout's snapshot when `items` starts with its items exactly, else None."""
    snap = memo.get(snapshot_key(tag)) if memo is not None else None
    if snap is None or snap.cut > len(items) or orjson.dumps(items[:snap.cut]) != snap.blob:
        return None
    return snap


def extended_blob(snap: Snapshot | None, items: list[Any], upto: int) -> bytes:
    """orjson.dumps(items[:upto]) for a request that repeats `snap`'s items: only the new part is
    serialized (orjson writes a list as `[a,b]`, so two serialized lists join at the comma)."""
    if snap is None:
        return orjson.dumps(items[:upto])
    more = orjson.dumps(items[snap.cut:upto])
    if snap.blob == b"[]":
        return more
    return snap.blob if more == b"[]" else snap.blob[:-1] + b"," + more[1:]


def tool_call_ids(messages: Any) -> set[str]:
    """The ids of the assistant tool calls among chat `messages`."""
    return {tc["id"] for m in messages for tc in (m.get("tool_calls") or ())}
