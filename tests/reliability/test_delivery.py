"""Delivery: a completed call whose response did not reach the client in full is recorded
undelivered (aborted, never trained, never a parent). Driven at the ASGI level, where the moment
the connection is lost is chosen exactly, and over real sockets with a reader that stops reading
a large answer and hangs up."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.assemble import rollout_rows
from rowgrove.engines.base import Generation, SamplingParams
from rowgrove.gateway.app import create_app
from rowgrove.gateway.sessions import GatewaySettings
from rowgrove.gateway.testing import start_gateway
from rowgrove.ledger import Ledger
from rowgrove.ledger.store import UNDELIVERED

USER = [{"role": "user", "content": "hi"}]


# -- the ASGI driver -------------------------------------------------------------------------------


class Conn:
    """One HTTP exchange with the app, the way uvicorn runs it: the request body, then `receive()`
    waits until the connection is lost. `cut_at`: the index of the ASGI message (0 = response
    start) during whose send the connection is lost; that message and all later ones are dropped
    (uvicorn's send returns silently once disconnected), and the loss is noticed while that send
    waits to write. None: nothing is lost."""

    def __init__(self, body: bytes, cut_at: int | None = None):
        self.body = body
        self.cut_at = cut_at
        self.gone = asyncio.Event()
        self.messages: list[dict[str, Any]] = []
        self._body_sent = False
        self._n = 0

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        i, self._n = self._n, self._n + 1
        if self.gone.is_set():
            return
        if self.cut_at is not None and i >= self.cut_at:
            self.gone.set()
            for _ in range(3):  # the server waits to write (flow control) and sees the loss
                await asyncio.sleep(0)
            return
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.messages if m["type"] == "http.response.start"), None)

    @property
    def body_bytes(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


def _scope(path: str, key: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"authorization", f"Bearer {key}".encode()),
                                         (b"content-type", b"application/json"), *headers],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {}}


@pytest.fixture
def app_env(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    engine = TestEngine(scripted_engine("tiny"))
    app = create_app(engine, ledger, settings=GatewaySettings())
    gw = app.state.gateway
    yield app, gw, ledger, engine
    ledger.close()


def _chat(app, ro, body: dict, cut_at: int | None, headers: Sequence[tuple[bytes, bytes]] = ()) -> Conn:
    conn = Conn(orjson.dumps(body), cut_at)
    path = f"/rollouts/{ro.id}/v1/chat/completions"
    asyncio.run(app(_scope(path, ro.api_key, headers), conn.receive, conn.send))
    return conn


def _events(conn: Conn) -> list[bytes]:
    return [e for e in conn.body_bytes.split(b"\n\n") if e]


# -- ASGI level: the moment of the loss chosen exactly ------------------------------------------


def test_a_full_delivery_stays_completed(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    for stream in (False, True):
        conn = _chat(app, ro, {"messages": USER, "stream": stream}, cut_at=None)
        assert conn.status == 200
        conn.gone.set()  # the client hangs up after reading everything: nothing changes
    assert [c.status for c in ledger.calls(ro.id)] == ["completed", "completed"]
    assert _events(conn)[-1] == b"data: [DONE]"


@pytest.mark.parametrize("cut_at", [2, 3, 4], ids=["after-first-event", "after-content", "before-done"])
def test_a_stream_cut_after_its_first_bytes_is_undelivered(app_env, cut_at):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    conn = _chat(app, ro, {"messages": USER, "stream": True, "logprobs": True}, cut_at=cut_at)
    assert conn.status == 200 and conn.body_bytes  # the client got the first bytes
    assert b"[DONE]" not in conn.body_bytes
    (call,) = ledger.calls(ro.id)
    assert call.status == "aborted"
    assert call.error.startswith(UNDELIVERED) and "disconnected after" in call.error and "stream" in call.error
    assert call.finish_reason == "stop" and len(call.sampled_ids) > 0  # what was sampled stays visible
    assert gw.sessions[ro.id].index is None  # the lineage index no longer offers it as a parent


def test_a_connection_closed_before_the_body_was_sent_is_undelivered(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    conn = _chat(app, ro, {"messages": USER}, cut_at=1)  # the status line went out, the body did not
    assert conn.status == 200 and conn.body_bytes == b""
    (call,) = ledger.calls(ro.id)
    assert call.status == "aborted" and call.error.startswith(UNDELIVERED)
    assert "after 0 of" in call.error


def test_a_loss_before_the_response_started_is_undelivered(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    conn = _chat(app, ro, {"messages": USER, "stream": True}, cut_at=0)
    assert conn.messages == []
    (call,) = ledger.calls(ro.id)
    assert call.status == "aborted" and "before the response started" in call.error


def test_a_failing_send_is_undelivered(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    conn = Conn(orjson.dumps({"messages": USER, "stream": True}))
    n = 0

    async def send(message):
        nonlocal n
        n += 1
        if n == 3:
            raise OSError("connection reset by peer")  # an ASGI 2.4 server's way to say it
        await conn.send(message)

    asyncio.run(app(_scope(f"/rollouts/{ro.id}/v1/chat/completions", ro.api_key), conn.receive, send))
    (call,) = ledger.calls(ro.id)
    assert call.status == "aborted" and "OSError" in call.error and "connection reset" in call.error


def test_an_undelivered_call_is_never_a_parent_and_never_trained(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    first = _chat(app, ro, {"messages": USER}, cut_at=None)
    reply1 = orjson.loads(first.body_bytes)["choices"][0]["message"]
    msgs = USER + [reply1, {"role": "user", "content": "and?"}]
    cut = _chat(app, ro, {"messages": msgs, "stream": True}, cut_at=3)
    assert cut.status == 200
    c1, c2 = ledger.calls(ro.id)
    assert (c1.status, c2.status) == ("completed", "aborted") and c2.parent_id == c1.id
    # the harness asks again with what it has: a continuation of c1, a sibling of the lost c2
    again = _chat(app, ro, {"messages": msgs}, cut_at=None)
    c3 = ledger.get_call(orjson.loads(again.body_bytes)["id"])
    assert c3.parent_id == c1.id and c3.status == "completed"
    # a request that claims the undelivered reply as history cannot continue it: a new root
    lost = {"role": "assistant", "content": "reply 2"}
    root = _chat(app, ro, {"messages": msgs + [lost, {"role": "user", "content": "next"}]}, cut_at=None)
    c4 = ledger.get_call(orjson.loads(root.body_bytes)["id"])
    assert c4.root and c4.parent_id is None
    # finishing with no record at all: the terminal chain starts at the last completed call
    # (c4), the undelivered c2 is never walked, and since c3 answered c2's request the rollout
    # stays valid
    ledger.finish_rollout(ro.id, {"conversations": []}, 1.0)
    gw.sessions[ro.id].finished = True
    built = rollout_rows(ledger, ro.id)
    assert built.chains == [[c1.id, c3.id], [c4.id]]  # each root's terminal chain: c1's tree ends at c3
    assert all(c2.id not in r.call_ids for r in built.rows)
    assert built.invalid_reason is None


def test_an_undelivered_call_nobody_replaced_makes_the_rollout_invalid(app_env):
    """A stream cut, then the harness gives up and finishes with what it has (no assistant
    message, reward 0): the terminal chain does not train the lost reply, and the rollout is
    invalid for the infrastructure failure instead of teaching reward 0."""
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    first = _chat(app, ro, {"messages": USER}, cut_at=None)
    reply1 = orjson.loads(first.body_bytes)["choices"][0]["message"]
    _chat(app, ro, {"messages": USER + [reply1, {"role": "user", "content": "and?"}], "stream": True}, cut_at=2)
    c1, c2 = ledger.calls(ro.id)
    assert c2.status == "aborted"
    ledger.finish_rollout(ro.id, None, 0.0)
    built = rollout_rows(ledger, ro.id)
    assert built.chains == [[c1.id]]  # the fallback walks from the last *completed* call
    assert "infra_failure" in built.reason_kinds and c2.id in built.invalid_reason
    assert all(not r.valid and c2.id in r.mask_reason for r in built.rows)


def test_a_replayed_answer_that_is_cut_leaves_the_original_completed(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    body = {"messages": USER, "stream": True}
    _chat(app, ro, body, cut_at=None)
    (call,) = ledger.calls(ro.id)
    # the SDK's retry of the same body gets the original's answer; losing that copy does not
    # undo the delivery of the original
    retry = _chat(app, ro, body, cut_at=2, headers=[(b"x-stainless-retry-count", b"1")])
    assert retry.status == 200
    assert [c.status for c in ledger.calls(ro.id)] == ["completed"]
    assert ledger.get_call(call.id).status == "completed"


def test_an_sdk_retry_after_a_cut_is_generated_anew(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    body = {"messages": USER, "stream": True}
    _chat(app, ro, body, cut_at=2)
    retry = _chat(app, ro, body, cut_at=None, headers=[(b"x-stainless-retry-count", b"1")])
    assert retry.status == 200
    assert [c.status for c in ledger.calls(ro.id)] == ["aborted", "completed"]


def test_undelivered_calls_are_counted_in_metrics(app_env):
    app, gw, ledger, _ = app_env
    ro = gw.create_rollout("g", None)
    _chat(app, ro, {"messages": USER, "stream": True}, cut_at=2)
    text = gw.metrics.render().decode()
    assert 'rowgrove_calls_total{kind="root",status="undelivered"} 1.0' in text
    assert 'rowgrove_calls_total{kind="root",status="completed"} 1.0' in text


# -- the ledger method ---------------------------------------------------------------------------


def test_mark_undelivered_moves_only_completed_calls(tmp_path):
    with Ledger(tmp_path / "l.db") as led:
        ro = led.create_rollout("g")
        a = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="a")
        assert not led.mark_undelivered(a.id, "cut")  # pending: not a delivery question
        led.complete_call(a.id, sampled_ids=[5, 6], logprobs=[-1.0, -0.5], finish_reason="stop",
                          summary_hash="s", response_hash="r", response={"id": a.id})
        assert led.mark_undelivered(a.id, "the stream was cut")
        got = led.get_call(a.id)
        assert got.status == "aborted" and got.error == f"{UNDELIVERED}: the stream was cut"
        assert got.sampled_ids.tolist() == [5, 6] and got.response == {"id": a.id}
        assert not led.mark_undelivered(a.id, "again")  # once
        assert led.get_call(a.id).error == f"{UNDELIVERED}: the stream was cut"
        b = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="b")
        led.end_call(b.id, "failed", "engine")
        assert not led.mark_undelivered(b.id, "cut")
        assert led.get_call(b.id).error == "engine"


# -- real sockets: a reader that stops reading a large answer and hangs up -------------------------


class BigEngine:
    """Answers every call with `n` tokens at once (no model work): a large answer, fast."""

    def __init__(self, inner: Any, n: int = 6000):
        self.tokenizer = inner.tokenizer
        self.vocab_size = inner.vocab_size
        self.eot = inner.eot_id
        self.token = inner.tokenizer.encode("word", add_special_tokens=False)[0]
        self.n = n

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        ids = [self.token] * self.n + [self.eot]
        tops = [[(self.token, -0.25)] * sampling.top_logprobs for _ in ids] if sampling.top_logprobs else None
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop", top_logprobs=tops)

    async def aclose(self) -> None:
        pass


def _statuses(gw, rollout_id: str) -> list[str]:
    """The rollout's call statuses, read without the (large) response bodies."""
    with gw.ledger._lock:
        rows = gw.ledger._db.execute("SELECT status FROM calls WHERE rollout_id=? ORDER BY ordinal",
                                     (rollout_id,)).fetchall()
    return [r[0] for r in rows]


def _wait(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_reader_that_hangs_up_mid_answer_leaves_the_call_undelivered(tmp_path, stream):
    with start_gateway("tiny", engine=BigEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")
        body = orjson.dumps({"messages": USER, "stream": stream, "logprobs": True, "top_logprobs": 20})
        path = f"/rollouts/{ro['rollout_id']}/v1/chat/completions"
        port = int(gw.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader's small window
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ro['api_key']}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        first = sock.recv(256)
        assert first.startswith(b"HTTP/1.1 200 ")
        rid = ro["rollout_id"]
        assert _wait(lambda: _statuses(gw, rid) == ["completed"])
        time.sleep(0.3)  # the server fills the buffers and waits for the reader
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.close()
        assert _wait(lambda: _statuses(gw, rid) == ["aborted"]), "still completed"
        with gw.ledger._lock:
            (error,) = gw.ledger._db.execute("SELECT error FROM calls WHERE rollout_id=?", (rid,)).fetchone()
        assert error.startswith(UNDELIVERED) and "bytes of the" in error
        # a reader that reads it all is a delivery
        r = httpx.post(gw.url + path, content=body, headers={"authorization": f"Bearer {ro['api_key']}"},
                       timeout=60)
        assert r.status_code == 200 and len(r.content) > 1_000_000
        time.sleep(0.2)
        assert _statuses(gw, rid) == ["aborted", "completed"]
