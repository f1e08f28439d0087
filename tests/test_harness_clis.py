"""`rowgrove run` driving real coding-agent CLIs through a gateway on the scripted harness policy."""

from __future__ import annotations

import json
import os
import sqlite3
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import harnesses
from rowgrove.engines.harness_policy import SUMMARY
from rowgrove.harnesses.run import run_group

ROOT = Path(__file__).resolve().parents[1]
# a harness run takes 2-10 s alone; make test runs this beside the rest of the suite on 2 cores
RUN_TIMEOUT = 150
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
                                 "scripted", "--script", "harness", "--port", str(port), "--log-level", "debug",
                                 "--ledger", str(log.parent / "ledger.db")], stdout=out, stderr=subprocess.STDOUT, env=env)
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
    lines = log.read_text().splitlines()  # the access log (serve --log-level debug)
    assert any('" 200' in ln for ln in lines), "no access log lines"
    bad = [ln for ln in lines if '" 4' in ln or '" 5' in ln]
    assert not bad, bad[:3]


def test_run_marks_a_timeout_invalid_never_reward_zero(gateway, tmp_path):
    url, _ = gateway
    [res] = run_group(url, "timeout", ["sleep", "5"], n=1, timeout=0.5)
    assert not res.valid and res.reward is None and "timeout" in res.reason


@pytest.mark.parametrize("n,argv", [
    # default tools and settings (the sandbox is bypassed: this container has none to offer)
    (2, ["codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "write answer.txt with the word done"]),
    # default tools (Agent, TodoWrite, ...); only Bash is allowed without a prompt
    (2, ["claude", "-p", "--allowedTools=Bash", "write answer.txt with the word done"]),
    # mini-swe-agent 2.x: its bash tool, then its submit command
    (1, ["mini", "-y", "--exit-immediately", "-t", "write answer.txt with the word done"]),
    (1, ["qwen", "--yolo", "-p", "write answer.txt with the word done"]),
    (1, ["opencode", "run", "write answer.txt with the word done"]),
], ids=["codex", "claude", "mini", "qwen", "opencode"])
def test_run_finished_rollouts_rewarded(gateway, tmp_path, monkeypatch, n, argv):
    """n=2 for Codex and Claude Code (a group); one rollout each for the slower-starting others."""
    url, log = gateway
    for k, v in _path_with(argv[0]).items():
        monkeypatch.setenv(k, v)
    (tmp_path / "README").write_text("task\n")
    results = run_group(url, f"g-{argv[0]}", argv, n=n, workdir=tmp_path, timeout=RUN_TIMEOUT,
                        reward_cmd="grep -q done answer.txt")
    assert [r.valid for r in results] == [True] * n, [r.reason for r in results]
    assert [r.reward for r in results] == [1.0] * n
    assert all(r.calls >= 2 and r.rows >= 1 for r in results)
    _no_errors(log)


def _ledger_tokens(db: Path, rid: str) -> dict[str, tuple[list[int], list[int]]]:
    """Each call's (prompt ids as the ledger holds them: full for a root, the new part for a
    continuation; sampled ids) straight from the SQLite ledger."""
    import numpy as np

    with sqlite3.connect(db) as con:
        got = con.execute("SELECT id, prompt_ids, sampled_ids FROM calls WHERE rollout_id = ?", (rid,)).fetchall()
    return {cid: (np.frombuffer(p, dtype=np.int32).tolist(), np.frombuffer(s or b"", dtype=np.int32).tolist())
            for cid, p, s in got}


def _assert_rows_exact(url: str, db: Path, rid: str, key: str | None = None) -> dict:
    """Every row's tokens are exactly the engine's: its input_ids are its calls' ledger prompt and
    sampled ids in order, only sampled ids are trained, and each call of the rows is trained in
    exactly one of them (two rows that share an ancestor train it once)."""
    auth = {"authorization": f"Bearer {key}"} if key else {}
    got = httpx.get(f"{url}/v1/rollouts/{rid}/rows", headers=auth, timeout=30).json()
    rows, m = got["rows"], got["metrics"]
    calls = _ledger_tokens(db, rid)
    assert rows
    # finished with no record: the traffic is the record, every completed call trained but the
    # siblings a retry or resample superseded
    with sqlite3.connect(db) as con:
        (completed,), = con.execute("SELECT count(*) FROM calls WHERE rollout_id = ? AND status = 'completed'",
                                    (rid,)).fetchall()
    assert m["source"] == "traffic" and m["accepted_calls"] == completed - m["superseded_calls"], m
    trained: dict[str, int] = {}
    for row in rows:
        want, at = [], 0
        for cid in row["call_ids"]:
            p, s = calls[cid]
            want += p + s
            assert not any(row["loss_mask"][at:at + len(p)]), f"{cid}: prompt tokens trained"
            mask = row["loss_mask"][at + len(p):at + len(p) + len(s)]
            assert all(mask) or not any(mask), f"{cid}: sampled tokens partly trained"
            trained[cid] = trained.get(cid, 0) + bool(all(mask) and s)
            at += len(p) + len(s)
        assert row["input_ids"] == want
    assert all(n == 1 for n in trained.values()) and sum(trained.values()) == m["accepted_calls"], (trained, m)
    return httpx.get(f"{url}/v1/rollouts/{rid}", headers=auth, timeout=30).json()


def _start(url: str, name: str, tmp_path: Path) -> tuple[str, str, list[str], dict[str, str], Path]:
    """A rollout and the (argv, env) that point `name` at it, in a fresh workdir and config home."""
    from rowgrove.harnesses.known import prepare

    got = httpx.post(f"{url}/v1/rollouts", json={"group_id": f"c-{name}"}, timeout=30).json()
    rid, key = got["rollout_id"], got["api_key"]
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {**os.environ, **_path_with(name)}
    base = got["base_url"]
    argv, env = prepare([name], env, base_url=url + base if base.startswith("/") else base, api_key=key,
                        home=home, workdir=work)
    return rid, key, argv, env, work


def _finish(url: str, rid: str, key: str) -> None:
    httpx.post(f"{url}/v1/rollouts/{rid}/finish", json={"conversations": [], "reward": 1.0},
               headers={"authorization": f"Bearer {key}"}, timeout=30).raise_for_status()


def test_codex_inline_compaction_starts_a_new_root_with_exact_rows(gateway, tmp_path):
    url, log = gateway
    rid, key, argv, env, work = _start(url, "codex", tmp_path)
    # any limit below the first prompt (~23k tokens): Codex compacts once after its first call (the
    # "CONTEXT CHECKPOINT COMPACTION" request, tools: []) and goes on in the compacted context
    p = subprocess.run([*argv, "exec", "--skip-git-repo-check", "-c", "model_auto_compact_token_limit=5000",
                        "--dangerously-bypass-approvals-and-sandbox", "write answer.txt with the word done"],
                       cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert p.returncode == 0, p.stderr[-500:]
    assert (work / "answer.txt").read_text().strip() == "done"
    _finish(url, rid, key)
    lin = _assert_rows_exact(url, log.parent / "ledger.db", rid, key)
    assert sum(c["root"] for c in lin["calls"]) >= 2, lin["calls"]
    _no_errors(log)


def test_claude_resume_compact_starts_a_new_root_with_exact_rows(gateway, tmp_path):
    url, log = gateway
    rid, key, argv, env, work = _start(url, "claude", tmp_path)
    def claude(*args: str) -> str:
        p = subprocess.run([*argv, "-p", "--allowedTools=Bash", "--output-format", "stream-json", "--verbose", *args],
                           cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert p.returncode == 0, p.stderr[-500:]
        return next(json.loads(ln)["session_id"] for ln in p.stdout.splitlines()
                    if ln.startswith("{") and "session_id" in ln)

    session = claude("write answer.txt with the word done")
    # /compact's summary request extends the history (a continuation); the next turn runs in the
    # compacted context: a new root
    session = claude("--resume", session, "/compact")
    before = len(httpx.get(f"{url}/v1/rollouts/{rid}", headers={"authorization": f"Bearer {key}"}).json()["calls"])
    claude("--resume", session, "write answer.txt with the word done again")
    _finish(url, rid, key)
    lin = _assert_rows_exact(url, log.parent / "ledger.db", rid, key)
    assert len(lin["calls"]) > before and sum(c["root"] for c in lin["calls"]) >= 2, lin["calls"]
    _no_errors(log)


@pytest.mark.parametrize("argv", [
    ["codex", "exec", "--dangerously-bypass-approvals-and-sandbox",
     "use a sub-agent to write answer.txt with the word done"],            # spawn_agent, then wait_agent
    ["claude", "-p", "--allowedTools=Bash,Agent", "use a sub-agent to write answer.txt with the word done"],
], ids=["codex", "claude"])
def test_sub_agent_calls_are_a_separate_root_of_the_same_rollout(gateway, tmp_path, monkeypatch, argv):
    url, log = gateway
    for k, v in _path_with(argv[0]).items():
        monkeypatch.setenv(k, v)
    [res] = run_group(url, f"s-{argv[0]}", argv, n=1, workdir=tmp_path, timeout=RUN_TIMEOUT,
                      reward_cmd="grep -q done answer.txt")
    assert res.valid and res.reward == 1.0, res.reason
    # the parent's chain and the sub-agent's: two roots in the one rollout, each trained as rows of
    # its own (a no-record finish walks up from the last call of each root's tree), tokens exact
    assert res.roots >= 2 and res.calls >= 4, (res.calls, res.roots)
    lin = _assert_rows_exact(url, log.parent / "ledger.db", res.rollout_id)
    rows = httpx.get(f"{url}/v1/rollouts/{res.rollout_id}/rows", timeout=30).json()["rows"]
    roots = {c["id"] for c in lin["calls"] if c["root"]}
    assert len({cid for r in rows for cid in r["call_ids"]} & roots) >= 2, [r["call_ids"] for r in rows]
    _no_errors(log)


def _compacting_run(url: str, log: Path, rid: str, key: str, cmd: list[str], work: Path,
                    env: dict[str, str], min_roots: int) -> subprocess.CompletedProcess:
    """Run a harness on the answer-file task, finish with no record, check the rows are exact and
    the rollout has at least `min_roots` roots, and that nothing was refused."""
    p = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT)
    assert p.returncode == 0, p.stderr[-500:]
    assert (work / "answer.txt").read_text().strip() == "done"
    _finish(url, rid, key)
    lin = _assert_rows_exact(url, log.parent / "ledger.db", rid, key)
    assert sum(c["root"] for c in lin["calls"]) >= min_roots, lin["calls"]
    _no_errors(log)
    return p


def test_qwen_chat_compression_starts_a_new_root_with_exact_rows(gateway, tmp_path):
    url, log = gateway
    rid, key, argv, env, work = _start(url, "qwen", tmp_path)
    # compress above 1% of its window (its first prompt is ~45k tokens of 131k): before its second
    # request it sends the history under its own compression system prompt, asking to "generate the
    # <state_snapshot>" (a root: ~2.3k tokens, no tools), then goes on from the summary (a root);
    # without the setting the same task is one root of two calls
    settings = Path(env["HOME"]) / ".qwen" / "settings.json"
    cfg = json.loads(settings.read_text())
    cfg["model"] = {"chatCompression": {"contextPercentageThreshold": 0.01}}
    settings.write_text(json.dumps(cfg))
    _compacting_run(url, log, rid, key, [*argv, "--yolo", "-p", "write answer.txt with the word done"], work, env,
                    min_roots=3)


def test_opencode_auto_compaction_starts_a_new_root_with_exact_rows(gateway, tmp_path):
    url, log = gateway
    rid, key, argv, env, work = _start(url, "opencode", tmp_path)
    # opencode compacts when a step's tokens reach its model's limit.context minus its output limit;
    # its system prompt and tools alone are ~17.8k tokens, so a window below that compacts after
    # every step, forever. A padded task (~3.5k tokens) puts the first step (~21.3k) over 19k and
    # the compacted context (~17.8k: the summary in place of the task) under it: one compaction (a
    # request without tools, a root), then the next step goes on from the summary (a new root)
    cfg_path = Path(env["XDG_CONFIG_HOME"]) / "opencode" / "opencode.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["provider"]["rowgrove"]["models"]["policy"]["limit"] = {"context": 20000, "output": 1000}
    cfg_path.write_text(json.dumps(cfg))
    env["PWD"] = str(work)
    task = "write answer.txt with the word done. " + "Keep the answer file to one word. " * 300
    # its title request, the first step, the compaction request, the step after it: each a root
    p = _compacting_run(url, log, rid, key, [*argv, "run", task], work, env, min_roots=4)
    assert SUMMARY in p.stdout  # it prints the compaction's summary
