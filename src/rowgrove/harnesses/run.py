"""Drive any CLI coding agent through a gateway: N rollouts of one group, each in its own workdir copy.

    from rowgrove.harnesses.run import run_group
    results = run_group("http://127.0.0.1:8000", "g1", ["codex", "exec", "fix the failing test"],
                        n=4, workdir="repo", reward_cmd="pytest -q")

For each rollout: `POST /v1/rollouts` (group `group`), a temporary copy of `workdir`, the harness
process pointed at the rollout by its own settings (`rowgrove.harnesses.known`: codex,
claude, qwen, opencode, mini; any other program through `{base_url}` and `{api_key}` placeholders
in its arguments and environment), then the reward command in that copy (exit 0 -> 1.0, else 0.0;
or the number its last output line prints), then `POST /v1/rollouts/{id}/finish` with no record
(`{"conversations": []}`): the gateway trains what its ledger holds. A harness that crashes or
runs past `timeout`, or a reward command that cannot run, finishes its rollout invalid
(`valid: false`) with the reason in the result, never with reward 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class RunError(Exception):
    """Bad input or an unreachable gateway: one sentence, shown without a traceback."""


@dataclass
class RolloutResult:
    rollout_id: str
    group_id: str
    reward: float | None
    valid: bool
    reason: str | None = None
    calls: int = 0
    roots: int = 0
    rows: int = 0
    delivered_fraction: float | None = None
    returncode: int | None = None
    output_tail: str = ""
    finish: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        reward = "invalid" if not self.valid else f"{self.reward:g}"
        frac = "-" if self.delivered_fraction is None else f"{self.delivered_fraction:.2f}"
        tail = f"  ({self.reason})" if self.reason else ""
        return (f"{self.rollout_id}  group={self.group_id}  calls={self.calls}  roots={self.roots}  "
                f"rows={self.rows}  reward={reward}  delivered={frac}{tail}")


class Gateway:
    """The gateway's control routes, over httpx."""

    def __init__(self, url: str, *, key: str | None = None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"authorization": f"Bearer {key}"} if key else {}
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, *, key: str | None = None) -> dict[str, Any]:
        url = path if path.startswith("http") else f"{self.url}{path}"
        headers = {"authorization": f"Bearer {key}"} if key else self.headers
        try:
            r = httpx.request(method, url, json=body, headers=headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise RunError(f"{method} {url} failed ({type(e).__name__}): is a gateway running at {self.url}?") from None
        if r.status_code >= 400:
            try:
                detail = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = r.text[:300]
            raise RunError(f"{method} {url} answered {r.status_code}: {detail}")
        return dict(r.json())

    def create(self, group: str, metadata: Mapping[str, Any]) -> tuple[str, str, str]:
        got = self.request("POST", "/v1/rollouts", {"group_id": group, "metadata": dict(metadata)})
        base = got["base_url"]
        return got["rollout_id"], (self.url + base if base.startswith("/") else base), got["api_key"]


def reward_from(returncode: int, output: str) -> float:
    """The number the last non-empty output line prints, else 1.0 on exit status 0 and 0.0 otherwise."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if lines:
        try:
            return float(lines[-1])
        except ValueError:
            pass
    return 1.0 if returncode == 0 else 0.0


def substitute(value: str, base_url: str, api_key: str) -> str:
    return value.replace("{base_url}", base_url).replace("{api_key}", api_key)


def run_one(gw: Gateway, group: str, argv: Sequence[str], *, workdir: Path | None, reward_cmd: str | None,
            timeout: float | None, env: Mapping[str, str] | None = None, index: int = 0,
            on_done: Callable[[RolloutResult], None] | None = None) -> RolloutResult:
    from rowgrove.harnesses.known import prepare

    rid, base_url, key = gw.create(group, {"harness": Path(argv[0]).name, "index": index})
    tmp = Path(tempfile.mkdtemp(prefix=f"rowgrove-run-{rid}-"))
    reason: str | None = None
    reward: float | None = None
    rc: int | None = None
    tail = ""
    try:
        work = tmp / "work"
        if workdir is not None:
            shutil.copytree(workdir, work, symlinks=True)
        else:
            work.mkdir()
        home = tmp / "home"
        home.mkdir()
        proc_env = {**os.environ, **{k: substitute(v, base_url, key) for k, v in (env or {}).items()}}
        proc_env["PWD"] = str(work)  # opencode takes its project folder from $PWD, not from its cwd
        args = [substitute(a, base_url, key) for a in argv]
        args, proc_env = prepare(args, proc_env, base_url=base_url, api_key=key, home=home, workdir=work)
        try:
            p = subprocess.run(args, cwd=work, env=proc_env, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=timeout)
            rc, tail = p.returncode, (p.stdout + p.stderr)[-4000:]
            if rc != 0:
                last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
                reason = f"the harness exited with status {rc}" + (f": {last[:200]}" if last else "")
        except subprocess.TimeoutExpired:
            reason = f"the harness ran past --timeout {timeout:g} s"
        except OSError as e:
            reason = f"the harness could not start: {e.strerror or e}"
        if reason is None and reward_cmd:
            try:
                r = subprocess.run(reward_cmd, shell=True, cwd=work, capture_output=True, text=True,
                                   timeout=timeout, env=os.environ.copy())
                if r.returncode in (126, 127):
                    reason = f"the reward command could not run (exit {r.returncode}: {r.stderr.strip()[:200]})"
                else:
                    reward = reward_from(r.returncode, r.stdout)
            except (OSError, subprocess.TimeoutExpired) as e:
                reason = f"the reward command could not run ({type(e).__name__})"
        elif reason is None:
            reward = 1.0 if rc == 0 else 0.0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    valid = reason is None
    fin = gw.request("POST", f"/v1/rollouts/{rid}/finish",
                     {"conversations": [], "reward": reward if valid else 0.0, "valid": valid}, key=key)
    res = RolloutResult(rid, group, reward if valid else None, valid, reason, returncode=rc, output_tail=tail,
                        finish=fin)
    try:
        lin = gw.request("GET", f"/v1/rollouts/{rid}", key=key)
        res.calls = len(lin.get("calls", []))
        res.roots = sum(1 for c in lin.get("calls", []) if c.get("root"))
        rows = gw.request("GET", f"/v1/rollouts/{rid}/rows", key=key)
        res.rows = len(rows.get("rows", []))
        frac = (rows.get("metrics") or {}).get("delivered_fraction")
        res.delivered_fraction = None if frac is None else float(frac)
    except RunError:
        pass
    if on_done is not None:
        on_done(res)
    return res


def run_group(gateway: str, group: str, argv: Sequence[str], *, n: int = 1, workdir: str | Path | None = None,
              reward_cmd: str | None = None, timeout: float | None = None, env: Mapping[str, str] | None = None,
              key: str | None = None, on_done: Callable[[RolloutResult], None] | None = None) -> list[RolloutResult]:
    """Run `argv` n times concurrently, one rollout of `group` each; the results in rollout order."""
    if not argv:
        raise RunError("no harness to run: give its command after `--`")
    if n < 1:
        raise RunError(f"--n must be at least 1, got {n}")
    if not re.match(r"^https?://", gateway):
        raise RunError(f"--gateway must be an http(s) URL such as http://127.0.0.1:8000, got {gateway!r}")
    wd = Path(workdir) if workdir is not None else None
    if wd is not None and not wd.is_dir():
        raise RunError(f"--workdir {wd} is not a folder")
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise RunError(f"the harness {argv[0]!r} is not on PATH")
    gw = Gateway(gateway, key=key)
    gw.request("GET", "/v1/models")  # reachable?
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(run_one, gw, group, argv, workdir=wd, reward_cmd=reward_cmd, timeout=timeout,
                               env=env, index=i, on_done=on_done) for i in range(n)]
        return [f.result() for f in futures]
