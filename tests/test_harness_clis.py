"""`rowgrove run` driving real coding-agent CLIs through a gateway on the scripted harness policy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import harnesses
from rowgrove.integrations.cli_harness import run_group

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.harnesses]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("gw") / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rowgrove.cli", "serve", "--model", "tiny", "--engine",
                                 "scripted", "--script", "harness", "--port", str(port), "--ledger",
                                 str(log.parent / "ledger.db")], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                httpx.get(f"{url}/v1/models", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(10)


def _path_with(*names: str) -> dict[str, str]:
    dirs = [str(harnesses.binary(n).parent) for n in names]
    return {"PATH": os.pathsep.join([*dirs, os.environ["PATH"]])}


def _no_errors(log: Path) -> None:
    bad = [ln for ln in log.read_text().splitlines() if '" 4' in ln or '" 5' in ln]
    assert not bad, bad[:3]


def test_run_marks_a_timeout_invalid_never_reward_zero(gateway, tmp_path):
    url, _ = gateway
    [res] = run_group(url, "timeout", ["sleep", "5"], n=1, timeout=0.5)
    assert not res.valid and res.reward is None and "timeout" in res.reason


@pytest.mark.parametrize("argv", [
    # default tools and settings (the sandbox is bypassed: this container has none to offer)
    ["codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "write answer.txt with the word done"],
    # default tools (Agent, TodoWrite, ...); only Bash is allowed without a prompt
    ["claude", "-p", "--allowedTools=Bash", "write answer.txt with the word done"],
], ids=["codex", "claude"])
def test_run_n2_two_finished_rollouts_rewarded(gateway, tmp_path, monkeypatch, argv):
    url, log = gateway
    for k, v in _path_with(argv[0]).items():
        monkeypatch.setenv(k, v)
    (tmp_path / "README").write_text("task\n")
    results = run_group(url, f"g-{argv[0]}", argv, n=2, workdir=tmp_path, timeout=40,
                        reward_cmd="grep -q done answer.txt")
    assert [r.valid for r in results] == [True, True], [r.reason for r in results]
    assert [r.reward for r in results] == [1.0, 1.0]
    assert all(r.calls >= 2 and r.rows >= 1 for r in results)
    _no_errors(log)
