"""Graceful shutdown: on SIGTERM the calls in flight finish, and until the socket closes new calls
(and new rollouts) get 503 with Retry-After instead of a refused connection. Tested in-process
on the real uvicorn server (`GatewayServer.handle_exit`, what the signal handler calls) and, once,
with a real SIGTERM to a `serve` process whose engine is slow."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from fixtures_http import TestEngine, scripted_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.ledger import Ledger

USER = [{"role": "user", "content": "hello"}]


def _client(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def _wait(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.TransportError:
        return True
    return False


def test_sigterm_drains_in_flight_calls_and_answers_503_until_the_socket_closes(tmp_path):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db", retry_after=2.0) as gw:
        ro = gw.create_rollout("g-drain")
        late_ro = gw.create_rollout("g-late")
        engine.delay = 1.5
        results: dict[str, object] = {}

        def slow_call() -> None:
            try:
                results["slow"] = _client(ro["base_url"], ro["api_key"]).chat.completions.create(
                    model="m", messages=USER)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                results["slow"] = e

        t = threading.Thread(target=slow_call)
        t.start()
        # in flight from admission (its pending row may still be committing): wait until the engine
        # has it, so that the delay below is already running when it is lifted
        assert _wait(lambda: gw.gateway.in_flight == 1 and len(engine.prompts) == 1)
        gw.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
        assert gw.server.draining and not gw.server.should_exit
        engine.delay = 0.0
        # the socket is still open: new calls get 503 with Retry-After, they are not refused
        with pytest.raises(openai.InternalServerError) as info:
            _client(late_ro["base_url"], late_ro["api_key"]).chat.completions.create(model="m", messages=USER)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "2"
        assert info.value.response.json()["error"]["code"] == "unavailable"
        r = httpx.post(gw.url + "/v1/rollouts", json={"group_id": "g-new"})
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        health = httpx.get(gw.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "closing"
        # nothing was recorded for them
        assert gw.ledger.calls(late_ro["rollout_id"]) == []
        # the call in flight finishes and is answered
        t.join(timeout=10)
        slow = results["slow"]
        assert not isinstance(slow, Exception), slow
        assert slow.choices[0].message.content == "reply 1"
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert call.status == "completed" and call.id == slow.id
        # then the server exits and the socket closes
        assert _wait(lambda: _refused(gw.url), timeout=15)


def test_a_second_sigterm_stops_at_once(tmp_path):
    engine = TestEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g")
        engine.delay = 30.0
        t = threading.Thread(target=lambda: _try(lambda: _client(ro["base_url"], ro["api_key"]).chat.completions.create(
            model="m", messages=USER)))
        t.start()
        assert _wait(lambda: gw.gateway.in_flight == 1)
        gw.server.handle_exit(signal.SIGTERM, None)
        time.sleep(0.3)
        assert not gw.server.should_exit  # still draining: the call has 30 s to go
        gw.server.handle_exit(signal.SIGTERM, None)
        assert gw.server.should_exit
        assert _wait(lambda: _refused(gw.url), timeout=15)
        t.join(timeout=15)
    # the call that could not finish was cut by the shutdown, not left pending
    with Ledger(tmp_path / "l.db", readonly=True) as led:
        assert [c.status for c in led.calls(ro["rollout_id"])] == ["aborted"]


def _try(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001
        pass


def test_no_call_in_flight_means_an_immediate_exit(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        t0 = time.monotonic()
        gw.server.handle_exit(signal.SIGTERM, None)
        assert _wait(lambda: _refused(gw.url), timeout=10)
        assert time.monotonic() - t0 < 5


# -- a real SIGTERM to a serving process -------------------------------------------------------------

SERVE = textwrap.dedent("""
    import asyncio, sys
    import torch
    torch.set_num_threads(1)
    from rowgrove.engines import make_engine
    from rowgrove.gateway.server import serve
    from rowgrove.gateway.sessions import GatewaySettings
    from rowgrove.ledger import Ledger

    class Slow:
        def __init__(self, inner):
            self.inner, self.tokenizer, self.vocab_size = inner, inner.tokenizer, inner.vocab_size
        async def generate(self, prompt_ids, sampling, *, hints=None):
            if (hints or {}).get("script") == "slow":
                await asyncio.sleep(float(sys.argv[3]))
            return await self.inner.generate(prompt_ids, sampling, hints=hints)
        async def aclose(self):
            await self.inner.aclose()

    engine = Slow(make_engine("scripted", "tiny"))
    ledger = Ledger(sys.argv[1])
    serve(engine, ledger, port=int(sys.argv[2]), settings=GatewaySettings(retry_after=3), log_level="warning")
    asyncio.run(engine.aclose())
    ledger.close()
    print("clean exit", flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOAD = 12  # rollouts with a slow call in flight when SIGTERM arrives


@pytest.mark.slow  # a fresh process imports torch and transformers (~5-10 s)
def test_a_real_sigterm_under_load_lets_every_call_in_flight_finish(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(tmp_path / "l.db"), str(port), "3"],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        assert _wait(up, timeout=90), proc.stdout.read1().decode() if proc.poll() is not None else "no start"
        ros = [httpx.post(url + "/v1/rollouts", json={"group_id": f"g{k % 3}"}).json() for k in range(LOAD)]
        other = httpx.post(url + "/v1/rollouts", json={"group_id": "g-late"}).json()
        results: dict[int, object] = {}

        def slow_call(k: int) -> None:
            try:
                results[k] = _client(ros[k]["base_url"], ros[k]["api_key"]).chat.completions.create(
                    model="m", messages=USER, extra_body={"script": "slow"})
            except Exception as e:  # noqa: BLE001
                results[k] = e

        threads = [threading.Thread(target=slow_call, args=(k,)) for k in range(LOAD)]
        for t in threads:
            t.start()
        assert _wait(lambda: httpx.get(url + "/health").json()["in_flight"] == LOAD, timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert _wait(lambda: httpx.get(url + "/health").status_code == 503, timeout=5)
        with pytest.raises(openai.InternalServerError) as info:  # a new call while draining
            _client(other["base_url"], other["api_key"]).chat.completions.create(model="m", messages=USER)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "3"
        late = httpx.post(url + "/v1/rollouts", json={"group_id": "g-later"})  # and a new rollout
        assert late.status_code == 503 and late.json()["error"]["code"] == "unavailable"
        for t in threads:
            t.join(timeout=30)
        bad = {k: r for k, r in results.items() if isinstance(r, Exception)}
        assert not bad and len(results) == LOAD, bad
        assert all(r.choices[0].message.content == "slow" for r in results.values())
        assert proc.wait(timeout=30) == 0
        assert "clean exit" in proc.stdout.read().decode()
        assert _refused(url)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Ledger(tmp_path / "l.db", readonly=True) as led:
        for ro in ros:
            assert [c.status for c in led.calls(ro["rollout_id"])] == ["completed"]
        assert led.calls(other["rollout_id"]) == []
        assert len(led.rollouts()) == LOAD + 1
