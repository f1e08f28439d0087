"""A response's head (status line and headers) leaves in the same write as its body's first bytes
(`rowgrove.gateway.protocol.OneWriteCycle`): one system call per answer, and nothing lost or
reordered for a HEAD answer, a closing connection, a multi-part body or a client already gone."""

from __future__ import annotations

import asyncio
import logging

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from rowgrove.gateway.protocol import OneWriteCycle


class Transport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(method: str = "POST", keep_alive: bool = True) -> tuple[OneWriteCycle, Transport]:
    t = Transport()
    log = logging.getLogger("test")
    cycle = OneWriteCycle(scope={"method": method, "type": "http", "http_version": "1.1"}, transport=t,
                          flow=FlowControl(t), logger=log, access_logger=log, access_log=False,
                          default_headers=[], message_event=asyncio.Event(), expect_100_continue=False,
                          keep_alive=keep_alive, on_response=lambda: None)
    return cycle, t


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}


def test_head_and_body_leave_in_one_write():
    async def go():
        cycle, t = _cycle()
        await cycle.send(START)
        assert t.writes == []
        await cycle.send({"type": "http.response.body", "body": b"hello"})
        assert len(t.writes) == 1 and t.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert t.writes[0].endswith(b"\r\n\r\nhello") and cycle.response_complete and not t.closed

    asyncio.run(go())


def test_a_body_in_pieces_closing_connection_and_head_request():
    async def go():
        cycle, t = _cycle(keep_alive=False)
        await cycle.send(START)
        await cycle.send({"type": "http.response.body", "body": b"he", "more_body": True})
        await cycle.send({"type": "http.response.body", "body": b"llo"})
        assert len(t.writes) == 2 and t.writes[0].endswith(b"\r\n\r\nhe") and t.writes[1] == b"llo"
        assert b"connection: close" in t.writes[0] and t.closed

        cycle, t = _cycle(method="HEAD")  # no body bytes: the head still goes out
        await cycle.send(START)
        await cycle.send({"type": "http.response.body", "body": b""})
        assert len(t.writes) == 1 and t.writes[0].endswith(b"\r\n\r\n")

        cycle, t = _cycle(method="HEAD", keep_alive=False)
        await cycle.send(START)
        await cycle.send({"type": "http.response.body", "body": b""})
        assert len(t.writes) == 1 and t.closed

    asyncio.run(go())


def test_nothing_is_written_to_a_client_already_gone():
    async def go():
        cycle, t = _cycle()
        await cycle.send(START)
        cycle.disconnected = True
        await cycle.send({"type": "http.response.body", "body": b"hello"})
        assert t.writes == []

    asyncio.run(go())


def test_a_wrong_content_length_still_fails_as_uvicorn_fails_it():
    async def go():
        cycle, t = _cycle()
        await cycle.send(START)
        with pytest.raises(RuntimeError, match="longer than Content-Length"):
            await cycle.send({"type": "http.response.body", "body": b"hello!"})

    asyncio.run(go())
