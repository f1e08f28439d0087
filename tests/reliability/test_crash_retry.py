"""An SDK retry of a call committed before a crash is a replay. A `rowgrove serve` process that
dies (os._exit, as kill -9: nothing flushed, nothing answered) right after each call's ledger
commit, before its response; a new process on the same ledger file and port; the official
`openai` SDK's own retry (same body, `x-stainless-retry-count: 1`) gets the committed answer
from the ledger, and the engine generated each call once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import openai
from test_crash import _free_port

from rowgrove.ledger import Ledger


def _start(ledger, port: int, log, die: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if die:
        env["ROWGROVE_TEST_DIE_AFTER_COMMIT"] = "1"
    else:
        env.pop("ROWGROVE_TEST_DIE_AFTER_COMMIT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rowgrove.cli", "serve", "--engine", "scripted", "--model", "tiny",
         "--ledger", str(ledger), "--port", str(port), "--log-level", "warning"], env=env, stdout=log, stderr=log)
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


def test_an_sdk_retry_after_a_crash_between_commit_and_response_is_replayed(tmp_path):
    ledger, port, url = tmp_path / "l.db", _free_port(), None
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "serve.log", "wb") as log:
        proc = _start(ledger, port, log, die=True)
        ro = httpx.post(url + "/v1/rollouts", json={"group_id": "g"}).json()
        base = url + ro["base_url"] if ro["base_url"].startswith("/") else ro["base_url"]
        client = openai.OpenAI(base_url=base, api_key=ro["api_key"], max_retries=8, timeout=30)
        messages = [{"role": "user", "content": "count to three"}]
        answers = []
        try:
            for turn in range(2):
                restarted: dict = {}

                def restart(dying: subprocess.Popen = proc) -> None:
                    dying.wait(timeout=120)  # the crash, after the commit
                    restarted["proc"] = _start(ledger, port, log, die=False)

                t = threading.Thread(target=restart)
                t.start()
                out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
                t.join()
                assert proc.returncode == 137          # it did die after committing, unanswered
                proc = restarted["proc"]
                answers.append(out)
                messages = [*messages, {"role": "assistant", "content": out.choices[0].message.content},
                            {"role": "user", "content": f"observation {turn}: go on"}]
                if turn == 0:  # the next call's server dies after its commit too
                    proc.terminate()
                    proc.wait(timeout=60)
                    proc = _start(ledger, port, log, die=True)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    with Ledger(ledger, readonly=True) as lg:
        calls = lg.calls(ro["rollout_id"])
    assert len(calls) == 2, [(c.id, c.status) for c in calls]   # each generated once, never again
    for out, call in zip(answers, calls, strict=True):
        assert call.status == "completed" and out.id == call.id
        assert out.choices[0].message.content == call.response["choices"][0]["message"]["content"]
