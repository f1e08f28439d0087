"""A reply the harness never received is never trained, even when the gateway could not see it
was lost.

Over a real socket: a streamed answer of about 2.6 MB goes into the kernel's buffers faster than
the client reads it; the whole answer has left the gateway (its call stays `completed`: nothing
failed on its side), the client reads 4 KB and closes. The harness then finishes with only the
user message and reward 0. Its record says it kept no reply, so the rows route trains nothing and
the rollout is invalid, `nothing_to_train` (before, the terminal-chain fallback trained the
2,801 tokens of the unread answer)."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time

import openai
import orjson
import pytest
from test_delivery import USER, BigEngine, _statuses, _wait

from fixtures_http import scripted_engine
from rowgrove.assemble import rollout_rows
from rowgrove.gateway.testing import start_gateway

TOKENS = 2800  # with 20 top logprobs per token: about 2.6 MB of server-sent events
END = b"data: [DONE]\n\n\r\n0\r\n\r\n"  # the last SSE event, then the end of the chunked body


def _buffered(sock: socket.socket) -> int:
    """Bytes that arrived in the socket's receive buffer and were not read yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _until_stable(sock: socket.socket, quiet: float = 0.5, timeout: float = 30.0) -> int:
    """Wait until no more bytes arrive for `quiet` seconds; the bytes buffered then."""
    end = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < end:
        n = _buffered(sock)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return n
        time.sleep(0.05)
    return last


def _client(gw, ro) -> openai.OpenAI:
    base = gw.url + ro["base_url"] if ro["base_url"].startswith("/") else ro["base_url"]
    return openai.OpenAI(base_url=base, api_key=ro["api_key"], max_retries=0)


def test_a_finish_without_the_reply_trains_none_of_an_answer_left_unread(tmp_path):
    with start_gateway("tiny", engine=BigEngine(scripted_engine("tiny"), n=TOKENS), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")
        rid = ro["rollout_id"]
        body = orjson.dumps({"messages": USER, "stream": True, "logprobs": True, "top_logprobs": 20})
        path = f"/rollouts/{rid}/v1/chat/completions"
        port = int(gw.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # room for the whole answer, unread
        sock.connect(("127.0.0.1", port))
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ro['api_key']}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            assert _wait(lambda: _statuses(gw, rid) == ["completed"], timeout=30)
            size = _until_stable(sock)
            held = sock.recv(size, socket.MSG_PEEK | socket.MSG_WAITALL)
            if not held.endswith(END):
                pytest.skip(f"the kernel held only {size} bytes of the answer for the reader (net.core.rmem_max "
                            "too small): the whole answer must leave the gateway unread for this scenario")
            assert held.startswith(b"HTTP/1.1 200 ") and size > 2_500_000, size
            first = sock.recv(4096)  # the harness reads 4 KB of it ...
            assert len(first) == 4096
        finally:
            sock.close()  # ... and goes away
        time.sleep(0.3)
        # every byte left the gateway before the reader went away: it cannot tell, the call stays completed
        assert _statuses(gw, rid) == ["completed"]
        # the harness's record: it never got a reply
        gw.finish(rid, messages=USER, reward=0.0)
        out = gw.rows(rid)
        assert out["rows"] == []
        assert sum(sum(r["loss_mask"]) for r in out["rows"]) == 0
        assert out["invalid_reason"] and "no assistant message" in out["invalid_reason"]
        assert out["metrics"]["trained_tokens"] == 0 and out["metrics"]["generated_tokens"] == TOKENS + 1
        assert rollout_rows(gw.ledger, rid).reason_kinds == ["nothing_to_train"]


def test_the_same_answer_is_trained_when_the_record_holds_it(tmp_path):
    """The control: the same large answer, read in full and sent back as the assistant message,
    trains every sampled token (so the test above fails for the right reason)."""
    with start_gateway("tiny", engine=BigEngine(scripted_engine("tiny"), n=TOKENS), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")
        reply = _client(gw, ro).chat.completions.create(model="m", messages=USER).choices[0].message
        gw.finish(ro["rollout_id"], messages=USER + [{"role": "assistant", "content": reply.content}], reward=0.0)
        out = gw.rows(ro["rollout_id"])
        assert out["invalid_reason"] is None
        assert [sum(r["loss_mask"]) for r in out["rows"]] == [TOKENS + 1]


def test_a_finish_with_no_record_over_http_trains_the_traffic(tmp_path):
    """The one HTTP shape for "no record at all": `{"conversations": []}` (an empty `messages` is
    refused as a malformed conversation). The gateway's own view, the calls themselves, is trained."""
    with start_gateway("tiny", engine=BigEngine(scripted_engine("tiny"), n=8), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")
        _client(gw, ro).chat.completions.create(model="m", messages=USER)
        gw.finish(ro["rollout_id"], conversations=[], reward=1.0)
        out = gw.rows(ro["rollout_id"])
        assert out["invalid_reason"] is None and out["metrics"]["source"] == "traffic"
        assert [sum(r["loss_mask"]) for r in out["rows"]] == [9]
