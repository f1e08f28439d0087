"""The gateway's HTTP face: a Starlette ASGI app (served by uvicorn with uvloop; chosen by
measurement, see FACTS.md) speaking OpenAI Chat Completions on each rollout's base_url, plus the
control routes that create, finish and inspect rollouts.

    POST /v1/rollouts                                   create → {rollout_id, base_url, api_key}
    POST /rollouts/{rollout_id}/v1/chat/completions     OpenAI Chat Completions (stream or not)
    POST /v1/rollouts/{rollout_id}/finish               accepted conversation(s) + reward
    GET  /v1/rollouts/{rollout_id}                      lineage
    GET  /v1/rollouts/{rollout_id}/rows                 training rows (rowgrove.assemble)
    GET  /v1/weights                                    the engine's weight version
    POST /v1/weights                                    load a checkpoint folder, or announce a version
    GET  /health

Errors leave in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`; the mapping from
`rowgrove.errors` kinds to HTTP statuses lives in one place, `error_response`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rowgrove.engines.base import Engine
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
from rowgrove.gateway.openai_format import error_body, parse_chat_request, request_key, stream_events
from rowgrove.gateway.sessions import BodyTooLarge, Gateway, GatewaySettings, Unavailable
from rowgrove.ledger import Ledger

__all__ = ["GatewaySettings", "create_app", "error_response"]

JSON = "application/json"


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON, headers=headers)


def error_response(exc: BaseException) -> Response:
    """The one place where error kinds become HTTP statuses (4xx: the caller's fault, not retried;
    429 and 5xx: retry). Anything unexpected is a 500 that names the exception type."""
    headers: dict[str, str] | None = None
    param = code = None
    if isinstance(exc, BodyTooLarge):
        status, type_, code = 413, "invalid_request_error", "request_too_large"
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
        return json_response(error_body(f"internal error: {type(exc).__name__}: {exc}", type_=type_),
                             status)
    return json_response(error_body(str(exc), type_=type_, param=param, code=code), status, headers)


Endpoint = Callable[[Request], Awaitable[Response]]


def _guard(fn: Endpoint) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as e:  # every refusal leaves as an OpenAI-shaped error
            return error_response(e)

    endpoint.__name__ = fn.__name__
    return endpoint


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


async def _read_json(request: Request, limit: int) -> tuple[Any, bytes]:
    """The decoded JSON body (and its bytes), refusing more than `limit` bytes (413) before and
    while reading it, and malformed JSON (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes: "
                           "send less, or start the server with a larger --max-body-bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes: send less, or "
                               "start the server with a larger --max-body-bytes")
        parts.append(chunk)
    raw = parts[0] if len(parts) == 1 else b"".join(parts)
    try:
        return orjson.loads(raw), raw
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}", code="invalid_json") from None


async def _until_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(engine: Engine, ledger: Ledger, *, settings: GatewaySettings | None = None) -> Starlette:
    """The gateway as an ASGI app over `engine` and `ledger`. The caller owns both (closes them).

    On startup, calls a crash left pending are marked aborted; on shutdown new calls get 503.
    The Gateway object is reachable as `app.state.gateway`.
    """
    gw = Gateway(engine, ledger, settings)
    limit = gw.settings.max_body_bytes

    async def health(request: Request) -> Response:
        status = 503 if gw.closing else 200
        return json_response({"status": "closing" if gw.closing else "ok", "in_flight": gw.in_flight,
                              "max_queue": gw.settings.max_queue}, status)

    async def create_rollout(request: Request) -> Response:
        gw.authorize_control(_bearer(request), request.client.host if request.client else None)
        body, _ = await _read_json(request, limit)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object with group_id")
        group_id = body.get("group_id")
        if not isinstance(group_id, str) or not group_id:
            raise BadRequest("'group_id' must be a non-empty string: the id of the prompt this rollout "
                             "answers (rollouts of one prompt share it)", param="group_id")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be a JSON object", param="metadata")
        ro = gw.create_rollout(group_id, metadata)
        base = str(request.base_url).rstrip("/")
        return json_response({"rollout_id": ro.id, "group_id": ro.group_id,
                              "base_url": f"{base}/rollouts/{ro.id}/v1", "api_key": ro.api_key}, 201)

    def _control_session(request: Request):
        s = gw.session(request.path_params["rollout_id"])
        gw.authorize_control(_bearer(request), request.client.host if request.client else None, s)
        return s

    async def finish(request: Request) -> Response:
        s = _control_session(request)
        body, _ = await _read_json(request, limit)
        return json_response(gw.finish(s, body))

    async def lineage(request: Request) -> Response:
        return json_response(gw.lineage(_control_session(request)))

    async def rows(request: Request) -> Response:
        return json_response(gw.rows(_control_session(request)))

    async def chat_completions(request: Request) -> Response:
        t0 = time.perf_counter()
        s = gw.session(request.path_params["rollout_id"])
        gw.authorize_call(s, _bearer(request))
        body, _ = await _read_json(request, limit)
        req = parse_chat_request(body, default_max_tokens=gw.settings.default_max_tokens)
        retry_count = request.headers.get("x-stainless-retry-count", "0")
        retry = retry_count.isdigit() and int(retry_count) > 0
        task = asyncio.ensure_future(gw.chat(s, req, key=request_key(body), retry=retry))
        watch = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel("server cancelled the request")
            raise
        finally:
            watch.cancel()
        if not task.done():
            task.cancel("client disconnected before the response")
            try:
                await task
            except BaseException:
                pass
            return Response(status_code=499)
        result = task.result()
        timing = {"server-timing": f"gw;dur={(time.perf_counter() - t0) * 1000:.3f}"}
        if req.stream:
            events = stream_events(result, include_usage=req.include_usage)
            return StreamingResponse(_iterate(events), media_type="text/event-stream",
                                     headers={**timing, "cache-control": "no-cache"})
        return json_response(result, headers=timing)

    async def weights(request: Request) -> Response:
        gw.authorize_control(_bearer(request), request.client.host if request.client else None)
        if request.method == "POST":
            body, _ = await _read_json(request, limit)
            await update_engine_weights(gw.engine, body)
        return json_response({"weights_version": int(getattr(gw.engine, "weights_version", 0)),
                              "engine": getattr(gw.engine, "kind", type(gw.engine).__name__)})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return json_response(error_body(f"{request.method} {request.url.path}: {detail}",
                                        type_="invalid_request_error", code=str(status)), status)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        gw.start()
        try:
            yield
        finally:
            gw.closing = True

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/rollouts", _guard(create_rollout), methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/chat/completions", _guard(chat_completions), methods=["POST"]),
            Route("/v1/rollouts/{rollout_id}/finish", _guard(finish), methods=["POST"]),
            Route("/v1/rollouts/{rollout_id}", _guard(lineage), methods=["GET"]),
            Route("/v1/rollouts/{rollout_id}/rows", _guard(rows), methods=["GET"]),
            Route("/v1/weights", _guard(weights), methods=["GET", "POST"]),
        ],
        exception_handlers={HTTPException: not_found},
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app


async def update_engine_weights(engine: Engine, body: Any) -> None:
    """`POST /v1/weights`: `{"path": FOLDER}` makes the engine load the checkpoint in FOLDER
    (servers load it themselves; a local engine reads its model.safetensors), `{"version": N}`
    records that the trainer pushed version N to the servers itself (e.g. over NCCL), so later
    tokens carry it. Versions only move forward."""
    if not isinstance(body, dict) or (("path" in body) == ("version" in body)):
        raise BadRequest('send {"path": "/folder/of/a/checkpoint"} or {"version": N}')
    if "version" in body:
        v = body["version"]
        current = int(getattr(engine, "weights_version", 0))
        if isinstance(v, bool) or not isinstance(v, int) or v < current:
            raise BadRequest(f"'version' must be an integer >= the current version {current}, got {v!r}",
                             param="version")
        if not hasattr(engine, "weights_version"):
            raise BadRequest(f"engine {type(engine).__name__} keeps no weight version")
        engine.weights_version = v  # type: ignore[attr-defined]
        return
    path = body["path"]
    if not isinstance(path, str) or not path:
        raise BadRequest("'path' must be the folder of a checkpoint (model.safetensors inside)", param="path")
    update = getattr(engine, "update_weights", None)
    if update is None:
        raise BadRequest(f"engine {type(engine).__name__} cannot load weights")
    if getattr(engine, "kind", None) in ("vllm", "sglang"):
        await asyncio.to_thread(update, path)
        return
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise BadRequest(f"no *.safetensors in {path}: write the checkpoint there first", param="path")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    await asyncio.to_thread(update, state)


async def _iterate(events: list[bytes]):
    for e in events:
        yield e
