"""What the gateway's HTTP app sends: JSON answers, the one mapping from error kinds to HTTP
statuses (`error_response`; Anthropic's error shape on the Messages route), and
`DeliveredResponse`, which sends a chat completion while it watches the connection.

Delivery: when the client is seen gone before the last byte of an answer was written (a stream
cut after its first bytes, a connection closed before the body was sent) or a send fails, the
call is recorded undelivered (`Gateway.undelivered`: the ledger moves it from completed to
aborted), so it is never trained. What cannot be seen from the server is not caught: bytes
written to a live connection count as delivered even if the client then closes without reading
them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rowgrove.errors import (
    AuthError,
    BadRequest,
    Conflict,
    EngineError,
    InputError,
    NotFound,
    Overloaded,
    RowgroveError,
)
from rowgrove.gateway.dialects import anthropic_api
from rowgrove.gateway.dialects.openai_format import error_body
from rowgrove.gateway.sessions import BodyTimeout, BodyTooLarge, TooManyUploads, Unavailable

__all__ = ["DeliveredResponse", "anthropic_shaped", "error_response", "json_response", "log_failure",
           "watch_disconnect"]

JSON = "application/json"
log = logging.getLogger("rowgrove.gateway")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON, headers=headers)


def error_response(exc: BaseException) -> Response:
    """The one place where error kinds become HTTP statuses (4xx: the caller's fault, not retried;
    408, 429 and 5xx: retry). Anything unexpected is a 500 that names the exception type. A
    refusal that leaves the request body unread (413, 408, 503 for too many uploads) closes the
    connection."""
    headers: dict[str, str] | None = None
    param = code = None
    if isinstance(exc, BodyTooLarge):
        status, type_, code = 413, "invalid_request_error", "request_too_large"
        headers = {"connection": "close"}
    elif isinstance(exc, BodyTimeout):
        status, type_, code = 408, "invalid_request_error", "request_timeout"
        headers = {"connection": "close"}
    elif isinstance(exc, BadRequest):
        status, type_, param, code = 400, "invalid_request_error", exc.param, exc.code
    elif isinstance(exc, InputError):
        status, type_ = 400, "invalid_request_error"
    elif isinstance(exc, AuthError):
        status, type_, code = 401, "authentication_error", "invalid_api_key"
    elif isinstance(exc, NotFound):
        status, type_, code = 404, "not_found_error", "not_found"
    elif isinstance(exc, Conflict):
        status, type_, code = 409, "conflict_error", "conflict"
    elif isinstance(exc, TooManyUploads):
        status, type_, code = 503, "service_unavailable", "too_many_uploads"
        headers = {"retry-after": f"{max(1, round(exc.retry_after))}", "connection": "close"}
    elif isinstance(exc, Unavailable):
        status, type_, code = 503, "service_unavailable", "unavailable"
        headers = {"retry-after": f"{max(1, round(exc.retry_after))}"}
    elif isinstance(exc, Overloaded):
        status, type_, code = 429, "rate_limit_error", "queue_full"
        headers = {"retry-after": f"{max(1, round(exc.retry_after))}"}
    elif isinstance(exc, EngineError):
        status = 504 if exc.timeout else 502
        type_, code = "engine_error", "engine_timeout" if exc.timeout else "engine_failed"
    elif isinstance(exc, RowgroveError):
        status, type_ = 500, "server_error"
    else:
        status, type_ = 500, "server_error"
        return json_response(error_body(f"internal error: {type(exc).__name__}: {_text(exc)}", type_=type_),
                             status)
    return json_response(error_body(_text(exc), type_=type_, param=param, code=code), status, headers)


def anthropic_shaped(response: Response) -> Response:
    """An OpenAI-shaped error response re-shaped as Anthropic's error (same status and headers)."""
    try:
        message = orjson.loads(response.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = "error"
    headers = {k: v for k, v in response.headers.items() if k in ("retry-after", "connection")}
    return json_response(anthropic_api.error_body(response.status_code, message), response.status_code, headers or None)


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a message that cannot be built must not cost the answer
        text = ""
    return text or type(exc).__name__


def log_failure(request: Request, status: int, exc: BaseException) -> None:
    """Log a 5xx with its route and cause: the traceback for a 500 (a bug or a storage failure),
    the message (and its cause) for the engine's and overload statuses."""
    cause = exc.__cause__
    where = f"{request.method} {request.url.path}"
    if status == 500:
        log.error("%s answered 500: %s: %s", where, type(exc).__name__, _text(exc), exc_info=exc)
    else:
        log.error("%s answered %d: %s: %s%s", where, status, type(exc).__name__, _text(exc),
                  f" (caused by {type(cause).__name__}: {_text(cause)})" if cause is not None else "")


async def _until_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the client goes away (the body must have been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def watch_disconnect(receive: Callable[[], Awaitable[dict]]) -> asyncio.Future:
    """A task that finishes when the client goes away (or, with uvicorn, once the response is
    complete); cancel it when done watching."""
    return asyncio.ensure_future(_until_disconnect(receive))


PIECE = 64 << 10  # the most bytes of one ASGI body message: a slow reader then makes sends wait


class DeliveredResponse:
    """An answer sent while the connection is watched: `chunks` (one JSON body, or the SSE events
    of a stream) go out as ASGI messages of at most `PIECE` bytes, and when the client is seen
    gone before the last of them was written, or a send fails, `on_lost(why)` is called once the
    sending is over.

    The watch is a future done when the client is gone (`watch`: the caller's, handed over here
    and cancelled after: the gateway protocol's own, resolved when the connection is lost, or a
    task waiting on `receive()` for `http.disconnect`; else such a task of its own). It is
    checked before each message and right after the last: neither finishes because the response
    completed until after `send` has returned, so a finished watch right after the last send
    means the connection was lost while that send waited to write. Pieces bound how much of a large answer
    can sit unsent in the server's buffer when the last piece is handed over."""

    def __init__(self, chunks: list[bytes], *, media_type: str, headers: dict[str, str],
                 on_lost: Callable[[str], None], stream: bool, status_code: int = 200,
                 watch: asyncio.Future | None = None):
        self.chunks = chunks
        self.watch = watch
        self.stream = stream
        self.status_code = status_code
        self.on_lost = on_lost
        raw = [(b"content-type", media_type.encode())]
        if not stream:
            raw.append((b"content-length", str(sum(len(c) for c in chunks)).encode()))
        raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.raw_headers = raw
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watch = self.watch if self.watch is not None else watch_disconnect(receive)
        why: str | None = None
        written = 0  # messages handed over while the connection was open
        try:
            messages: list[dict[str, Any]] = [
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}]
            pieces = [c[k:k + PIECE] for c in self.chunks for k in range(0, max(len(c), 1), PIECE)]
            messages += [{"type": "http.response.body", "body": p, "more_body": i < len(pieces) - 1}
                         for i, p in enumerate(pieces)]
            for m in messages:
                if watch.done():
                    break
                try:
                    await send(m)
                except Exception as e:  # noqa: BLE001 - e.g. OSError from an ASGI 2.4 server
                    why = f"sending the response failed: {type(e).__name__}: {e}"
                    break
                if watch.done():  # lost while this send waited to write: it was dropped
                    break
                written += 1
            if why is None and written < len(messages):
                done = sum(len(m.get("body", b"")) for m in messages[:written])
                what = "before the response started" if written == 0 else (
                    f"after {done} of {sum(len(c) for c in self.chunks)} bytes of the "
                    f"{'stream' if self.stream else 'body'} were sent")
                why = f"the client disconnected {what}"
        finally:
            watch.cancel()
        if why is not None:
            try:
                self.on_lost(why)
            except Exception:  # noqa: BLE001 - the answer is gone; a failed record must still be seen
                log.exception("could not record an undelivered response (%s)", why)
