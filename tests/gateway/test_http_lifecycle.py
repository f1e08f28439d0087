"""The gateway's life around calls: restarts on the same ledger, clients that go away mid-call,
finishing a rollout and reading its rows, and `rowgrove serve` as a real process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from openai import OpenAI

from fixtures_http import TestEngine, assert_continuation, scripted_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.ledger import Ledger

USER = [{"role": "user", "content": "hello"}]


def _client(ro, **kw) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0, **kw)


def _wait(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_restart_keeps_rollouts_keys_and_calls_and_continuations_link(tmp_path):
    path = tmp_path / "ledger.db"
    engine = TestEngine(scripted_engine("tiny-qwen3"))
    with start_gateway("tiny-qwen3", engine=engine, ledger=path) as gw:
        ro = gw.create_rollout("g-restart", {"seed": 1})
        r1 = _client(ro).chat.completions.create(model="m", messages=USER)
    # a crash left a call pending: the next start marks it aborted
    with Ledger(path) as led:
        stale = led.begin_call(ro["rollout_id"], parent_id=None, prompt_ids=[1, 2], prompt_len=2,
                               request_hash="00" * 16)
    with start_gateway("tiny-qwen3", engine=engine, ledger=path) as gw:
        assert gw.ledger.get_call(stale.id).status == "aborted"
        messages = USER + [r1.choices[0].message.model_dump(), {"role": "user", "content": "still there?"}]
        # the new server's base_url has another port; the rollout id and key are the same
        ro2 = dict(ro, base_url=f"{gw.url}/rollouts/{ro['rollout_id']}/v1")
        r2 = _client(ro2).chat.completions.create(model="m", messages=messages)
        assert r2.choices[0].message.content == "reply 3"  # ordinals continue after the aborted call
        c1, c2 = gw.ledger.get_call(r1.id), gw.ledger.get_call(r2.id)
        assert_continuation(gw.ledger, c2, c1)
        lineage = gw.lineage(ro["rollout_id"])
        assert [c["status"] for c in lineage["calls"]] == ["completed", "aborted", "completed"]
        with pytest.raises(openai.AuthenticationError):
            _client(dict(ro2, api_key="rk_wrong")).chat.completions.create(model="m", messages=messages)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_client_disconnect_aborts_the_call_and_cancels_the_engine(tmp_path, stream):
    engine = TestEngine(scripted_engine("tiny"))
    engine.delay = 3.0
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-gone")
        with pytest.raises(openai.APITimeoutError):
            _client(ro, timeout=0.3).chat.completions.create(model="m", messages=USER, stream=stream)
        assert _wait(lambda: [c.status for c in gw.ledger.calls(ro["rollout_id"])] == ["aborted"])
        (call,) = gw.ledger.calls(ro["rollout_id"])
        assert "disconnect" in call.error and call.finish_reason is None
        assert engine.cancelled == 1
        assert _wait(lambda: gw.gateway.in_flight == 0)
        # the rollout goes on: an aborted call is never a parent, the next call is served normally
        engine.delay = 0.0
        r = _client(ro).chat.completions.create(model="m", messages=USER)
        assert r.choices[0].finish_reason == "stop"


def test_finish_stores_the_record_and_rows_come_back(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-rows")
        client = _client(ro)
        messages = list(USER)
        for k in range(2):
            r = client.chat.completions.create(model="m", messages=messages)
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"q{k}"}]
        final = messages[:-1]
        with pytest.raises(Exception):  # rows of an open rollout are refused (409)
            gw.rows(ro["rollout_id"])
        out = gw.finish(ro["rollout_id"], messages=final, reward=0.5, valid=True)
        assert out["status"] == "finished" and out["reward"] == 0.5
        stored = gw.ledger.get_rollout(ro["rollout_id"])
        assert stored.record == {"messages": final} and stored.reward == 0.5
        rows = gw.rows(ro["rollout_id"])["rows"]
        calls = gw.ledger.calls(ro["rollout_id"])
        assert len(rows) == 1
        row = rows[0]
        assert row["reward"] == 0.5 and row["group_id"] == "g-rows"
        assert list(row["call_ids"]) == [c.id for c in calls]
        sampled = [t for c in calls for t in c.sampled_ids.tolist()]
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert masked == sampled


def test_conversations_record_and_lineage_route(tmp_path):
    with start_gateway("tiny", engine=TestEngine(scripted_engine("tiny")), ledger=tmp_path / "l.db") as gw:
        ro = gw.create_rollout("g-conv")
        client = _client(ro)
        a = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "main"}])
        b = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "sub"}])
        convs = [[{"role": "user", "content": "main"}, a.choices[0].message.model_dump()],
                 [{"role": "user", "content": "sub"}, b.choices[0].message.model_dump()]]
        gw.finish(ro["rollout_id"], conversations=convs, reward=1.0)
        lineage = gw.lineage(ro["rollout_id"])
        assert lineage["status"] == "finished"
        assert [c["root"] for c in lineage["calls"]] == [True, True]
        assert gw.ledger.get_rollout(ro["rollout_id"]).record == {"conversations": convs}
        assert httpx.get(gw.url + "/health").json()["status"] == "ok"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a fresh process imports torch and transformers (~5-10 s)
def test_rowgrove_serve_runs_a_real_server(tmp_path):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rowgrove.cli", "serve", "--model", "tiny", "--engine", "scripted",
         "--ledger", str(tmp_path / "served.db"), "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        assert _wait(up, timeout=60), proc.stdout.read1().decode() if proc.poll() is not None else "no start"
        ro = httpx.post(url + "/v1/rollouts", json={"group_id": "g-cli"}).json()
        assert ro["base_url"] == f"{url}/rollouts/{ro['rollout_id']}/v1"
        r = _client(ro).chat.completions.create(model="m", messages=USER)
        assert r.choices[0].message.content == "reply 1"
    finally:
        proc.terminate()  # SIGTERM: graceful shutdown, then a clean exit
        proc.wait(timeout=30)
    assert proc.returncode == 0
    with Ledger(tmp_path / "served.db", readonly=True) as led:
        assert [c.status for c in led.calls(ro["rollout_id"])] == ["completed"]
