"""What both stand-in servers share: a real engine sampling real tokens, fault injection, a log of
what the server saw, and running an ASGI app on a free loopback port.

Faults are what a client of a real server meets: `POST /_standin/fault {"mode": M, "count": N}`
(or `StandinHandle.fault(M, N)`, rowgrove.standins.launch) makes the next N generate requests (N = -1: all) suffer M:

    "500" | "502" | "429" | "503" | "400"   that status with the server's error body (429/503 with Retry-After)
    "hang"          never answer (until the client gives up or disconnects)
    "slow"          answer after `delay` seconds (default 2), watching for a disconnect meanwhile
    "bad_id"        one sampled id replaced by an id outside the vocabulary
    "short_logprobs" one logprob fewer than ids
    "cut"           a stream (or body) cut in the middle: the connection closes without the end
    "abort"         the request ends with finish reason abort (as after a server-side abort)

`GET /_standin/log` returns `StandinState.log()`: {"requests": [...bodies as received...],
"generations": [one entry per generate request: request_id, route, prompt, fault, token_ids,
logprobs, top_logprobs, weight_versions (per token, the sampling engine's counter),
finish_reason, status ("running" | "finished" | "refused" | "disconnected" | "aborted" |
"failed")], "aborted": [rids], "disconnected": [rids], "weight_loads": [...], "events": [dev-route
calls in order: {"route", ...}], "paused": bool, "weights_version": int}. `control_routes(state,
engine)` mounts this route and the fault route; `StandinState.segment_delay` (also settable by the
fault route) sleeps between sampled pieces, so a test can act in the middle of a request.

`WatchedResponse` runs a response's producer next to a listener for the client's disconnect and
cancels the producer when the client leaves (as vLLM's `with_cancellation` and SGLang's
disconnect checks do), for streamed and whole-body answers alike. `StandinCut` raised after the
first bytes drops the connection (the "cut" fault); its traceback is kept out of the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rowgrove.errors import RowgroveError

FAULTS = ("500", "502", "429", "503", "400", "hang", "slow", "bad_id", "short_logprobs", "cut", "abort")


@dataclass
class StandinState:
    """The stand-in's memory: pending faults, the log, and the tasks of running requests by id."""

    fault_mode: str | None = None
    fault_count: int = 0
    delay: float = 2.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    disconnected: list[str] = field(default_factory=list)
    weight_loads: list[dict[str, Any]] = field(default_factory=list)
    running: dict[str, asyncio.Task] = field(default_factory=dict)
    generations: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    paused: bool = False
    pause_mode: str | None = None
    abort_requested: set[str] = field(default_factory=set)
    segment_delay: float = 0.0
    weight_version: str = "default"    # the server's weight-version label (vLLM /weight_info)

    def take_fault(self) -> str | None:
        """The fault the next request suffers (consuming one of its count)."""
        if self.fault_mode is None or self.fault_count == 0:
            return None
        mode = self.fault_mode
        if self.fault_count > 0:
            self.fault_count -= 1
            if self.fault_count == 0:
                self.fault_mode = None
        return mode

    def set_fault(self, mode: str | None, count: int = 1, delay: float | None = None) -> None:
        if mode is not None and mode not in FAULTS:
            raise ValueError(f"unknown fault {mode!r}: use one of {', '.join(FAULTS)}")
        self.fault_mode, self.fault_count = mode, (count if mode is not None else 0)
        if delay is not None:
            self.delay = float(delay)

    def begin_generation(self, request_id: str, route: str, prompt: list[int], fault: str | None) -> dict[str, Any]:
        """A new entry of `generations` (status "running"), updated in place as tokens come."""
        entry: dict[str, Any] = {
            "request_id": request_id, "route": route, "prompt": list(prompt), "fault": fault,
            "token_ids": [], "logprobs": [], "top_logprobs": [], "weight_versions": [],
            "finish_reason": None, "status": "running", "started": time.time(),
        }
        self.generations.append(entry)
        return entry

    def generation(self, request_id: str) -> dict[str, Any] | None:
        """The latest `generations` entry of `request_id`, if any."""
        for entry in reversed(self.generations):
            if entry["request_id"] == request_id:
                return entry
        return None

    def event(self, route: str, **details: Any) -> None:
        """Log a dev-route call (pause, resume, a weight load, ...) in `events`."""
        self.events.append({"route": route, "time": time.time(), **details})

    def log(self, engine: Any = None) -> dict[str, Any]:
        """What `GET /_standin/log` answers (see the module docstring)."""
        return {
            "requests": list(self.requests),
            "generations": [dict(g) for g in self.generations],
            "aborted": list(self.aborted),
            "disconnected": list(self.disconnected),
            "weight_loads": list(self.weight_loads),
            "events": list(self.events),
            "paused": self.paused,
            "weights_version": int(getattr(engine, "weights_version", 0)),
        }


def control_routes(state: StandinState, engine: Any) -> list[Route]:
    """`GET /_standin/log` and `POST /_standin/fault {"mode", "count"=1, "delay", "segment_delay"}`
    (mode null clears the fault): the test-control routes both stand-ins mount."""

    async def log(request: Request) -> Response:
        return json_response(state.log(engine))

    async def fault(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if "mode" in body:
                state.set_fault(body["mode"], int(body.get("count", 1)), body.get("delay"))
            elif body.get("delay") is not None:
                state.delay = float(body["delay"])
            if body.get("segment_delay") is not None:
                state.segment_delay = float(body["segment_delay"])
        except (ValueError, TypeError, orjson.JSONDecodeError) as e:
            return json_response({"detail": str(e)}, 400)
        return json_response({"mode": state.fault_mode, "count": state.fault_count, "delay": state.delay,
                              "segment_delay": state.segment_delay})

    return [Route("/_standin/log", log, methods=["GET"]), Route("/_standin/fault", fault, methods=["POST"])]


@dataclass
class Segment:
    """Tokens sampled in one go, all under one weight version (the engine's counter)."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str | None          # "stop" | "length" on the last segment, else None
    tops: list[list[tuple[int, float]]] | None = None


async def sample_segments(engine: Any, prompt: list[int], sampling: Any, *, segment: int = 4,
                          stop_ids: frozenset[int] = frozenset(),
                          hints: Any = None) -> AsyncIterator[Segment]:
    """Sample a turn `segment` tokens at a time, yielding each piece as it is sampled.

    Between pieces the engine may load new weights (the hf engine applies an update only when no
    row runs), so a generation can really span weight versions, as on a server that updates in
    the middle of a request. Stop ids end the turn (kept); a stop string ends it at the first
    token whose decoded tail holds it (kept); max_tokens ends it with "length". Each piece is
    seeded from the request's seed and the piece's position, so a seeded request repeats.
    `hints` reach the engine with every piece (`{"images": [...]}` for a vision request).
    """
    from rowgrove.engines.base import StopChecker

    checker = StopChecker(engine.tokenizer, sampling.stop)
    stops = frozenset(sampling.stop_token_ids) | frozenset(stop_ids) | frozenset(getattr(engine, "stop_ids", ()))
    out: list[int] = []
    k = 0
    while True:
        n = min(segment, sampling.max_tokens - len(out))
        seed = None if sampling.seed is None else (sampling.seed * 1_000_003 + k) % 2**63
        piece = dataclasses.replace(sampling, max_tokens=n, stop=(), seed=seed)
        # hints (a vision request's images) only when there are any: test engines may take none
        gen = await (engine.generate(prompt + out, piece, hints=hints) if hints else engine.generate(prompt + out, piece))
        versions = gen.weight_versions or [getattr(engine, "weights_version", 0)] * len(gen.token_ids)
        ids, lps, tops = [], [], []
        finish = None
        for j, tid in enumerate(gen.token_ids):
            out.append(tid)
            ids.append(tid)
            lps.append(gen.logprobs[j])
            if gen.top_logprobs is not None:
                tops.append(gen.top_logprobs[j])
            if tid in stops or checker.hit(out):
                finish = "stop"
                break
        if finish is None and len(out) >= sampling.max_tokens:
            finish = "length"
        if finish is None and gen.finish_reason == "stop" and len(gen.token_ids) < n:
            finish = "stop"  # the engine stopped on an id of its own
        yield Segment(ids, lps, versions[0] if versions else getattr(engine, "weights_version", 0), finish,
                      tops if gen.top_logprobs is not None else None)
        if finish is not None:
            return
        k += 1


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


class StandinCut(Exception):
    """Raised by a producer after it sent part of an answer: the server drops the connection."""


def _is_cut(exc: BaseException | None, depth: int = 0) -> bool:
    if exc is None or depth > 8:
        return False
    if isinstance(exc, StandinCut):
        return True
    if isinstance(exc, BaseExceptionGroup) and any(_is_cut(e, depth + 1) for e in exc.exceptions):
        return True
    return _is_cut(exc.__cause__ or exc.__context__, depth + 1)


class _QuietCut(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" record for an intended cut."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_cut(record.exc_info[1] if record.exc_info else None)


logging.getLogger("uvicorn.error").addFilter(_QuietCut())

Send = Callable[[dict[str, Any]], Awaitable[None]]


class WatchedResponse:
    """An ASGI response whose `produce(send)` runs next to a listener for the client's
    disconnect: when the client leaves first, the producer is cancelled and `on_disconnect()`
    called. `produce` sends the whole answer itself (http.response.start, then the body); it may
    call `mark_done()` just before its last send so that the server closing the finished
    exchange is not taken for a disconnect."""

    def __init__(self, produce: Callable[[Send, WatchedResponse], Awaitable[None]],
                 on_disconnect: Callable[[], None], on_end: Callable[[], None] | None = None):
        self.produce = produce
        self.on_disconnect = on_disconnect
        self.on_end = on_end
        self.done = False
        self.task: asyncio.Task | None = None

    def mark_done(self) -> None:
        self.done = True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        producer = asyncio.ensure_future(self.produce(send, self))
        self.task = producer
        listener = asyncio.ensure_future(listen())
        try:
            await asyncio.wait({producer, listener}, return_when=asyncio.FIRST_COMPLETED)
            if listener.done() and not self.done:  # the client left before the answer was out
                producer.cancel()
                try:
                    await producer
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the client is gone
                    pass
                self.on_disconnect()
                return
            try:
                await producer  # finished (or finishing its last send): its outcome, errors included
            except OSError:  # a send to a client that just left (uvicorn's ClientDisconnected)
                if self.done:
                    return
                self.on_disconnect()
        finally:
            listener.cancel()
            if not producer.done():
                producer.cancel()
            if self.on_end is not None:
                self.on_end()


async def wait_or_disconnect(request: Request, seconds: float | None) -> bool:
    """Sleep `seconds` (None: forever) unless the client disconnects first; True if it did."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while deadline is None or time.monotonic() < deadline:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(0.02)
    return False


def run_app(app: Any, *, host: str = "127.0.0.1", port: int = 0) -> tuple[Any, threading.Thread, str]:
    """Start `app` under uvicorn in a daemon thread; (server, thread, url) once it listens."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, loop="asyncio", lifespan="off",
                            log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as e:  # noqa: BLE001 - reported below
            failure.append(e)

    thread = threading.Thread(target=run, name="rowgrove-standin", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if failure or not thread.is_alive() or time.monotonic() > deadline:
            raise RowgroveError(f"stand-in did not start: {failure[0] if failure else 'timed out'}")
        time.sleep(0.005)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://{host}:{bound}"
