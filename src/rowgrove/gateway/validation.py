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
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

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


def checked(model: type[M], body: Any) -> M:
    """`model` validated from the decoded JSON `body`; BadRequest (400) naming the first wrong field
    and what it got. Never raises anything else for any JSON value."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_body")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        first = errors[0]
        loc = tuple(first.get("loc", ()))
        top = loc[0] if loc else None
        # a value that fits no branch of a union fails once per branch: say what each wanted
        # (a branch whose container type did not fit is left out when another branch got deeper)
        mine = [(json_path(tuple(err.get("loc", ()))), err) for err in errors
                if tuple(err.get("loc", ()))[:1] == loc[:1]]
        said: list[str] = []
        for path, err in mine:
            if str(err.get("type", "")).endswith("_type") and any(
                    p != path and p.startswith(path) for p, _ in mine):
                continue
            got = "" if err.get("type") == "missing" else f" (got {_short(err.get('input'))})"
            text = f"'{path}': {err.get('msg', 'invalid')}{got}"
            if text not in said and len(said) < 3:
                said.append(text)
        code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
        raise BadRequest("; or ".join(said), param=str(top) if top is not None else None, code=code) from None
