"""kill -9 under concurrent load, then a restart on the same ledger: no call the server answered
200 is lost or changed, the file is intact, and every rollout goes on where it was — its next
call continues the last answer it received, and it finishes into rows. A `rowgrove serve`
process (scripted engine, tiny model) driven by 16 concurrent multi-turn rollouts over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from rowgrove.ledger import Ledger

ROLLOUTS = 16
KILL_AFTER = 40  # acknowledged calls before the kill


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(ledger, port: int, log, **env: str) -> subprocess.Popen:
    """`rowgrove serve` on the scripted tiny engine, started and healthy; `env` adds variables."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rowgrove.cli", "serve", "--engine", "scripted", "--model", "tiny",
         "--ledger", str(ledger), "--port", str(port), "--log-level", "warning"],
        env=dict(os.environ, OMP_NUM_THREADS="1", **env), stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None, f"serve exited with {proc.returncode}"
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("serve did not start")


def _turn(messages: list[dict], answer: dict, t: int) -> list[dict]:
    return messages + [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                       {"role": "user", "content": f"observation {t}: go on"}]


async def _load(url: str, acked: list, state: dict, proc: subprocess.Popen) -> None:
    """ROLLOUTS rollouts calling turn after turn until the server is killed under them."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        async def one(k: int) -> None:
            ro = (await http.post("/v1/rollouts", json={"group_id": f"g{k % 4}"})).json()
            messages = [{"role": "user", "content": f"task {k}: count to three"}]
            state[k] = {"ro": ro, "messages": messages, "last": None}
            t = 0
            while True:
                try:
                    r = await http.post(ro["base_url"] + "/chat/completions", json={
                        "model": "tiny", "messages": messages, "max_tokens": 8},
                        headers={"Authorization": f"Bearer {ro['api_key']}"})
                except httpx.TransportError:
                    return  # the kill
                assert r.status_code == 200, r.text
                body = r.json()
                acked.append((ro["rollout_id"], body["id"], body["choices"][0]["message"]["content"]))
                t += 1
                messages = _turn(messages, body, t)
                state[k].update(messages=messages, last=body["id"])

        tasks = [asyncio.ensure_future(one(k)) for k in range(ROLLOUTS)]
        while len(acked) < KILL_AFTER:
            await asyncio.sleep(0.005)
            assert not all(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)


@pytest.mark.slow  # two server processes (~10-20 s each to import torch and build the engine)
def test_kill_9_under_load_then_restart_on_the_same_ledger_loses_nothing(tmp_path):
    path, port = tmp_path / "ledger.db", _free_port()
    url = f"http://127.0.0.1:{port}"
    acked: list[tuple[str, str, str]] = []
    state: dict[int, dict] = {}
    with open(tmp_path / "serve.log", "ab") as log:
        proc = _serve(path, port, log)
        try:
            asyncio.run(_load(url, acked, state, proc))
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        assert len(acked) >= KILL_AFTER and len(state) == ROLLOUTS

        # the file as the kill left it: intact, every acknowledged call there, completed, unchanged
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        db.close()
        with Ledger(path, readonly=True) as led:
            calls = {c.id: c for ro in led.rollouts() for c in led.calls(ro.id)}
            for rid, cid, text in acked:
                c = calls[cid]
                assert c.status == "completed" and c.rollout_id == rid
            assert {ro.status for ro in led.rollouts()} == {"open"}

        proc = _serve(path, port, log)  # the same ledger, the same port
        try:
            with httpx.Client(base_url=url, timeout=30) as http:
                for k, st in sorted(state.items()):
                    ro = st["ro"]
                    r = http.post(ro["base_url"] + "/chat/completions", json={
                        "model": "tiny", "messages": st["messages"], "max_tokens": 8},
                        headers={"Authorization": f"Bearer {ro['api_key']}"})
                    assert r.status_code == 200, r.text  # the rollout's key still works
                    st["next"] = r.json()["id"]
                    fin = http.post(f"/v1/rollouts/{ro['rollout_id']}/finish", json={
                        "reward": float(k % 2),
                        "messages": _turn(st["messages"], r.json(), 99)[:-1]})
                    assert fin.status_code == 200, fin.text
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0

    with Ledger(path, readonly=True) as led:
        for st in state.values():
            nxt = led.get_call(st["next"])
            # a rollout that had an answer goes on from it: the restart is not a new root
            if st["last"] is not None:
                assert nxt.parent_id == st["last"], (st["ro"]["rollout_id"], nxt.parent_id, st["last"])
        assert {ro.status for ro in led.rollouts()} == {"finished"}
    from rowgrove.cli import main

    assert main(["rows", "--ledger", str(path), "--out", str(tmp_path / "rows.jsonl"), "--quiet"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert {r["rollout_id"] for r in rows} == {st["ro"]["rollout_id"] for st in state.values()}
    assert all(r["valid"] for r in rows), [r.get("mask_reason") for r in rows if not r["valid"]]
