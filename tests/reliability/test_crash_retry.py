"""An SDK retry of a call committed before a crash is a replay. A `rowgrove serve` process that
dies (os._exit, as kill -9: nothing flushed, nothing answered) right after each call's ledger
commit, before its response; a new process on the same ledger file and port; the official
`openai` SDK's own retry (same body, `x-stainless-retry-count: 1`) gets the committed answer
from the ledger, and the engine generated each call once."""

from __future__ import annotations

import os
import subprocess
import threading

import httpx
import openai
import pytest
from test_crash import _free_port, _serve

from rowgrove.ledger import Ledger


def _start(ledger, port: int, log, die: bool) -> subprocess.Popen:
    """A server that dies after each call's ledger commit (`die`), or one that does not."""
    os.environ.pop("ROWGROVE_TEST_DIE_AFTER_COMMIT", None)
    return _serve(ledger, port, log, **({"ROWGROVE_TEST_DIE_AFTER_COMMIT": "1"} if die else {}))


ROLLOUTS, TURNS = 16, 2


@pytest.mark.slow  # two server processes (~10-20 s each to import torch and build the engine)
def test_sdk_retries_of_concurrent_rollouts_after_a_crash_between_commit_and_response_are_replayed(tmp_path):
    """16 rollouts at once, each its own SDK client: the server dies after the first commit of a
    group that holds several calls (committed, unanswered); every one of them is answered from the
    ledger by its SDK retry after the restart, and no rollout has a call generated twice."""
    ledger, port = tmp_path / "l.db", _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "serve.log", "wb") as log:
        procs = [_start(ledger, port, log, die=True)]
        at_crash: set[str] = set()

        def restart() -> None:
            assert procs[0].wait(timeout=120) == 137  # the crash, after a commit
            with Ledger(ledger, readonly=True) as lg:
                at_crash.update(c.id for ro in lg.rollouts() for c in lg.calls(ro.id) if c.status == "completed")
            procs.append(_start(ledger, port, log, die=False))

        ros = [httpx.post(url + "/v1/rollouts", json={"group_id": f"g{k % 4}"}).json() for k in range(ROLLOUTS)]
        answers: dict[str, list] = {ro["rollout_id"]: [] for ro in ros}
        errors: list[BaseException] = []
        start = threading.Barrier(ROLLOUTS)

        def rollout(k: int, ro: dict) -> None:
            try:
                base = url + ro["base_url"] if ro["base_url"].startswith("/") else ro["base_url"]
                client = openai.OpenAI(base_url=base, api_key=ro["api_key"], max_retries=10, timeout=60)
                messages = [{"role": "user", "content": f"task {k}: count to three"}]
                start.wait()
                for turn in range(TURNS):
                    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
                    answers[ro["rollout_id"]].append(out)
                    messages = [*messages, {"role": "assistant", "content": out.choices[0].message.content},
                                {"role": "user", "content": f"observation {turn}: go on"}]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        watcher = threading.Thread(target=restart)
        watcher.start()
        threads = [threading.Thread(target=rollout, args=(k, ro)) for k, ro in enumerate(ros)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=180)
            watcher.join(timeout=180)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=60)
    assert not errors, errors
    assert at_crash, "nothing was committed before the crash"
    answered = {out.id: out for outs in answers.values() for out in outs}
    # every call committed before the crash reached its client (replayed to the SDK's retry)
    assert at_crash <= answered.keys(), at_crash - answered.keys()
    regenerated = []
    with Ledger(ledger, readonly=True) as lg:
        for ro in ros:
            done = [c for c in lg.calls(ro["rollout_id"]) if c.status == "completed"]
            outs = answers[ro["rollout_id"]]
            if len(done) != TURNS:
                regenerated.append((ro["rollout_id"], [(c.id, c.id in at_crash) for c in done]))
                continue
            for out, call in zip(outs, done, strict=True):
                assert out.id == call.id
                assert out.choices[0].message.content == call.response["choices"][0]["message"]["content"]
    assert not regenerated, (len(at_crash), regenerated)
