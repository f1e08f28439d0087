"""The HTTP client the server engines generate through: keep-alive HTTP/1.1 connections of the
event loop's own, each reply parsed by httptools (the parser uvicorn serves with), chosen by
measurement.

The gateway makes one upstream request per call, so the client is on every call's path. Against
the vLLM stand-in on these 2-core machines, one request at a time with a 3,000-id prompt, the
client process's CPU per request was: aiohttp 0.30 ms, this client about 0.1 ms (a raw
asyncio-streams client 0.10); httpx's AsyncClient was slower than aiohttp again (210 against
1,470 requests/s at 64 concurrent, FACTS.md saw the same gap). What it leaves out is what an
inference server's HTTP/1.1 API does not need: redirects, cookies, proxies, compression,
`Expect: 100-continue`. httpx stays for the start-up check and weight sync, which are rare and
synchronous.

`ServerClient.stream(...)` yields a `Reply` with the few things the wire formats read:
`status_code`, `headers` (names lower-case), `aread()`, `aiter_lines()` (no line-length limit: an
SGLang cumulative chunk of a long answer is one very long line), `sse_data()`, and, once read,
`json()` and `text` for error messages. Failures surface as `ConnectFailed` (no connection could
be made), `ServerDisconnected` (the connection broke, or the reply is not HTTP) or `TimeoutError`
(connecting, or no byte for the read timeout). Leaving the `stream` block before the reply is
read to its end closes the connection: vLLM and SGLang abort a request whose connection closes.
A request on a reused connection that the server had closed while it was idle (no byte of reply
came) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson


class ConnectFailed(OSError):
    """No connection to the server could be made (refused, unreachable, a name that does not
    resolve); `os_error` is the cause."""

    def __init__(self, where: str, os_error: BaseException):
        super().__init__(f"{where}: {os_error}")
        self.os_error = os_error


class ServerDisconnected(ConnectionError):
    """The server closed or broke the connection before its reply ended, or sent no HTTP."""


class Headers(dict):
    """Response headers by lower-case name (the last value of a repeated name)."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)


class _Conn(asyncio.Protocol):
    """One keep-alive connection and the reply being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._waiter: asyncio.Future | None = None
        self._begin()

    def _begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers = Headers()
        self.chunks: deque[bytes] = deque()
        self.started = False  # a byte of the reply came
        self.head_done = False
        self.complete = False
        self.error: BaseException | None = None
        self._framed = False  # the reply says where its body ends (a length, or chunks)
        self._keep = False  # the server lets the connection carry another request
        self._name = b""

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - never asked for
            self._fail(ServerDisconnected("the server switched protocols"))
        except httptools.HttpParserError as e:
            self._fail(ServerDisconnected(f"the server's reply is not HTTP/1.1: {e}"))
        self._wake()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            if self.head_done and not self._framed:
                self.complete = True  # a body that ends with the connection
            else:
                self.error = ServerDisconnected(f"the server closed the connection{f' ({exc})' if exc else ''}"
                                                " before its reply ended")
        self._wake()

    # -- httptools callbacks ------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        self.headers[key] = value.decode("latin-1")
        if key == "content-length" or (key == "transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        # read here: httptools answers should_keep_alive() rightly only inside its callbacks
        self._keep = self.parser.should_keep_alive()
        self.complete = True

    # -- reading ------------------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until more of the reply came, it ended, or it failed (raised)."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self._waiter = w = loop.create_future()
        timer = loop.call_later(timeout, _time_out, w) if timeout is not None else None
        try:
            await w
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self.error is not None:
            raise self.error

    @property
    def reusable(self) -> bool:
        return self.complete and self._keep and not self.lost and self.error is None


def _time_out(w: asyncio.Future) -> None:
    if not w.done():
        w.set_exception(TimeoutError("no reply from the server within the read timeout"))


class Reply:
    """One server answer as it streams in."""

    def __init__(self, conn: _Conn, read_timeout: float | None):
        self._conn = conn
        self._timeout = read_timeout
        self.status_code = conn.parser.get_status_code()
        self.headers = conn.headers
        self.reason_phrase = ""
        self._body: bytes | None = None
        self.done = False

    async def _pieces(self) -> AsyncIterator[bytes]:
        c = self._conn
        while True:
            while c.chunks:
                yield c.chunks.popleft()
            if c.complete:
                return
            await c.wait(self._timeout)

    async def _drain(self, within: float = 0.05) -> None:
        """Read what is left of the body if it ends within `within` seconds (a stream's last
        chunk follows its `[DONE]` at once), so that the connection is kept; else leave it to be
        closed. Never raises: the reply is already whole."""
        c = self._conn
        try:
            while True:
                c.chunks.clear()
                if c.complete:
                    return
                await c.wait(within)
        except (TimeoutError, ServerDisconnected):
            return

    async def aread(self) -> bytes:
        if self._body is None:
            c = self._conn
            while not c.complete:  # the usual answer came whole with its head: nothing to wait for
                await c.wait(self._timeout)
            self._body = b"".join(c.chunks)
            c.chunks.clear()
        return self._body

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines without their line ends, as they arrive."""
        buf = b""
        async for chunk in self._pieces():
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode()
        if buf:
            yield buf.rstrip(b"\r").decode()

    async def sse_data(self) -> AsyncIterator[bytes]:
        """The `data:` payloads of a server-sent event stream, up to `data: [DONE]` (not
        yielded); `self.done` tells whether that terminator came."""
        self.done = False
        async for line in self.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                await self._drain()
                return
            yield data.encode()

    @property
    def text(self) -> str:
        return (self._body or b"").decode(errors="replace")

    def json(self) -> Any:
        try:
            return orjson.loads(self._body or b"")
        except orjson.JSONDecodeError as e:
            raise ValueError(str(e)) from None


class ServerClient:
    """Keep-alive connections to the servers, bound to the event loop they were made on."""

    def __init__(self, *, read_timeout: float | None, connect_timeout: float, headers: Mapping[str, str]):
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[str, tuple[tuple[str, str, int], str]] = {}
        self._closed = False
        self.loop = asyncio.get_running_loop()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _target(self, url: str) -> tuple[tuple[str, str, int], str]:
        """((scheme, host, port), the request target) of `url`, remembered per URL."""
        t = self._targets.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError(f"{url!r}: an engine URL is http://HOST[:PORT] or https://HOST[:PORT]")
            port = u.port or (443 if u.scheme == "https" else 80)
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            t = self._targets[url] = ((u.scheme, u.hostname, port), path)
            if len(self._targets) > 4096:
                self._targets.clear()
        return t

    async def _connect(self, key: tuple[str, str, int]) -> _Conn:
        scheme, host, port = key
        try:
            _, conn = await asyncio.wait_for(self.loop.create_connection(
                _Conn, host, port, ssl=ssl.create_default_context() if scheme == "https" else None),
                self.connect_timeout)
        except TimeoutError:
            raise TimeoutError(f"no connection to {host}:{port} within {self.connect_timeout:g} s") from None
        except OSError as e:
            raise ConnectFailed(f"{host}:{port}", e) from None
        return conn

    def _pooled(self, key: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost:
                return conn
        return None

    @asynccontextmanager
    async def stream(self, method: str, url: str, *, content: bytes, headers: Mapping[str, str],
                     read_timeout: float | None = -1.0) -> AsyncIterator[Reply]:
        if self._closed:
            raise ServerDisconnected("the client is closed")
        key, target = self._target(url)
        name = f"[{key[1]}]" if ":" in key[1] else key[1]  # an IPv6 address is bracketed in Host
        host = name if key[2] == (443 if key[0] == "https" else 80) else f"{name}:{key[2]}"
        head = (f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{self._extra}"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                + f"Content-Length: {len(content)}\r\n\r\n").encode("latin-1")
        timeout = self.read_timeout if read_timeout == -1.0 else read_timeout
        conn = self._pooled(key)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(key)
            conn._begin()
            conn.transport.writelines((head, content))  # no joined copy of a long prompt's body
            try:
                while not conn.head_done:
                    await conn.wait(timeout)
                break
            except ServerDisconnected:
                conn.transport.close()
                if not reused or conn.started:
                    raise
                conn, reused = None, False  # closed while idle in the pool: the server never read it
            except BaseException:  # a timeout, or the caller cancelled: the server aborts the request
                conn.transport.close()
                raise
        try:
            yield Reply(conn, timeout)
        finally:
            if conn.reusable and not self._closed:
                self._idle.setdefault(key, []).append(conn)
            elif conn.transport is not None:
                conn.transport.close()  # mid-reply: the server aborts the request

    async def post(self, url: str, *, content: bytes, headers: Mapping[str, str], timeout: float = 5.0) -> int:
        """POST and read the answer; its status."""
        async with asyncio.timeout(timeout):
            async with self.stream("POST", url, content=content, headers=headers, read_timeout=timeout) as r:
                await r.aread()
                return r.status_code

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
