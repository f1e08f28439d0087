"""The promises of rowgrove.engines.http's ServerClient, against real servers on loopback: raw
asyncio servers whose bytes the tests write exactly, and one uvicorn + Starlette app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Self

import pytest
from standin_fixtures import closed_port_url

from rowgrove.engines.http import ConnectFailed, ServerClient, ServerDisconnected

Handler = Callable[["Conn"], Awaitable[None]]


class Conn:
    """One accepted connection of a `RawServer`: its number, the requests read on it, and an event
    set when the client's side closed (EOF or reset)."""

    def __init__(self, server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server, self.n, self.reader, self.writer = server, n, reader, writer
        self.requests: list[tuple[bytes, bytes]] = []
        self.eof = asyncio.Event()

    async def request(self) -> tuple[bytes, bytes] | None:
        """The next request's head and body (by its Content-Length), None at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length)
        self.requests.append((head, body))
        self.server.requests.append((self.n, head, body))
        self.server.got_request.set()
        return head, body

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_eof(self) -> None:
        """Read until the client's side closes, then set `eof`."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.eof.set()

    def close(self) -> None:
        self.writer.close()


class RawServer:
    """asyncio.start_server on 127.0.0.1 that runs `handler(conn)` per connection and counts them."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.conns: list[Conn] = []
        self.requests: list[tuple[int, bytes, bytes]] = []
        self.got_request = asyncio.Event()

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self.conns:
            c.writer.close()
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(self, len(self.conns), reader, writer)
        self.conns.append(conn)
        try:
            await self.handler(conn)
        except ConnectionError:
            conn.eof.set()
        finally:
            if not writer.is_closing():
                writer.close()


def reply(status: int = 200, body: bytes = b"", *headers: str, reason: str = "OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"


def client(read_timeout: float | None = 2.0, **headers: str) -> ServerClient:
    return ServerClient(read_timeout=read_timeout, connect_timeout=2.0, headers=headers)


async def fetch(c: ServerClient, url: str, path: str = "/x", body: bytes = b"{}") -> tuple[int, dict, bytes]:
    async with c.stream("POST", url + path, content=body, headers={"Content-Type": "application/json"}) as r:
        data = await r.aread()
        return r.status_code, r.headers, data


def run(coro: Awaitable[object], limit: float = 5.0) -> object:
    """asyncio.run with a safety limit, so a hang fails the test rather than the suite."""

    async def main() -> object:
        return await asyncio.wait_for(coro, limit)

    return asyncio.run(main())


async def serve_forever(conn: Conn, replies: list[bytes]) -> None:
    """Answer each request with the next of `replies` (counted over all the server's
    connections; the last repeats)."""
    while await conn.request() is not None:
        await conn.write(replies[min(len(conn.server.requests) - 1, len(replies) - 1)])


# ---- 1. keep-alive, statuses, headers ---------------------------------------------------------------


def test_requests_reuse_one_connection_and_read_status_headers_and_bodies():
    """Sequential requests go over one kept-alive TCP connection; status, body and headers
    (case-insensitive .get) are read; the request carries Host, the client's and the call's
    headers and its Content-Length."""

    async def main():
        replies = [reply(200, b'{"a":1}', "Content-Type: application/json"),
                   reply(404, b"no such route", reason="Not Found"),
                   reply(503, b"busy", "Retry-After: 7", reason="Service Unavailable")]
        async with RawServer(lambda conn: serve_forever(conn, replies)) as srv:
            c = client(Authorization="Bearer k")
            async with c.stream("POST", srv.url + "/v1/completions?x=1", content=b'{"p":1}',
                                headers={"X-Req": "r1"}) as r:
                assert r.status_code == 200
                assert r.headers.get("content-type") == "application/json"
                assert r.headers.get("Content-Type") == "application/json"
                assert await r.aread() == b'{"a":1}'
                assert r.json() == {"a": 1} and r.text == '{"a":1}'
            status, headers, body = await fetch(c, srv.url)
            assert (status, body) == (404, b"no such route")
            status, headers, body = await fetch(c, srv.url)
            assert (status, body) == (503, b"busy")
            assert headers.get("Retry-After") == "7" and headers.get("retry-after") == "7"
            assert headers.get("X-Missing", "d") == "d"
            assert len(srv.conns) == 1 and len(srv.requests) == 3
            head, body = srv.conns[0].requests[0]
            lines = head.decode().split("\r\n")
            assert lines[0] == "POST /v1/completions?x=1 HTTP/1.1"
            port = srv.url.rsplit(":", 1)[1]
            assert f"Host: 127.0.0.1:{port}" in lines
            assert "Authorization: Bearer k" in lines and "X-Req: r1" in lines
            assert "Content-Length: 7" in lines and body == b'{"p":1}'
            await c.aclose()

    run(main())


def test_connection_close_reply_is_not_reused():
    """A reply saying `Connection: close` is not pooled: the next request opens a new connection."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(reply(200, b"one", "Connection: close"))
            await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client()
            assert (await fetch(c, srv.url))[2] == b"one"
            await asyncio.wait_for(srv.conns[0].eof.wait(), 1)  # the client closed it
            assert (await fetch(c, srv.url))[2] == b"one"
            assert len(srv.conns) == 2
            await c.aclose()

    run(main())


# ---- 2. chunked bodies, lines, SSE ------------------------------------------------------------------


def chunked_server(pieces: list[bytes], terminate: bool = True) -> Handler:
    """Answer each request with a chunked body of `pieces`, one chunk per write with a pause."""

    async def handler(conn):
        while await conn.request() is not None:
            await conn.write(CHUNKED_HEAD)
            for p in pieces:
                await asyncio.sleep(0.01)
                await conn.write(chunk(p))
            if terminate:
                await conn.write(b"0\r\n\r\n")
            else:
                conn.close()
                return

    return handler


def test_chunked_body_is_read_whole_and_keeps_the_connection():
    """aread() of a chunked reply sent over several writes equals the joined chunks, and the
    connection is reused afterwards."""
    pieces = [b"alpha ", b"", b"beta " * 1000, b"gamma"]
    pieces = [p for p in pieces if p]  # an empty chunk would end the body

    async def main():
        async with RawServer(chunked_server(pieces)) as srv:
            c = client()
            for _ in range(2):
                status, headers, body = await fetch(c, srv.url)
                assert status == 200 and body == b"".join(pieces)
                assert headers.get("Transfer-Encoding") == "chunked"
            assert len(srv.conns) == 1
            await c.aclose()

    run(main())


def test_aiter_lines_joins_lines_split_across_chunks():
    """aiter_lines() yields each line once, whole, whatever the chunk boundaries: a line split
    over chunks, a \\r\\n split between chunks, empty lines, a last line with no newline, non-ASCII."""
    pieces = [b"first li", b"ne\r", b"\nsecond\n\nthi", b"rd \xc3", b"\xa9\r\nlast without newline"]

    async def main():
        async with RawServer(chunked_server(pieces)) as srv:
            c = client()
            async with c.stream("POST", srv.url + "/generate", content=b"{}", headers={}) as r:
                lines = [line async for line in r.aiter_lines()]
            assert lines == ["first line", "second", "", "third é", "last without newline"]
            await c.aclose()

    run(main())


def test_sse_data_stops_at_done():
    """sse_data() yields the `data:` payloads (not comments or other fields), stops at
    `data: [DONE]` without yielding it, and sets done=True."""
    pieces = [b": comment\n\ndata: {\"i\":0}\n\n", b"event: x\ndata:{\"i\"", b":1}\n\ndata: [DO", b"NE]\n\n"]

    async def main():
        async with RawServer(chunked_server(pieces)) as srv:
            c = client()
            async with c.stream("POST", srv.url + "/v1/completions", content=b"{}", headers={}) as r:
                assert r.done is False
                got = [d async for d in r.sse_data()]
                assert got == [b'{"i":0}', b'{"i":1}'] and r.done is True
            await c.aclose()

    run(main())


def test_sse_data_without_done_reports_not_done():
    """A stream that ends (its last chunk) without `data: [DONE]` yields all payloads and leaves
    done=False; one the server cuts off mid-stream raises ServerDisconnected."""

    async def main():
        async with RawServer(chunked_server([b"data: a\n\n", b"data: b\n\n"])) as srv:
            c = client()
            async with c.stream("POST", srv.url, content=b"{}", headers={}) as r:
                assert [d async for d in r.sse_data()] == [b"a", b"b"]
                assert r.done is False
            await c.aclose()
        async with RawServer(chunked_server([b"data: a\n\n"], terminate=False)) as srv:
            c = client()
            got = []
            with pytest.raises(ServerDisconnected):
                async with c.stream("POST", srv.url, content=b"{}", headers={}) as r:
                    async for d in r.sse_data():
                        got.append(d)
            assert got == [b"a"] and r.done is False
            await c.aclose()

    run(main())


# ---- 3. a server closing connections ---------------------------------------------------------------


def test_idle_connection_closed_by_the_server_is_replaced():
    """After the server closes a pooled idle connection, the next request succeeds on a new one."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(reply(200, b"ok"))
            conn.close()

        async with RawServer(handler) as srv:
            c = client()
            assert (await fetch(c, srv.url))[2] == b"ok"
            await asyncio.sleep(0.05)  # the client's loop sees the FIN
            assert (await fetch(c, srv.url))[2] == b"ok"
            assert len(srv.conns) == 2 and len(srv.requests) == 2
            await c.aclose()

    run(main())


def test_reused_connection_closed_before_any_reply_byte_is_retried_once():
    """A request on a reused connection that the server closes without a byte of reply (it read the
    request, then closed: the keep-alive race) is sent once more on a new connection."""

    async def main():
        async def handler(conn):
            if conn.n == 0:
                await conn.request()
                await conn.write(reply(200, b"first"))
                await conn.request()  # the second request arrives; close without answering
                conn.close()
            else:
                await serve_forever(conn, [reply(200, b"second")])

        async with RawServer(handler) as srv:
            c = client()
            assert (await fetch(c, srv.url))[2] == b"first"
            assert (await fetch(c, srv.url, body=b'{"n":2}'))[2] == b"second"
            assert len(srv.conns) == 2
            assert [(n, body) for n, _, body in srv.requests] == [(0, b"{}"), (0, b'{"n":2}'), (1, b'{"n":2}')]
            await c.aclose()

    run(main())


def test_reused_connection_closed_after_a_reply_byte_is_not_retried():
    """Once a byte of the reply came, a close is ServerDisconnected, not a resend."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(reply(200, b"first"))
            await conn.request()
            await conn.write(b"HTTP/1.1 200")
            conn.close()

        async with RawServer(handler) as srv:
            c = client()
            assert (await fetch(c, srv.url))[2] == b"first"
            with pytest.raises(ServerDisconnected):
                await fetch(c, srv.url)
            assert len(srv.conns) == 1 and len(srv.requests) == 2
            await c.aclose()

    run(main())


def test_new_connection_closed_without_reply_is_server_disconnected_and_not_retried():
    """A server that closes a new connection without replying gives ServerDisconnected, and the
    request was received once only (a fresh connection is never resent)."""

    async def main():
        async def handler(conn):
            await conn.request()
            conn.close()

        async with RawServer(handler) as srv:
            c = client()
            with pytest.raises(ServerDisconnected):
                await fetch(c, srv.url)
            await asyncio.sleep(0.05)  # a resend, were there one, would have arrived
            assert len(srv.requests) == 1 and len(srv.conns) == 1
            await c.aclose()

    run(main())


def test_server_closing_at_accept_never_hangs():
    """A server that closes each connection at once, before reading, gives ServerDisconnected
    promptly every time, even with no read timeout (the close may land before the request is sent)."""

    async def main():
        async def handler(conn):
            conn.close()

        async with RawServer(handler) as srv:
            c = client(read_timeout=None)
            for _ in range(30):
                with pytest.raises((ServerDisconnected, ConnectionError)):
                    await asyncio.wait_for(fetch(c, srv.url), 1.0)
            await c.aclose()

    run(main(), limit=10)


# ---- 4. connection refused --------------------------------------------------------------------------


def test_connection_refused_is_connect_failed():
    """No listener: ConnectFailed (an OSError) whose os_error is the refusal."""
    url = closed_port_url()

    async def main():
        c = client()
        with pytest.raises(ConnectFailed) as info:
            await fetch(c, url)
        assert isinstance(info.value, OSError)
        assert isinstance(info.value.os_error, ConnectionRefusedError)
        assert url.rsplit("/", 1)[1] in str(info.value)
        await c.aclose()

    run(main())


@pytest.mark.slow  # make_engine loads the tiny model folder's tokenizer: seconds
def test_connection_refused_through_the_vllm_engine():
    """The vLLM engine turns a refused connection into EngineError 'cannot connect'."""
    from rowgrove.engines import make_engine
    from rowgrove.engines.base import SamplingParams
    from rowgrove.errors import EngineError

    engine = make_engine("vllm", "tiny", url=closed_port_url(), check=False)
    try:
        with pytest.raises(EngineError, match="cannot connect") as info:
            asyncio.run(engine.generate([1, 5], SamplingParams(max_tokens=2)))
        assert "is the server running" in str(info.value)
    finally:
        asyncio.run(engine.aclose())


def test_bad_url_is_value_error():
    """A URL that is not http(s)://HOST is refused before any connection."""

    async def main():
        c = client()
        for url in ("ftp://h/x", "http:///x", "localhost:8000"):
            with pytest.raises(ValueError):
                await fetch(c, url)
        await c.aclose()

    run(main())


# ---- 5. read timeout ------------------------------------------------------------------------------


def never_answer(conn: Conn) -> Awaitable[None]:
    async def handler() -> None:
        await conn.request()
        await conn.until_eof()

    return handler()


def test_read_timeout_before_the_head_closes_the_connection():
    """No byte for read_timeout: TimeoutError promptly, and the connection is closed (the server
    sees EOF, so it aborts the request)."""

    async def main():
        async with RawServer(never_answer) as srv:
            c = client(read_timeout=0.3)
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await fetch(c, srv.url)
            assert 0.25 < time.monotonic() - t0 < 1.0
            await asyncio.wait_for(srv.conns[0].eof.wait(), 1.0)
            await c.aclose()

    run(main())


def test_read_timeout_mid_body_and_per_call_override():
    """The read timeout counts between bytes of the body too (a stalled stream times out and its
    connection closes), and stream(read_timeout=) overrides the client's."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(CHUNKED_HEAD + chunk(b"data: a\n\n"))
            await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client(read_timeout=30)
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                async with c.stream("POST", srv.url, content=b"", headers={}, read_timeout=0.3) as r:
                    assert [d async for d in r.sse_data()] == []
            assert time.monotonic() - t0 < 1.0
            await asyncio.wait_for(srv.conns[0].eof.wait(), 1.0)
            await c.aclose()

    run(main())


# ---- 6. bodies ending early / with the connection ---------------------------------------------------


def test_close_mid_body_is_server_disconnected():
    """Content-Length 100 with 10 bytes then a close: aread() raises ServerDisconnected."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await asyncio.sleep(0.02)
            conn.close()

        async with RawServer(handler) as srv:
            c = client()
            with pytest.raises(ServerDisconnected):
                await fetch(c, srv.url)
            await c.aclose()

    run(main())


def test_unframed_body_ends_with_the_connection():
    """A body with neither Content-Length nor chunked is read whole up to the close, over
    several writes; the connection is not pooled."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello ")
            await asyncio.sleep(0.02)
            await conn.write(b"world")
            conn.close()

        async with RawServer(handler) as srv:
            c = client()
            status, _, body = await fetch(c, srv.url)
            assert (status, body) == (200, b"hello world")
            assert (await fetch(c, srv.url))[2] == b"hello world"
            assert len(srv.conns) == 2
            await c.aclose()

    run(main())


# ---- 7. leaving early and cancelling close the connection -------------------------------------------


def test_leaving_the_block_early_closes_the_connection():
    """Leaving `stream` before the reply ended closes the connection (the server sees EOF at once)
    and the next request uses a new connection."""

    async def main():
        async def handler(conn):
            if conn.n == 0:
                await conn.request()
                await conn.write(CHUNKED_HEAD + chunk(b"data: a\n\n"))
                await conn.until_eof()
            else:
                await serve_forever(conn, [reply(200, b"fresh")])

        async with RawServer(handler) as srv:
            c = client()
            async with c.stream("POST", srv.url, content=b"", headers={}) as r:
                async for d in r.sse_data():
                    assert d == b"a"
                    break
            await asyncio.wait_for(srv.conns[0].eof.wait(), 0.5)
            assert (await fetch(c, srv.url))[2] == b"fresh"
            assert len(srv.conns) == 2
            await c.aclose()

    run(main())


def test_cancelling_a_waiting_request_closes_its_connection():
    """Cancelling the task awaiting a reply (head not yet come, or mid-body) closes the
    connection, which is how the server learns to abort the request."""

    async def main():
        async def handler(conn):
            if conn.n == 0:
                await never_answer(conn)
            else:
                await conn.request()
                await conn.write(CHUNKED_HEAD + chunk(b"data: a\n\n"))
                await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client(read_timeout=None)
            for n in (0, 1):
                srv.got_request.clear()
                task = asyncio.create_task(fetch(c, srv.url))
                await asyncio.wait_for(srv.got_request.wait(), 1.0)
                await asyncio.sleep(0.02)  # the mid-body case: the first chunk is read
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.wait_for(srv.conns[n].eof.wait(), 0.5)
            assert len(srv.conns) == 2
            await c.aclose()

    run(main())


# ---- 8. not HTTP ------------------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [b"hello\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"\x00\xff" * 10])
def test_a_reply_that_is_not_http_is_server_disconnected(garbage):
    """Bytes that are not an HTTP/1.1 reply give ServerDisconnected (not a hang), and the
    connection is closed."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(garbage)
            await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client(read_timeout=None)
            with pytest.raises(ServerDisconnected):
                await fetch(c, srv.url)
            await asyncio.wait_for(srv.conns[0].eof.wait(), 0.5)
            await c.aclose()

    run(main())


# ---- 9. large bodies --------------------------------------------------------------------------------


def test_large_request_and_reply_round_trip():
    """A 2 MB request body arrives intact and a 5 MB reply (Content-Length, then chunked) is read
    intact, on one connection."""
    big_in = bytes(range(256)) * (2 * 4096)  # 2 MiB
    big_out = hashlib.sha256(b"x").digest() * (5 * 32768)  # 5 MiB

    async def main():
        async def handler(conn):
            while (req := await conn.request()) is not None:
                digest = hashlib.sha256(req[1]).hexdigest().encode()
                if b"chunked" in req[0]:
                    await conn.write(CHUNKED_HEAD)
                    for i in range(0, len(big_out), 1 << 20):
                        await conn.write(chunk(big_out[i:i + (1 << 20)]))
                    await conn.write(b"0\r\n\r\n")
                else:
                    await conn.write(reply(200, big_out, f"X-Digest: {digest.decode()}"))

        async with RawServer(handler) as srv:
            c = client()
            status, headers, body = await fetch(c, srv.url, body=big_in)
            assert status == 200 and headers.get("X-Digest") == hashlib.sha256(big_in).hexdigest()
            assert body == big_out
            async with c.stream("POST", srv.url + "/chunked", content=big_in, headers={"X-Mode": "chunked"}) as r:
                assert await r.aread() == big_out
            assert len(srv.conns) == 1 and [len(b) for _, _, b in srv.requests] == [len(big_in)] * 2
            await c.aclose()

    run(main(), limit=10)


# ---- 10. post() -------------------------------------------------------------------------------------


def test_post_returns_the_status_and_honours_its_timeout():
    """post() reads the answer and returns its status; against a server that never answers it
    raises TimeoutError after its timeout."""

    async def main():
        async with RawServer(lambda conn: serve_forever(conn, [reply(202, b"queued")])) as srv:
            c = client(read_timeout=None)
            assert await c.post(srv.url + "/pause", content=b"", headers={}) == 202
            assert await c.post(srv.url + "/pause", content=b"{}", headers={}, timeout=1.0) == 202
            assert len(srv.conns) == 1
            await c.aclose()
        async with RawServer(never_answer) as srv:
            c = client(read_timeout=None)
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await c.post(srv.url + "/pause", content=b"", headers={}, timeout=0.3)
            assert time.monotonic() - t0 < 1.0
            await asyncio.wait_for(srv.conns[0].eof.wait(), 0.5)
            await c.aclose()

    run(main())


# ---- 11. aclose() -----------------------------------------------------------------------------------


def test_aclose_closes_idle_connections_and_refuses_new_requests():
    """aclose() closes the pooled connections (the server sees EOF), is_closed turns True, and
    stream() afterwards raises ServerDisconnected."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(reply(200, b"ok"))
            await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client()
            assert c.is_closed is False
            await asyncio.gather(fetch(c, srv.url), fetch(c, srv.url))  # two at once: two connections
            assert len(srv.conns) == 2
            await c.aclose()
            assert c.is_closed is True
            await asyncio.wait_for(asyncio.gather(*(cn.eof.wait() for cn in srv.conns)), 0.5)
            with pytest.raises(ServerDisconnected):
                await fetch(c, srv.url)
            assert len(srv.conns) == 2

    run(main())


def test_aclose_during_a_reply_does_not_pool_its_connection():
    """A reply still being read when aclose() runs finishes, and its connection is then closed
    rather than pooled."""

    async def main():
        async def handler(conn):
            await conn.request()
            await conn.write(CHUNKED_HEAD + chunk(b"part"))
            await asyncio.sleep(0.05)
            await conn.write(chunk(b"-rest") + b"0\r\n\r\n")
            await conn.until_eof()

        async with RawServer(handler) as srv:
            c = client()
            async with c.stream("POST", srv.url, content=b"", headers={}) as r:
                await c.aclose()
                assert await r.aread() == b"part-rest"
            await asyncio.wait_for(srv.conns[0].eof.wait(), 0.5)

    run(main())


# ---- a real ASGI server -----------------------------------------------------------------------------


def test_against_uvicorn_and_starlette():
    """Against uvicorn + Starlette: JSON replies, a 503 with Retry-After, and an SSE stream read to
    [DONE], with the JSON requests sharing one kept-alive connection."""
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def echo(request):
        body = await request.json()
        return JSONResponse({"got": body, "client_port": request.client.port})

    async def busy(request):
        return PlainTextResponse("later", status_code=503, headers={"Retry-After": "3"})

    async def sse(request):
        n = (await request.json())["n"]

        async def events():
            for i in range(n):
                yield f"data: {{\"i\": {i}}}\n\n"
                await asyncio.sleep(0.005)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/busy", busy, methods=["POST"]),
                            Route("/sse", sse, methods=["POST"])])

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            c = client()
            ports = set()
            for i in range(3):
                status, _, body = await fetch(c, url, "/echo", b'{"k": %d}' % i)
                assert status == 200
                got = json.loads(body)
                assert got["got"] == {"k": i}
                ports.add(got["client_port"])
            assert len(ports) == 1  # one kept-alive connection
            status, headers, body = await fetch(c, url, "/busy")
            assert (status, body, headers.get("Retry-After")) == (503, b"later", "3")
            async with c.stream("POST", url + "/sse", content=b'{"n": 5}', headers={}) as r:
                assert r.status_code == 200
                got = [d async for d in r.sse_data()]
                assert got == [b'{"i": %d}' % i for i in range(5)] and r.done is True
            status, _, body = await fetch(c, url, "/echo", b'{"k": 9}')
            assert status == 200
            await c.aclose()
        finally:
            server.should_exit = True
            await task
            sock.close()

    run(main(), limit=10)


def test_ipv6_loopback_host_header_is_bracketed():
    """An engine URL on an IPv6 address (http://[::1]:PORT) connects, and its Host header names the
    address in brackets, as RFC 9110 writes it."""
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    seen: list[bytes] = []

    async def main() -> int:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            head = await r.readuntil(b"\r\n\r\n")
            seen.append(head)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
            w.close()

        try:
            server = await asyncio.start_server(handle, "::1", 0)
        except OSError:
            pytest.skip("no IPv6 loopback on this host")
        port = server.sockets[0].getsockname()[1]
        client = ServerClient(read_timeout=2.0, connect_timeout=2.0, headers={})
        try:
            async with client.stream("POST", f"http://[::1]:{port}/x", content=b"{}", headers={}) as r:
                assert await r.aread() == b"ok"
                return r.status_code
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(main()) == 200
    assert b"Host: [::1]:" in seen[0]
