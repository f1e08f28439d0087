"""The gateway's HTTP/1.1 connection protocol: uvicorn's httptools protocol with two changes at
the layer below the app, where a request that cannot be parsed never reaches a route.

- A request the parser refuses (bad request line, bad Content-Length, broken chunking, a bad
  header line) is answered 400 in OpenAI's error shape (`{"error": {...}}`, code
  `malformed_http`) naming what the parser found, instead of uvicorn's `text/plain` line, and
  the connection is closed, as uvicorn does.
- A connection must finish sending a request's headers within `header_timeout` seconds of
  opening (or of the previous response): one that sends nothing, or headers a byte at a time
  (slowloris), is answered 408 and closed, so idle sockets cannot pile up. Keep-alive idleness
  between requests stays uvicorn's `timeout_keep_alive`; a slow body is the app's
  `body_timeout` (408 in the same shape).
- A response's head (status line and headers) goes out in one write with the first bytes of its
  body, instead of a write of its own right when the app starts the response: one system call
  and one TCP segment per answer instead of two, the largest single cost of a call at load
  (`OneWriteCycle`). Nothing is held longer than until the app's first body message, which the
  gateway sends in the same turn as the start.
- Each request's scope carries a future under `GONE`, resolved when the connection is lost: the
  app watches for a client that leaves through it instead of a task of its own waiting on
  `receive()` for `http.disconnect` (the same moment: uvicorn sends that message from
  `connection_lost` too), one task fewer per call.
- A request's scope says under `BODY_DONE` when its whole body has arrived: then the app's
  `receive()` returns it at once, and the app reads it without arming its body timeout.
- A request body's chunks are kept as they arrive and joined only when there are several,
  instead of copied into a bytearray and out of it again (`OneWriteCycle`).
"""

from __future__ import annotations

import asyncio
import logging

import httptools
import orjson
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from rowgrove.gateway.dialects.openai_format import error_body

log = logging.getLogger("rowgrove.gateway")

GONE = "rowgrove.gone"  # the scope key of the future resolved when the request's connection is lost
BODY_DONE = "rowgrove.body_done"  # the scope key set (True) once the request's whole body is buffered


def error_response(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response (status line, headers, JSON body) that closes the connection."""
    body = orjson.dumps(error_body(message, type_="invalid_request_error", code=code))
    return b"".join([
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: ", str(len(body)).encode("ascii"), b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ])


class _Head:
    """Stands in for the transport while uvicorn writes a response's start: keeps the bytes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _WithHead:
    """The transport while uvicorn writes a response's first body message: the held head goes out
    with its first write (or before a close)."""

    __slots__ = ("transport", "head")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        self.transport, self.head = transport, head

    def write(self, data: bytes) -> None:
        if self.head:
            self.transport.write(self.head + data)
            self.head = b""
        else:
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def flush(self) -> None:
        if self.head:
            self.transport.write(self.head)
            self.head = b""


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing a response's head together with its body, and
    holding the request body's chunks as they came (`GatewayHttpProtocol.on_body`): uvicorn
    copies each into a bytearray and that into bytes again for `receive()`, two copies of a
    long rollout's 200 KB body per call; a body that came in one chunk is handed on as is."""

    _head = b""
    chunks: list[bytes]
    size = 0

    async def receive(self):  # type: ignore[no-untyped-def]
        # uvicorn's receive, the body joined from the chunks instead of copied out of a bytearray
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks, self.size = [], 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message) -> None:  # type: ignore[no-untyped-def]
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # here, so that uvicorn's send below runs without a pause
        transport = self.transport
        if not self.response_started:
            held = _Head()
            self.transport = held  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._head = held.data
            return
        head, self._head = self._head, b""
        if not head:
            await super().send(message)
            return
        with_head = _WithHead(transport, head)
        self.transport = with_head  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if not self.disconnected:
                with_head.flush()  # a HEAD request's answer has no body bytes to carry it


class GatewayHttpProtocol(HttpToolsProtocol):
    """See the module docstring; `header_timeout` is set per server by `protocol_class`."""

    header_timeout: float = 30.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        gone = cycle.scope.get(GONE) if cycle is not None else None
        if gone is not None and not gone.done():
            gone.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_header_timer()  # a new request on a kept-alive connection
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._refuse(400, f"malformed HTTP request ({_reason(e)}): send a valid HTTP/1.1 request",
                         "malformed_http")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:  # the cycle just built; its task has not run yet
            self.cycle.__class__ = OneWriteCycle
            self.cycle.chunks = []
            self.cycle.scope[GONE] = self.loop.create_future()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not OneWriteCycle:
            super().on_body(body)
            return
        # uvicorn's on_body, the chunk kept instead of copied into the cycle's bytearray
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cycle.chunks.append(body)
        cycle.size += len(body)
        if cycle.size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and not cycle.more_body:  # uvicorn took the message as complete
            cycle.scope[BODY_DONE] = True

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, f"malformed HTTP request ({msg.rstrip('.')}): send a valid HTTP/1.1 request",
                     "malformed_http")

    # -- internals -------------------------------------------------------------------------------

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._disarm_header_timer()
        log.info("%s %s from %s", status, message, self.client)
        if not self.transport.is_closing():
            self.transport.write(error_response(status, message, code))
            self.transport.close()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being served: its body has the app's own timeout
        self._refuse(408, f"no complete request headers within {self.header_timeout:g} s: send the "
                     "request in one go, or raise --body-timeout", "request_timeout")


def _reason(e: Exception) -> str:
    text = str(e).strip().rstrip(".")
    return text or type(e).__name__


def protocol_class(header_timeout: float) -> type[GatewayHttpProtocol]:
    """The protocol class for one server, its header timeout bound (uvicorn instantiates it)."""
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,), {"header_timeout": float(header_timeout)})
