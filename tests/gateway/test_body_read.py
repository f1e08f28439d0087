"""A request body the gateway's protocol already holds whole (`protocol.BODY_DONE`) is read
without arming the body timeout; one still arriving is read under it, as before."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.gateway import app as app_module
from rowgrove.gateway.testing import start_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class _CountedTimeouts:
    """`asyncio` as app.py sees it, counting the body timeouts it arms."""

    def __init__(self) -> None:
        self.armed = 0

    def timeout(self, delay):  # noqa: ANN001
        self.armed += 1
        return asyncio.timeout(delay)

    def __getattr__(self, name: str):
        return getattr(asyncio, name)


@pytest.fixture
def counted(monkeypatch):
    c = _CountedTimeouts()
    monkeypatch.setattr(app_module, "asyncio", c)
    return c


@pytest.fixture
def gw(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as handle:
        yield handle


def _chat(gw, ro: dict, pause: float | None) -> bytes:
    """POST the chat request over one socket: headers and body in one write (`pause` None), or
    the body's last part `pause` seconds after the rest. Returns the raw answer."""
    body = json.dumps(CHAT).encode()
    port = int(gw.url.rsplit(":", 1)[1])
    path = f"/rollouts/{ro['rollout_id']}/v1/chat/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ro['api_key']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        if pause is None:
            sock.sendall(head + body)
        else:
            sock.sendall(head + body[:10])
            time.sleep(pause)  # the route is reading by now, and the body is not all there
            sock.sendall(body[10:])
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_a_body_sent_whole_is_read_without_a_timer(gw, counted):
    ro = gw.create_rollout("g")
    counted.armed = 0  # only the chat request's own read counts
    answer = _chat(gw, ro, None)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert counted.armed == 0


def test_a_body_still_arriving_is_read_under_the_body_timeout(gw, counted):
    ro = gw.create_rollout("g")
    counted.armed = 0
    answer = _chat(gw, ro, 0.3)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert counted.armed == 1
