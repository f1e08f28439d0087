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
"""

from __future__ import annotations

import asyncio
import logging

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from rowgrove.gateway.dialects.openai_format import error_body

log = logging.getLogger("rowgrove.gateway")


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
        super().connection_lost(exc)

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
