"""The exception tree of rowgrove.

    RowgroveError                      every error rowgrove raises on purpose
    ├── InputError (ValueError)        the caller's data or request is wrong: fix the input
    │   └── BadRequest                 an HTTP request the gateway refuses (400)
    ├── AuthError                      wrong or missing key (401)
    ├── NotFound                       unknown rollout or call (404)
    ├── Conflict                       the thing is in the wrong state, e.g. a finished rollout (409)
    ├── Overloaded                     the bounded queue is full: retry later (429)
    │   └── Unavailable                shutting down, or the engine is overloaded: retry later (503)
    └── EngineError                    the inference engine failed (502) or timed out (504)

Each message names the offending thing (rollout ids, fields) and says what to do. The gateway
maps these kinds to HTTP codes in one place (`rowgrove.gateway.app`).
"""

from __future__ import annotations

from collections.abc import Sequence


class RowgroveError(Exception):
    """Root of every error rowgrove raises on purpose."""


class InputError(RowgroveError, ValueError):
    """The input is wrong; the message says which part and how to fix it."""


class BadRequest(InputError):
    """A request the gateway refuses with 400. `param` names the offending field, if any."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class AuthError(RowgroveError):
    """Missing or wrong API key."""


class NotFound(RowgroveError):
    """An unknown rollout or call."""


class Conflict(RowgroveError):
    """The target is in a state that forbids the operation (e.g. the rollout is finished)."""


class Overloaded(RowgroveError):
    """The bounded queue is full. `retry_after` is a hint in seconds."""

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(Overloaded):
    """The server is shutting down, or the engine behind it is overloaded or not ready (503 with
    Retry-After: retry later or elsewhere)."""


class EngineError(RowgroveError):
    """The engine failed (`timeout=False`, HTTP 502) or timed out (`timeout=True`, HTTP 504)."""

    def __init__(self, message: str, timeout: bool = False):
        super().__init__(message)
        self.timeout = timeout


def name_some(ids: Sequence[object], limit: int = 5) -> str:
    """`r7, r9, r12` or `r1, r2, r3, r4, r5, … (+3 more)`: ids for an error message."""
    shown = ", ".join(str(i) for i in ids[:limit])
    rest = len(ids) - limit
    return f"{shown}, … (+{rest} more)" if rest > 0 else shown
