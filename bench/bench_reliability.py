"""Benchmark: the capture gateway's reliability, against a real `rowgrove serve` (scripted engine)
run as a subprocess on a free loopback port. Three figures, each with a goal:

 1. fuzz: N random mutations of valid requests across every route (rollout create, chat completions
    on a rollout's base_url, finish, lineage, rows, weights, models, metrics, health): wrong types,
    deep nesting, huge strings, bad roles, bad tool calls, bad base64 images, unknown and missing
    keys, truncated JSON, non-UTF-8 bytes, bad keys and paths. Goals: 0 responses >= 500, and the
    ledger holds exactly the calls that were answered 200 (a refused request leaves no call).
 2. kill -9 under load: 64 concurrent multi-turn rollouts; the server is SIGKILLed mid-load and
    restarted on the same ledger and port. Goals: 0 acknowledged (200) calls missing from the
    ledger as completed under the response's id, and every rollout's next call succeeds after it.
 3. soak: 256 rollouts x 20 turns at 64 concurrent. Goal: 0 lost calls (every 200 is in the
    ledger, completed, in the right rollout).

The client is bench_gateway's raw asyncio-streams HTTP/1.1 keep-alive client, extended to any
method and raw bytes. Results: bench/results/reliability.json (not with --quick).

    .venv/bin/python bench/bench_reliability.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson

RESULTS = Path(__file__).resolve().parent / "results" / "reliability.json"
MAX_TOKENS = 8
PROMPT_TEXT_CAP = 2000    # chars of a huge string put where it becomes prompt text (tiny's context: 8192)
CLIENT_TIMEOUT_S = 60.0


# -- the server: `rowgrove serve` as a subprocess --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`python -m rowgrove.cli serve --engine scripted --model tiny` on `ledger`, `port`."""

    def __init__(self, ledger: str, port: int | None = None, *, log: str | None = None):
        self.ledger, self.port = ledger, port or _free_port()
        self.log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rowgrove.cli", "serve", "--engine", "scripted", "--model", "tiny",
             "--ledger", ledger, "--port", str(self.port), "--max-queue", "4096", "--log-level", "warning"],
            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=self.log, stderr=self.log,
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if b" 200 " in s.recv(64):
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"rowgrove serve did not start on port {self.port} (rc {self.proc.poll()})")
            time.sleep(0.1)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.log is not subprocess.DEVNULL:
            self.log.close()


# -- client -----------------------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection: any method, raw bytes, status, headers and body
    (content-length or chunked). Reopens itself after the server closed the connection."""

    def __init__(self, port: int):
        self.port, self.host = port, f"127.0.0.1:{port}"
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, port: int) -> Conn:
        c = cls(port)
        await c._connect()
        return c

    async def _connect(self) -> None:
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)

    async def request(self, method: str, path: str, body: bytes | None = None, key: str | None = None,
                      extra: str = "") -> tuple[int, dict[str, str], bytes]:
        if self.w is None:
            await self._connect()
        assert self.r is not None and self.w is not None
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        length = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body is not None else ""
        try:
            self.w.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{auth}{extra}{length}\r\n".encode()
                         + (body or b""))
            head = await self.r.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            if "content-length" in headers:
                data = await self.r.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int((await self.r.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await self.r.readexactly(size + 2)
                    if size == 0:
                        break
                    parts.append(chunk[:-2])
                data = b"".join(parts)
            else:
                data = b""
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, data

    async def post(self, path: str, body: bytes, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
        return await self.request("POST", path, body, key)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs)
    return {"p50_ms": round(float(np.percentile(a, 50)), 4), "p99_ms": round(float(np.percentile(a, 99)), 4),
            "mean_ms": round(float(a.mean()), 4)}


async def new_rollout(conn: Conn, group: str) -> dict[str, Any]:
    status, _, data = await conn.post("/v1/rollouts", orjson.dumps({"group_id": group}))
    assert status == 201, (status, data)
    ro = orjson.loads(data)
    ro["path"] = urlsplit(ro["base_url"]).path + "/chat/completions"
    return ro


def _first_messages(tag: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a terse agent."},
            {"role": "user", "content": f"task {tag}: count to three"}]


def _extend(messages: list[dict], answer: bytes, t: int) -> list[dict]:
    msg = orjson.loads(answer)["choices"][0]["message"]
    return messages + [{"role": "assistant", "content": msg.get("content") or ""},
                       {"role": "user", "content": f"observation {t}: ok, next"}]


def ledger_check(path: str, acked: list[tuple[str, str]]) -> dict[str, Any]:
    """Every (rollout_id, call_id) the client got a 200 for: is it in the ledger, completed, in
    that rollout? Counts what is missing, not completed, or misplaced."""
    from rowgrove.ledger import Ledger

    missing = not_completed = wrong_rollout = 0
    with Ledger(path, readonly=True) as led:
        by_id: dict[str, Any] = {}
        for ro in led.rollouts():
            for c in led.calls(ro.id):
                by_id[c.id] = c
        for rid, cid in acked:
            c = by_id.get(cid)
            if c is None:
                missing += 1
            elif c.status != "completed":
                not_completed += 1
            elif c.rollout_id != rid:
                wrong_rollout += 1
        statuses: dict[str, int] = {}
        for c in by_id.values():
            statuses[c.status] = statuses.get(c.status, 0) + 1
    return {"acked": len(acked), "missing": missing, "not_completed": not_completed,
            "wrong_rollout": wrong_rollout, "lost": missing + not_completed + wrong_rollout,
            "ledger_calls_by_status": statuses}


# -- 1. fuzz ----------------------------------------------------------------------------------------

PNG_1x1 = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c6360000002"
    "00010005fe02fea75f8d0000000049454e44ae426082")).decode()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]


def _valid_chat(rng: random.Random, k: int, images: bool = True) -> dict[str, Any]:
    """A valid chat body (tiny is text-only: the image variant is a well-formed request it refuses 400)."""
    messages = _first_messages(f"fuzz {k}")
    kind = rng.random()
    body: dict[str, Any] = {"model": "tiny", "max_tokens": MAX_TOKENS}
    if kind < 0.25:
        body["tools"] = copy.deepcopy(TOOLS)
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    elif kind < 0.4 and images:
        messages[1] = {"role": "user", "content": [
            {"type": "text", "text": f"describe {k}"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1x1}"}}]}
    elif kind < 0.55:
        body.update(temperature=rng.choice([0.0, 0.7, 1.0]), top_p=0.9, stream=rng.random() < 0.5, seed=k)
    body["messages"] = messages
    return body


_ODD = [None, True, False, 0, -1, 1.5, 2**63, -(2**63), 10**40, "", "x", "\u0000", "\ud7ff\ue000",
        [], {}, [1, "a", None], {"a": {"b": []}}, "💥" * 10]
_ROLES = ["", "root", "System", "assistant ", "function", "developer", "tool", 7, None, ["user"], "\u202euser"]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def _deep(depth: int) -> Any:
    v: Any = "bottom"
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def mutate(rng: random.Random, body: Any, huge: int) -> bytes:
    """One random mutation of a valid body, as the bytes to send."""
    doc = copy.deepcopy(body)
    op = rng.randrange(14)
    paths = _paths(doc)
    where = rng.choice(paths)
    if op == 0:      # wrong type
        doc = _set(doc, where, copy.deepcopy(rng.choice(_ODD)))
    elif op == 1:    # deep nesting
        depth = rng.choice([10, 63, 65, 200, 1000, 5000])  # orjson writes at most 255 levels: spliced in
        doc = _set(doc, where, _deep(depth) if depth < 200 else "\u0000DEEP")
    elif op == 2:    # huge string; in text the engine reads, kept within the model's context (see oversized_prompt)
        size = rng.choice([1000, 100_000, huge])
        if where and where[0] in ("messages", "tools", "conversations"):
            size = min(size, PROMPT_TEXT_CAP)
        doc = _set(doc, where, rng.choice("aZ\u00e9\u4e2d<|") * size)
    elif op == 3 and isinstance(doc, dict) and isinstance(doc.get("messages"), list) and doc["messages"]:
        rng.choice(doc["messages"])["role"] = rng.choice(_ROLES)  # bad role
    elif op == 4 and isinstance(doc, dict) and "messages" in doc:  # bad tool calls
        bad = rng.choice([
            "not a list", [None], [{"id": 1}], [{"type": "function", "function": {"name": 3}}],
            [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}],
            [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": 1}}}],
            [{"id": "c", "type": "nope", "function": {}}],
        ])
        doc["messages"].append({"role": "assistant", "content": None, "tool_calls": bad})
        if rng.random() < 0.5:
            doc["messages"].append({"role": "tool", "tool_call_id": rng.choice(["c", "zz", None, 5]),
                                    "content": rng.choice(["x", None, [], {"a": 1}])})
        if rng.random() < 0.5:
            doc["tools"] = rng.choice([None, "x", [{}], [{"type": "function"}], [{"function": {"name": ""}}]])
    elif op == 5 and isinstance(doc, dict) and "messages" in doc:  # bad base64 image
        url = rng.choice(["data:image/png;base64,@@@not-base64@@@", "data:image/png;base64,",
                          f"data:image/png;base64,{PNG_1x1[:-7]}", "data:image/png;base64,"
                          + base64.b64encode(b"not an image at all").decode(), "data:;base64,AAAA",
                          "data:image/jpeg;base64," + "A" * 4001, "http://example.invalid/x.png",
                          "file:///etc/passwd", "data:image/png;base64," + "QUJD" * 3 + "="])
        part = rng.choice([{"type": "image_url", "image_url": {"url": url}}, {"type": "image_url", "image_url": url},
                           {"type": "image_url"}, {"type": "image", "image": url}, {"type": "input_image"}])
        doc["messages"].append({"role": "user", "content": [{"type": "text", "text": "look"}, part]})
    elif op == 6 and isinstance(doc, dict):  # unknown keys
        for _ in range(rng.randint(1, 5)):
            doc[rng.choice(["zzz", "logit_bias", "functions", "n", "best_of", "\u0000", "x" * 300,
                            "response_format", "stop", "logprobs", "top_logprobs"])] = copy.deepcopy(rng.choice(_ODD))
    elif op == 7 and len(where) > 0:  # missing key / element
        node = doc
        for p in where[:-1]:
            node = node[p]
        del node[where[-1]]
    elif op == 8:    # number edges
        if isinstance(doc, dict):
            doc[rng.choice(["max_tokens", "temperature", "top_p", "n", "seed", "top_logprobs", "reward",
                            "max_completion_tokens", "version"])] = rng.choice(
                [0, -1, 10**9, 10**30, 1e308, -1e308, 2.5, "8", None, True])
    try:
        raw = orjson.dumps(doc)
    except TypeError:  # an integer past 64 bits
        raw = json.dumps(doc).encode()
    if op == 1 and b'"\\u0000DEEP"' in raw:
        raw = raw.replace(b'"\\u0000DEEP"', b'{"k":[' * (depth // 2) + b"0" + b"]}" * (depth // 2))
    if op == 9:      # truncated JSON
        raw = raw[:rng.randrange(max(1, len(raw)))]
    elif op == 10:   # non-UTF-8 bytes
        i = rng.randrange(len(raw) + 1)
        raw = raw[:i] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]) + raw[i:]
    elif op == 11:   # not JSON / odd JSON text
        raw = rng.choice([b"", b"null", b"[]", b"1e999999", b"NaN", b'{"a":1,"a":2}', b"\x00" * 10,
                          b'{"messages": [' * 3000, b"  {}  ", raw + b"garbage", raw * 2])
    elif op == 12:   # a raw nested body, past any JSON decoder's comfort
        raw = b"[" * rng.choice([100, 10_000, 100_000]) + b"]" * rng.choice([0, 100])
    return raw


async def fuzz(port: int, n: int, seed: int, huge: int) -> dict[str, Any]:
    rng = random.Random(seed)
    statuses: dict[str, int] = {}
    by_route: dict[str, dict[str, int]] = {}
    server_errors: list[str] = []
    conn_errors = timeouts = 0
    chat_ids: set[tuple[str, str]] = set()
    created: set[str] = set()
    lat: list[float] = []

    setup = await Conn.open(port)
    rollouts = [await new_rollout(setup, f"fuzz-g{i % 4}") for i in range(24)]
    created.update(ro["rollout_id"] for ro in rollouts)
    to_finish = [await new_rollout(setup, "fuzz-finish") for _ in range(max(8, n // 200))]
    created.update(ro["rollout_id"] for ro in to_finish)
    setup.close()

    async def worker(w: int, jobs: list[int]) -> None:
        nonlocal conn_errors, timeouts
        conn = Conn(port)
        wrng = random.Random(seed * 1000 + w)
        for k in jobs:
            ro = wrng.choice(rollouts)
            key = ro["api_key"]
            route = wrng.choices(["chat", "chat-valid", "create", "finish", "lineage", "rows", "weights",
                                  "models", "metrics", "health", "ro-models", "path"],
                                 weights=[40, 18, 8, 6, 4, 4, 5, 3, 3, 2, 2, 5])[0]
            method, body = "POST", None
            if route in ("chat", "chat-valid"):
                path, valid = ro["path"], _valid_chat(wrng, k, images=route == "chat")
                body = orjson.dumps(valid) if route == "chat-valid" else mutate(wrng, valid, huge)
                r = wrng.random()
                if route == "chat" and r < 0.05:
                    key = wrng.choice([None, "", "wrong", rollouts[0]["api_key"] + "x", "\u00e9".encode().decode()])
                elif route == "chat" and r < 0.08:
                    path = wrng.choice(["/rollouts/ro_nope/v1/chat/completions", "/v1/chat/completions",
                                        ro["path"].replace("/rollouts/", "/rollouts/%00"), ro["path"] + "/x"])
            elif route == "create":
                path, key = "/v1/rollouts", None
                body = mutate(wrng, {"group_id": f"fz{k}", "metadata": {"k": k, "tags": ["a"]}}, huge)
            elif route == "finish":
                target = wrng.choice(to_finish)
                path, key = f"/v1/rollouts/{target['rollout_id']}/finish", None
                body = mutate(wrng, {"messages": _first_messages("f") + [{"role": "assistant", "content": "1 2 3"}],
                                     "reward": 1.0, "valid": True}, huge)
            elif route in ("lineage", "rows"):
                rid = wrng.choice([ro["rollout_id"], "ro_nope", "%2e%2e", "x" * 2000, ro["rollout_id"] + "'"])
                method, key = "GET", None
                path = f"/v1/rollouts/{rid}" + ("/rows" if route == "rows" else "")
            elif route == "weights":
                path, key = "/v1/weights", None
                if wrng.random() < 0.3:
                    method = "GET"
                else:
                    body = mutate(wrng, wrng.choice([{"version": 0}, {"path": "/nonexistent/ckpt"}]), huge)
            elif route in ("models", "metrics", "health"):
                method, key = wrng.choice(["GET", "GET", "GET", "POST", "DELETE"]), None
                path = {"models": "/v1/models", "metrics": "/metrics", "health": "/health"}[route]
            elif route == "ro-models":
                method, path = "GET", ro["base_url"].split(str(port), 1)[1] + "/models"
            else:
                method = wrng.choice(["GET", "POST", "PUT", "PATCH", "OPTIONS", "HEAD"])
                path = wrng.choice(["/", "/v2/x", "/rollouts", "/v1/rollouts/", "/v1//rollouts",
                                    "/v1/rollouts/" + "a" * 5000, "/%ff%fe", "/v1/weights?x=" + "y" * 1000])
                body = b"{}" if method in ("POST", "PUT", "PATCH") else None
                key = None
            t0 = time.perf_counter()
            try:
                if method == "HEAD":  # HEAD answers carry no body whatever content-length says
                    conn.close()
                    status = 0
                    _r, _w = await asyncio.open_connection("127.0.0.1", port)
                    _w.write(f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    status = int((await _r.readuntil(b"\r\n")).split()[1])
                    _w.close()
                    data = b""
                else:
                    status, _, data = await asyncio.wait_for(conn.request(method, path, body, key),
                                                             CLIENT_TIMEOUT_S)
            except TimeoutError:
                timeouts += 1
                if len(server_errors) < 20:
                    server_errors.append(f"{route} {method} {path[:80]} -> no answer in {CLIENT_TIMEOUT_S:g} s")
                conn.close()
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                conn_errors += 1
                conn.close()
                continue
            lat.append((time.perf_counter() - t0) * 1000)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            rs = by_route.setdefault(route, {})
            rs[str(status)] = rs.get(str(status), 0) + 1
            if status >= 500 and len(server_errors) < 20:
                server_errors.append(f"{route} {method} {path[:80]} -> {status}: {data[:300]!r}")
            if route.startswith("chat") and status == 200:
                text = data if b"data:" not in data[:8] else data.split(b"\n\n")[0][5:]
                chat_ids.add((ro["rollout_id"], orjson.loads(text)["id"]))
            if route == "create" and status == 201:
                created.add(orjson.loads(data)["rollout_id"])
        conn.close()

    workers = 16
    jobs = list(range(n))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w, jobs[w::workers]) for w in range(workers)))
    wall = time.perf_counter() - t0
    five = sum(v for s, v in statuses.items() if int(s) >= 500)
    return {"requests": n, "answered": sum(statuses.values()), "connection_errors": conn_errors, "timeouts": timeouts,
            "wall_s": round(wall, 2), "statuses": dict(sorted(statuses.items())), "by_route": by_route,
            "responses_5xx": five, "server_errors_sample": server_errors, "latency": _pcts(lat),
            "_chat_ids": sorted(chat_ids), "_created": sorted(created)}


def fuzz_figure(n: int, seed: int, huge: int, tmp: str) -> dict[str, Any]:
    import uvloop

    from rowgrove.ledger import Ledger

    path = f"{tmp}/fuzz.db"
    server = Serve(path, log=f"{tmp}/fuzz.log")
    try:
        res = uvloop.run(fuzz(server.port, n, seed, huge))
        probe = res["oversized_prompt"] = uvloop.run(oversized_prompt(server.port, 12_000))
    finally:
        server.close()
    chat_ids = res.pop("_chat_ids")
    probe_rollout = probe.pop("_rollout_id")
    created = set(res.pop("_created")) | {probe_rollout}
    if probe.get("_call_id"):  # the probe's answered call is an answered call too
        chat_ids.append((probe_rollout, probe.pop("_call_id")))
    check = ledger_check(path, [tuple(x) for x in chat_ids])
    with Ledger(path, readonly=True) as led:
        ledger_rollouts = {ro.id for ro in led.rollouts()}
        total_calls = sum(len(led.calls(r)) for r in ledger_rollouts)
    res["chat_200_distinct_ids"] = len(chat_ids)
    res["ledger_calls"] = total_calls
    res["ledger_calls_not_answered_200"] = total_calls - (len(chat_ids) - check["missing"])
    res["answered_200_not_in_ledger_completed"] = check["lost"]
    res["ledger_rollouts_not_answered_201"] = len(ledger_rollouts - created)
    res["ledger"] = check["ledger_calls_by_status"]
    res["ledger_changes_by_refused"] = (res["ledger_calls_not_answered_200"] + res["ledger_rollouts_not_answered_201"]
                                        + check["lost"])
    log = Path(f"{tmp}/fuzz.log").read_text(errors="replace")
    res["server_log_tail"] = log[-1500:] if res["responses_5xx"] or "Traceback" in log else ""
    return res


async def oversized_prompt(port: int, words: int) -> dict[str, Any]:
    """One chat whose prompt is `words` words, past tiny's 8192-token context: is it refused (4xx),
    or run? Informational (not a goal): a prompt of millions of tokens runs a forward pass that
    does not end in any useful time, and occupies an engine worker meanwhile."""
    conn = await Conn.open(port)
    try:
        ro = await new_rollout(conn, "oversized")
        body = orjson.dumps({"model": "tiny", "max_tokens": MAX_TOKENS, "messages": [
            {"role": "user", "content": "hello " * words}]})
        t0 = time.perf_counter()
        try:
            status, _, data = await asyncio.wait_for(conn.post(ro["path"], body, ro["api_key"]), 120)
        except TimeoutError:
            return {"words": words, "status": None, "seconds": 120.0, "answer": "no answer in 120 s",
                    "_rollout_id": ro["rollout_id"]}
        out = {"words": words, "status": status, "seconds": round(time.perf_counter() - t0, 2),
               "_rollout_id": ro["rollout_id"]}
        if status == 200:
            answer = orjson.loads(data)
            out["prompt_tokens"] = answer.get("usage", {}).get("prompt_tokens")
            out["_call_id"] = answer["id"]
        else:
            out["answer"] = data[:200].decode(errors="replace")
        return out
    finally:
        conn.close()


# -- 2. kill -9 under load and 3. the soak ----------------------------------------------------------


async def rollout_loop(port: int, tag: int, turns: int | None, acked: list, state: dict, lat: list,
                       stop: asyncio.Event | None = None) -> None:
    """One rollout: create it, then up to `turns` calls (forever if None) each extending the last.
    Every 200 goes into `acked` as (rollout_id, response id); state[tag] keeps where it got to."""
    conn = await Conn.open(port)
    try:
        ro = await new_rollout(conn, f"g{tag % 16}")
        messages = _first_messages(tag)
        state[tag] = {"ro": ro, "messages": messages, "t": 0}
        t = 0
        while (turns is None or t < turns) and not (stop and stop.is_set()):
            body = orjson.dumps({"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS})
            t0 = time.perf_counter()
            status, _, data = await conn.post(ro["path"], body, ro["api_key"])
            if status != 200:
                state[tag]["refused"] = state[tag].get("refused", 0) + 1
                if status in (429, 503):
                    await asyncio.sleep(0.05)
                    continue
                raise RuntimeError(f"call {t} of {ro['rollout_id']}: {status} {data[:200]!r}")
            lat.append((time.perf_counter() - t0) * 1000)
            acked.append((ro["rollout_id"], orjson.loads(data)["id"]))
            t += 1
            messages = _extend(messages, data, t)
            state[tag].update(messages=messages, t=t)
    finally:
        conn.close()


def kill9_figure(rollouts: int, kill_after: int, tmp: str) -> dict[str, Any]:
    import uvloop

    path = f"{tmp}/kill9.db"
    log = f"{tmp}/kill9.log"
    server = Serve(path, log=log)
    port = server.port
    acked: list[tuple[str, str]] = []
    state: dict[int, dict] = {}
    lat: list[float] = []
    errors: dict[str, int] = {}
    out: dict[str, Any] = {"rollouts": rollouts, "kill_after_acked": kill_after}
    try:
        async def load() -> None:
            async def one(k: int) -> None:
                try:
                    await rollout_loop(port, k, None, acked, state, lat)
                except Exception as e:  # noqa: BLE001 - the kill ends every rollout with a broken connection
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

            tasks = [asyncio.ensure_future(one(k)) for k in range(rollouts)]
            t0 = time.perf_counter()
            while len(acked) < kill_after and time.perf_counter() - t0 < 120:
                await asyncio.sleep(0.005)
            out["in_flight_at_kill"] = server.proc.poll() is None and sum(not t.done() for t in tasks)
            server.kill9()
            out["acked_at_kill"] = len(acked)
            out["load_s"] = round(time.perf_counter() - t0, 2)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)

        uvloop.run(load())
        out["client_errors_at_kill"] = errors
        out["acked"] = len(acked)
        t0 = time.perf_counter()
        server = Serve(path, port, log=log)
        out["restart_s"] = round(time.perf_counter() - t0, 2)
        check = ledger_check(path, acked)
        out["ledger"] = check["ledger_calls_by_status"]
        out["acked_missing"] = check["missing"]
        out["acked_not_completed"] = check["not_completed"]
        out["acked_lost"] = check["lost"]
        # committed as completed but killed before the answer went out: not lost, but calls the
        # client never saw (they stay `completed`; no process was left to mark them undelivered)
        out["completed_not_acked"] = check["ledger_calls_by_status"].get("completed", 0) - (len(acked) - check["lost"])

        async def resume() -> tuple[int, list[str]]:
            async def nxt(k: int) -> str | None:
                st = state[k]
                conn = await Conn.open(port)
                try:
                    body = orjson.dumps({"model": "tiny", "messages": st["messages"], "max_tokens": MAX_TOKENS})
                    status, _, data = await conn.post(st["ro"]["path"], body, st["ro"]["api_key"])
                    if status != 200:
                        return f"{st['ro']['rollout_id']}: {status} {data[:200]!r}"
                    acked2.append((st["ro"]["rollout_id"], orjson.loads(data)["id"]))
                    return None
                finally:
                    conn.close()

            res = await asyncio.gather(*(nxt(k) for k in sorted(state)))
            return sum(r is None for r in res), [r for r in res if r][:5]

        acked2: list[tuple[str, str]] = []
        ok, why = uvloop.run(resume())
        out["rollouts_started"] = len(state)
        out["resumed_ok"] = ok
        out["resume_failures"] = len(state) - ok
        out["resume_failure_sample"] = why
        out["resumed_calls_lost"] = ledger_check(path, acked2)["lost"]
        out["latency_before_kill"] = _pcts(lat)
    finally:
        server.close()
    return out


def soak_figure(rollouts: int, turns: int, concurrency: int, tmp: str) -> dict[str, Any]:
    import uvloop

    path = f"{tmp}/soak.db"
    server = Serve(path, log=f"{tmp}/soak.log")
    acked: list[tuple[str, str]] = []
    lat: list[float] = []
    state: dict[int, dict] = {}
    try:
        async def go() -> float:
            sem = asyncio.Semaphore(concurrency)

            async def one(k: int) -> None:
                async with sem:
                    await rollout_loop(server.port, k, turns, acked, state, lat)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(k) for k in range(rollouts)))
            return time.perf_counter() - t0

        wall = uvloop.run(go())
    finally:
        server.close()
    check = ledger_check(path, acked)
    expected = rollouts * turns
    return {"rollouts": rollouts, "turns": turns, "concurrency": concurrency, "expected_calls": expected,
            "acked": len(acked), "distinct_ids": len({c for _, c in acked}),
            "refused_then_retried": sum(s.get("refused", 0) for s in state.values()),
            "lost": check["lost"] + (expected - len(acked)), "ledger": check["ledger_calls_by_status"],
            "wall_s": round(wall, 2), "req_per_s": round(len(acked) / wall, 1), "latency": _pcts(lat)}


# -- main ---------------------------------------------------------------------------------------------


def _goal(value: Any, goal: str, met: bool) -> dict[str, Any]:
    return {"value": value, "goal": goal, "met": bool(met)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    q = args.quick
    t_start = time.time()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the servers
    try:
        return _main(q, args.seed, t_start)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(q: bool, seed: int, t_start: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-rel-") as tmp:
        results: dict[str, Any] = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "load_avg_at_start": os.getloadavg()[0]},
            "server": "rowgrove serve --engine scripted --model tiny (subprocess, OMP_NUM_THREADS=1)",
            "seed": seed,
        }
        results["fuzz"] = fuzz_figure(1000 if q else 10_000, seed, 1 << 20 if q else 4 << 20, tmp)
        results["kill9"] = kill9_figure(64, 64 * (2 if q else 4), tmp)
        results["soak"] = soak_figure(*((32, 5) if q else (256, 20)), 64, tmp)
    f, k, s = results["fuzz"], results["kill9"], results["soak"]
    results["goals"] = {
        "fuzz_5xx": _goal(f["responses_5xx"], "== 0", f["responses_5xx"] == 0),
        "fuzz_timeouts": _goal(f["timeouts"], "== 0", f["timeouts"] == 0),
        "fuzz_ledger_changed_by_refused": _goal(f["ledger_changes_by_refused"], "== 0",
                                                f["ledger_changes_by_refused"] == 0),
        "kill9_acked_calls_lost": _goal(k["acked_lost"], "== 0", k["acked_lost"] == 0),
        "kill9_rollouts_not_resumed": _goal(k["resume_failures"] + k["resumed_calls_lost"], "== 0",
                                            k["resume_failures"] + k["resumed_calls_lost"] == 0
                                            and k["rollouts_started"] > 0),
        "soak_lost_calls": _goal(s["lost"], "== 0", s["lost"] == 0),
    }
    results["wall_s"] = round(time.time() - t_start, 1)
    results["quick"] = q
    print(json.dumps({k_: v for k_, v in results.items() if k_ != "goals"}, indent=1))
    print(f"\n{'figure':<34} {'value':>8}  {'goal':<6} result")
    for name, g in results["goals"].items():
        print(f"{name:<34} {g['value']:>8}  {g['goal']:<6} {'MET' if g['met'] else 'MISSED'}")
    print(f"fuzz: {f['requests']} requests, statuses {f['statuses']}, {f['chat_200_distinct_ids']} chat 200s; "
          f"kill -9: {k['acked']} acked before the kill, {k['resumed_ok']}/{k['rollouts_started']} resumed; "
          f"soak: {s['acked']}/{s['expected_calls']} calls at {s['req_per_s']} req/s ({results['wall_s']} s in all)")
    if not q:  # smoke figures never replace the measured ones
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
