"""The gateway's HTTP face: a Starlette ASGI app (served by uvicorn with uvloop; chosen by
measurement, see FACTS.md) speaking OpenAI Chat Completions on each rollout's base_url, plus the
control routes that create, finish and inspect rollouts.

    POST /v1/rollouts                                   create → {rollout_id, base_url, api_key}
    POST /rollouts/{rollout_id}/v1/chat/completions     OpenAI Chat Completions (stream or not)
    POST /rollouts/{rollout_id}/v1/responses            OpenAI Responses API (gateway.dialects.responses_api)
    POST /rollouts/{rollout_id}/v1/messages             Anthropic Messages API (gateway.dialects.anthropic_api)
    POST /rollouts/{rollout_id}/v1/messages/count_tokens  {"input_tokens"} of the prompt that body renders
    GET  /rollouts/{rollout_id}/v1/models               the served model (client.models.list())
    POST /v1/rollouts/{rollout_id}/finish               accepted conversation(s) + reward
    GET  /v1/rollouts/{rollout_id}                      lineage
    GET  /v1/rollouts/{rollout_id}/rows                 training rows (rowgrove.assemble)
    GET  /v1/weights                                    the engine's weight version
    POST /v1/weights                                    load a checkpoint folder, or announce a version
    GET  /v1/models                                     the served model
    POST /v1/chat/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens
                                                        the same, for the rollout whose api_key the call sends
                                                        (Bearer or x-api-key); 401 for a key no rollout has
    GET  /metrics                                       Prometheus metrics (rowgrove.gateway.metrics)
    GET  /health

Errors leave in OpenAI's shape `{"error": {"message", "type", "param", "code"}}` (Anthropic's
`{"type": "error", "error": {"type", "message"}}` on the Messages route); the mapping from
`rowgrove.errors` kinds to HTTP statuses lives in one place, `responses.error_response`. Every 5xx
is logged with its cause on the `rowgrove.gateway` logger.

A chat completion is sent by `responses.DeliveredResponse`, which watches the connection while
it sends (a call whose answer is seen undelivered is never trained; see `rowgrove.gateway.responses`).
One watch per call covers both the generation (the client gone before the answer: 499, the
engine request cancelled) and the sending.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from rowgrove.engines.base import Engine
from rowgrove.errors import BadRequest
from rowgrove.gateway import control
from rowgrove.gateway.dialects import anthropic_api, responses_api
from rowgrove.gateway.dialects.canonical import canonical_finish
from rowgrove.gateway.dialects.growing import GrowingBody
from rowgrove.gateway.dialects.openai_format import (
    ChatRequest,
    error_body,
    load_json,
    parse_chat_request,
    stream_events,
)
from rowgrove.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rowgrove.gateway.protocol import BODY_DONE, GONE
from rowgrove.gateway.responses import (
    JSON,
    DeliveredResponse,
    anthropic_shaped,
    error_response,
    json_response,
    log_failure,
    watch_disconnect,
)
from rowgrove.gateway.sessions import (
    BodyTimeout,
    BodyTooLarge,
    Completion,
    Gateway,
    GatewaySettings,
    RolloutSession,
    TooManyUploads,
)
from rowgrove.ledger import Ledger

__all__ = ["DeliveredResponse", "GatewayApp", "GatewaySettings", "create_app", "error_response"]

Endpoint = Callable[[Request], Awaitable[Response]]


class ClientGone(Exception):
    """The client went away before its request was read or answered: nothing can be sent."""


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


async def _read_json(request: Request, gw: Gateway) -> Any:
    """The decoded JSON body (`_read_body`)."""
    return (await _read_body(request, gw))[1]


async def _read_body(request: Request, gw: Gateway, growing: GrowingBody | None = None) -> tuple[bytes, Any]:
    """(the body's bytes, the decoded JSON body; with `growing`, the rollout's bodies of this route,
    decoded by what each adds: `dialects.growing`). Refused: more than `max_body_bytes` (413, before and while reading),
    a body still arriving after `body_timeout` seconds (408), a read begun while
    `max_open_uploads` other bodies are still arriving (503), malformed JSON and JSON nested
    deeper than `max_json_depth` (400). ClientGone when the connection breaks mid-body."""
    cfg = gw.settings
    limit = cfg.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes: "
                           "send less, or start the server with a larger --max-body-bytes")
    if gw.open_uploads >= cfg.max_open_uploads:
        raise TooManyUploads(f"{gw.open_uploads} request bodies are still arriving (--max-open-uploads "
                             f"{cfg.max_open_uploads}): retry after {cfg.retry_after:g} s", cfg.retry_after)
    parts: list[bytes] = []
    more = True
    if request.scope.get(BODY_DONE):
        # the gateway's protocol holds the whole body: receive() answers without waiting, so
        # there is nothing to time out (no timer armed) and nothing still arriving to count
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientGone("the client disconnected while sending the request body")
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)  # False: what BODY_DONE promises
    size = sum(map(len, parts))
    if size > limit:
        raise _too_large(limit)
    if more:
        gw.open_uploads += 1
        try:
            async with asyncio.timeout(cfg.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(limit)
                    parts.append(chunk)
        except TimeoutError:
            raise BodyTimeout(f"the request body did not arrive within {cfg.body_timeout:g} s ({size} bytes "
                              "read): send it at once, or start the server with a larger --body-timeout") from None
        except ClientDisconnect:
            raise ClientGone("the client disconnected while sending the request body") from None
        finally:
            gw.open_uploads -= 1
    raw = parts[0] if len(parts) == 1 else b"".join(parts)
    if growing is not None:
        return raw, growing.load(raw, cfg.max_json_depth)
    return raw, load_json(raw, cfg.max_json_depth)


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body is over the limit of {limit} bytes: send less, or start the server "
                        "with a larger --max-body-bytes")


def create_app(engine: Engine, ledger: Ledger, *, settings: GatewaySettings | None = None) -> Starlette:
    """The gateway as an ASGI app over `engine` and `ledger`. The caller owns both (closes them).

    On startup, calls a crash left pending are marked aborted; on shutdown new calls get 503.
    The Gateway object is reachable as `app.state.gateway`. base_urls are built from
    `settings.public_url`, else from the address `rowgrove.gateway.server` bound (it sets
    `gateway.public_url`), else from the local address of the connection: never from a header.
    """
    gw = Gateway(engine, ledger, settings)
    metrics = gw.metrics

    def guard(fn: Endpoint, *, anthropic: bool = False) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            metrics.requests_in_progress += 1
            try:
                return await fn(request)
            except ClientGone:
                return Response(status_code=499)  # nobody to answer: nothing is sent
            except Exception as e:  # every refusal leaves as an OpenAI-shaped error (Anthropic's on its route)
                response = error_response(e)
                if anthropic:
                    response = anthropic_shaped(response)
                metrics.rejected.labels(status=str(response.status_code)).inc()
                if response.status_code >= 500:
                    log_failure(request, response.status_code, e)
                return response
            finally:
                metrics.requests_in_progress -= 1

        endpoint.__name__ = fn.__name__
        return endpoint

    def client(request: Request) -> str | None:
        peer = request.client.host if request.client else None
        forwarded = ",".join(request.headers.getlist("x-forwarded-for")) or None
        return gw.client_host(peer, forwarded)

    def public_base(request: Request) -> str:
        if gw.public_url:
            return gw.public_url
        server = request.scope.get("server")
        if not server:
            return "http://127.0.0.1"
        host, port = server[0], server[1]
        host = f"[{host}]" if ":" in str(host) else host
        scheme = request.scope.get("scheme", "http")
        return f"{scheme}://{host}" + (f":{port}" if port is not None else "")

    async def base_url(request: Request) -> Response:
        """GET / HEAD on a base URL (`/v1`, `/rollouts/<id>`, `/rollouts/<id>/v1`): 200, the probe
        Claude Code sends before its first call; an unknown rollout is 404."""
        rid = request.path_params.get("rollout_id")
        if rid is not None:
            gw.session(rid)
        return json_response({"status": "ok", **({"rollout_id": rid} if rid else {})}, 200)

    async def health(request: Request) -> Response:
        status = 503 if gw.closing else 200
        return json_response({"status": "closing" if gw.closing else "ok", "in_flight": gw.in_flight,
                              "max_queue": gw.settings.max_queue}, status)

    async def create_rollout(request: Request) -> Response:
        gw.authorize_control(_bearer(request), client(request))
        body = await _read_json(request, gw)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object with group_id")
        group_id = body.get("group_id")
        if not isinstance(group_id, str) or not group_id:
            raise BadRequest("'group_id' must be a non-empty string: the id of the prompt this rollout "
                             "answers (rollouts of one prompt share it)", param="group_id")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be a JSON object", param="metadata")
        ro = await gw.acreate_rollout(group_id, metadata)
        return json_response({"rollout_id": ro.id, "group_id": ro.group_id,
                              "base_url": f"{public_base(request)}/rollouts/{ro.id}/v1", "api_key": ro.api_key}, 201)

    def _control_session(request: Request) -> RolloutSession:
        s = gw.session(request.path_params["rollout_id"])
        gw.authorize_control(_bearer(request), client(request), s)
        return s

    async def finish(request: Request) -> Response:
        s = _control_session(request)
        body = canonical_finish(await _read_json(request, gw))
        return json_response(control.finish(gw, s, body))

    async def lineage(request: Request) -> Response:
        return json_response(control.lineage(gw, _control_session(request)))

    async def rows(request: Request) -> Response:
        return json_response(control.rows(gw, _control_session(request)))

    def models_body() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": started,
                                            "owned_by": "rowgrove"}]}

    async def models(request: Request) -> Response:
        return json_response(models_body())

    async def rollout_models(request: Request) -> Response:
        s = gw.session(request.path_params["rollout_id"])
        gw.authorize_call(s, _bearer(request))
        return json_response(models_body())

    def call_session(request: Request) -> RolloutSession:
        """The rollout a call is for: the one in its path, which the key must be the key of, or
        at the plain base URL (`/v1/...`) the one whose key it sends (Bearer or x-api-key)."""
        key = request.headers.get("x-api-key") or _bearer(request)
        rid = request.path_params.get("rollout_id")
        if rid is None:
            return gw.session_by_key(key)
        s = gw.session(rid)
        gw.authorize_call(s, key)
        return s

    async def metrics_route(request: Request) -> Response:
        gw.authorize_control(_bearer(request), client(request))
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def served(request: Request, s: RolloutSession, req: ChatRequest, raw: bytes,
                     answer: Callable[[Completion], tuple[list[bytes], bool]], t0: float) -> Response:
        """Serve one call of any dialect: generate (watching for the client to leave: 499 then),
        and send `answer(done)` → (chunks, is_stream) through DeliveredResponse. `raw`: the
        request body's bytes (its retry key, `request_key`). `t0`: when the route was entered
        (the latency metric and Server-Timing count from there)."""
        retry_count = request.headers.get("x-stainless-retry-count", "0")
        retry = retry_count.isdigit() and int(retry_count) > 0
        # resolved when the client leaves; handed to the response once there is one. The
        # gateway's own protocol provides it; under another ASGI server a task watches receive()
        watch = request.scope.get(GONE)
        if watch is None:
            watch = watch_disconnect(request.receive)
        # the call runs in this task, which the watch cancels when the client leaves first (one
        # task fewer per call than running it beside the watch and waiting for either)
        me = asyncio.current_task()
        assert me is not None
        watching, gone = True, False

        def client_left(w: asyncio.Future) -> None:
            nonlocal gone
            if watching and not w.cancelled():
                gone = True
                me.cancel("client disconnected before the response")

        watch.add_done_callback(client_left)
        try:
            try:
                done = await gw.complete(s, req, key=s.request_key(raw), retry=retry)
            except asyncio.CancelledError:
                if not gone or me.cancelling() > 1:  # the server's own cancel: it goes on
                    raise
                me.uncancel()
                return Response(status_code=499)
            finally:
                watching = False
                watch.remove_done_callback(client_left)
            elapsed = time.perf_counter() - t0
            metrics.gateway_latency.observe(elapsed)
            headers = {"server-timing": f"gw;dur={elapsed * 1000:.3f}"}

            def lost(why: str) -> None:
                if done.generated:  # a replayed answer was delivered (or not) with its original request
                    gw.undelivered(s, done.call_id, why)

            chunks, stream = answer(done)
            if stream:
                headers["cache-control"] = "no-cache"
            response = DeliveredResponse(chunks, media_type="text/event-stream" if stream else JSON,
                                         headers=headers, on_lost=lost, stream=stream, watch=watch)
            watch = None  # the response cancels it once sent
            return response  # type: ignore[return-value]
        finally:
            if watch is not None:
                watch.cancel()

    async def chat_completions(request: Request) -> Response:
        t0 = time.perf_counter()
        s = call_session(request)
        raw, body = await _read_body(request, gw, s.growing_body("chat_completions", "messages"))
        req = parse_chat_request(body, default_max_tokens=gw.settings.default_max_tokens)

        def answer(done: Completion) -> tuple[list[bytes], bool]:
            if req.stream:
                return stream_events(done.body, include_usage=req.include_usage), True
            return [orjson.dumps(done.body)], False

        return await served(request, s, req, raw, answer, t0)

    async def responses(request: Request) -> Response:
        t0 = time.perf_counter()
        s = call_session(request)
        raw, body = await _read_body(request, gw, s.growing_body("responses", "input"))
        call = responses_api.parse_responses_request(
            body, default_max_tokens=gw.settings.default_max_tokens, memo=s.checked,
            refuse_hosted=gw.settings.hosted_tools == "refuse",
            previous=lambda rid: responses_api.resolve_previous(
                s.responses, s.rollout_id, rid, lambda cid: gw.ledger.get_call(cid).rollout_id))

        def answer(done: Completion) -> tuple[list[bytes], bool]:
            out = responses_api.response_body(done.body, call)
            if call.request.store is not False:
                s.responses[out["id"]] = responses_api.stored_conversation(call, done.body)
            if call.request.stream:
                return responses_api.response_events(out), True
            return [orjson.dumps(out)], False

        return await served(request, s, call.chat, raw, answer, t0)

    async def messages(request: Request) -> Response:
        t0 = time.perf_counter()
        s = call_session(request)
        raw, body = await _read_body(request, gw, s.growing_body("messages", "messages"))
        req, chat = anthropic_api.parse_messages_request(body, default_max_tokens=gw.settings.default_max_tokens,
                                                         refuse_hosted=gw.settings.hosted_tools == "refuse",
                                                         memo=s.checked)

        def answer(done: Completion) -> tuple[list[bytes], bool]:
            out = anthropic_api.message_body(done.body)
            if req.stream:
                return anthropic_api.message_events(out), True
            return [orjson.dumps(out)], False

        return await served(request, s, chat, raw, answer, t0)

    async def count_tokens(request: Request) -> Response:
        """Anthropic's `messages.count_tokens`: `{"input_tokens": N}`, N the exact length of the
        prompt a `messages.create` of this body would give the engine now (`Gateway.prompt_tokens`);
        nothing is generated or written. The body has no max_tokens: counting needs none."""
        s = call_session(request)
        body = await _read_json(request, gw)
        if isinstance(body, dict):
            body = {**body, "max_tokens": 1, "stream": False}
        _, chat = anthropic_api.parse_messages_request(body, default_max_tokens=gw.settings.default_max_tokens,
                                                       refuse_hosted=gw.settings.hosted_tools == "refuse")
        return json_response({"input_tokens": gw.prompt_tokens(s, chat)})

    async def weights(request: Request) -> Response:
        gw.authorize_control(_bearer(request), client(request))
        if request.method == "POST":
            body = await _read_json(request, gw)
            await update_engine_weights(gw.engine, body)
        return json_response({"weights_version": int(getattr(gw.engine, "weights_version", 0)),
                              "engine": getattr(gw.engine, "kind", type(gw.engine).__name__)})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        metrics.rejected.labels(status=str(status)).inc()
        type_ = "not_found_error" if status == 404 else "invalid_request_error"
        if request.url.path.endswith(("/v1/messages", "/v1/messages/count_tokens")):  # Anthropic's routes: its shape
            return json_response(anthropic_api.error_body(status, f"{request.method} {request.url.path}: {detail}"),
                                 status)
        return json_response(error_body(f"{request.method} {request.url.path}: {detail}",
                                        type_=type_, code=str(status)), status)

    async def server_error(request: Request, exc: Exception) -> Response:
        # outside the routes' own guard (e.g. a failure while a response is built): still a JSON
        # error, and still logged; Starlette re-raises it afterwards for the server's own log
        metrics.rejected.labels(status="500").inc()
        log_failure(request, 500, exc)
        return error_response(exc)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        gw.start()
        thresholds = gc.get_threshold()
        if gw.settings.gc_freeze:
            # torch, transformers and the tokenizer leave ~340k long-lived objects behind; a full
            # collection walks them all (150-180 ms, the p99 at 64 rollouts). Frozen, it skips them.
            gc.collect()
            gc.freeze()
            # after a freeze CPython counts almost nothing as long-lived, so full collections come
            # far more often; a larger young generation keeps their number (and cost) down
            gc.set_threshold(max(gc.get_threshold()[0], 50_000), 20, 20)
        try:
            yield
        finally:
            gw.closing = True
            if gw.settings.gc_freeze:
                gc.unfreeze()
                gc.set_threshold(*thresholds)
            release = getattr(gw.engine, "release_loop", None)
            if release is not None:  # a server engine's connections belong to this loop
                await release()

    started = int(time.time())
    app = GatewayApp(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", guard(metrics_route), methods=["GET"]),
            Route("/v1/models", guard(models), methods=["GET"]),
            Route("/v1", guard(base_url), methods=["GET", "HEAD"]),
            Route("/rollouts/{rollout_id}", guard(base_url), methods=["GET", "HEAD"]),
            Route("/rollouts/{rollout_id}/v1", guard(base_url), methods=["GET", "HEAD"]),
            Route("/v1/chat/completions", guard(chat_completions), methods=["POST"]),
            Route("/v1/responses", guard(responses), methods=["POST"]),
            Route("/v1/messages", guard(messages, anthropic=True), methods=["POST"]),
            Route("/v1/messages/count_tokens", guard(count_tokens, anthropic=True), methods=["POST"]),
            Route("/v1/rollouts", guard(create_rollout), methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/chat/completions", guard(chat_completions), methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/responses", guard(responses), methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/messages", guard(messages, anthropic=True), methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/messages/count_tokens", guard(count_tokens, anthropic=True),
                  methods=["POST"]),
            Route("/rollouts/{rollout_id}/v1/models", guard(rollout_models), methods=["GET"]),
            Route("/v1/rollouts/{rollout_id}/finish", guard(finish), methods=["POST"]),
            Route("/v1/rollouts/{rollout_id}", guard(lineage), methods=["GET"]),
            Route("/v1/rollouts/{rollout_id}/rows", guard(rows), methods=["GET"]),
            Route("/v1/weights", guard(weights), methods=["GET", "POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app


class GatewayApp(Starlette):
    """Starlette, with the calls' own routes dispatched ahead of its middleware stack
    (`direct_posts`) unless middleware was added to the app: that must see every request."""

    def build_middleware_stack(self) -> ASGIApp:  # Starlette builds it on the first request
        stack = super().build_middleware_stack()
        if self.user_middleware or self.max_body_size is not None:
            return stack
        # the rollout routes that take POSTs, read from the table so the two cannot disagree
        calls = "/rollouts/{rollout_id}/"
        return direct_posts(stack, {r.path.removeprefix(calls): r.endpoint for r in self.routes
                                    if isinstance(r, Route) and r.path.startswith(calls) and "POST" in (r.methods or ())})


def direct_posts(routed: ASGIApp, endpoints: dict[str, Endpoint]) -> ASGIApp:
    """The app's middleware stack (`routed`: Starlette's error and exception middleware around the
    router), with the calls' own routes taken first: a POST to /rollouts/{rollout_id}/{route}
    with `route` in `endpoints` reaches that endpoint by one dict lookup instead of passing two
    middleware layers (each wrapping every send) and matching the route table's patterns in
    turn (together 5-9% of a call's CPU, bench/bench_gateway.py). The endpoint, its
    `rollout_id` path parameter and the Request are the ones the route table gives; the
    endpoints are `guard`ed, so every error of a request is answered as through the stack.
    Anything else goes through `routed`, as does every path under a root_path. The dispatch
    keeps `routed` as its `.routed`."""
    async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path: str = scope["path"]
            if path.startswith("/rollouts/"):
                rollout_id, sep, route = path[10:].partition("/")
                endpoint = endpoints.get(route) if sep and rollout_id else None
                if endpoint is not None:
                    scope["path_params"] = {"rollout_id": rollout_id}
                    response = await endpoint(Request(scope, receive, send))
                    await response(scope, receive, send)
                    return
        await routed(scope, receive, send)

    dispatch.routed = routed  # type: ignore[attr-defined]
    return dispatch


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
        if isinstance(v, bool) or not isinstance(v, int) or not current <= v < 2**31:
            raise BadRequest(f"'version' must be an integer >= the current version {current} (and below "
                             f"2**31), got {_short_repr(v)}", param="version")
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

    try:
        files = sorted(Path(path).glob("*.safetensors"))
    except (OSError, ValueError) as e:  # e.g. a NUL byte in the path
        raise BadRequest(f"cannot read the folder {path!r}: {e}", param="path") from None
    if not files:
        raise BadRequest(f"no *.safetensors in {path}: write the checkpoint there first", param="path")
    state: dict[str, Any] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # noqa: BLE001 - a file that is not a checkpoint is the caller's
            raise BadRequest(f"{f} is not a readable safetensors checkpoint: {type(e).__name__}: {e}",
                             param="path") from None
    await asyncio.to_thread(update, state)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

