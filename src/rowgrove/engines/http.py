"""The HTTP client the server engines generate through: aiohttp, chosen by measurement.

Against one vLLM stand-in on these 2-core machines, 64 concurrent requests: httpx's AsyncClient
210 req/s, aiohttp 1,470 req/s (same process, same server, side by side; FACTS.md saw the same
gap). The gateway makes one upstream request per call, so the client is on every call's path.
httpx stays for the start-up check and weight sync, which are rare and synchronous.

`ServerClient.stream(...)` yields a `Reply` with the few things the wire formats read:
`status_code`, `headers`, `aread()`, `aiter_lines()` (no line-length limit: an SGLang cumulative
chunk of a long answer is one very long line), and, once read, `json()` and `text` for error
messages. Failures surface as `aiohttp.ClientError` or `TimeoutError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson


class Reply:
    """One server answer as it streams in."""

    def __init__(self, resp: aiohttp.ClientResponse):
        self._resp = resp
        self.status_code = resp.status
        self.headers = resp.headers
        self.reason_phrase = resp.reason or ""
        self._body: bytes | None = None
        self.done = False

    async def aread(self) -> bytes:
        if self._body is None:
            self._body = await self._resp.read()
        return self._body

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines without their line ends, as they arrive."""
        buf = b""
        async for chunk in self._resp.content.iter_any():
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
    """A keep-alive connection pool to the servers, bound to the event loop it was made on."""

    def __init__(self, *, read_timeout: float | None, connect_timeout: float, headers: Mapping[str, str]):
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout),
            headers=dict(headers), auto_decompress=True)
        self.loop = asyncio.get_running_loop()

    @property
    def is_closed(self) -> bool:
        return self._session.closed

    @asynccontextmanager
    async def stream(self, method: str, url: str, *, content: bytes, headers: Mapping[str, str]) -> AsyncIterator[Reply]:
        async with self._session.request(method, url, data=content, headers=dict(headers)) as resp:
            yield Reply(resp)

    async def post(self, url: str, *, content: bytes, headers: Mapping[str, str], timeout: float = 5.0) -> int:
        """POST and read the answer; its status."""
        async with self._session.post(url, data=content, headers=dict(headers),
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()
            return resp.status

    async def aclose(self) -> None:
        await self._session.close()
