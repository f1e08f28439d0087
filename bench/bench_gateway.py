"""Benchmark: the capture gateway's cost over HTTP, against a baseline measured in the same run.

    baseline   the same HTTP stack (Starlette + uvicorn + uvloop, same process setup) whose
               chat-completions route reads the body and returns a fixed `chat.completion` JSON
    gateway    rowgrove's app over a *null engine* (fixed reply tokens, zero logprobs, no model):
               everything the gateway does per call (auth, parse, hash chain, decide, render the
               new part, ledger pending + completed commits, parse the reply, build the response)
               and nothing of the model, so the figure is the gateway's own cost. (The scripted
               engine runs a teacher-forced forward pass per call; it is not used here.)

Each server runs in its own process; the client is a raw asyncio-streams HTTP/1.1 keep-alive
client (httpx tops out near 510 req/s, FACTS.md), one connection per rollout, each rollout a
multi-turn conversation whose every request extends the previous one (a continuation).

Figures (bench/results/gateway.json):
 1. added latency per call: server-side time (Server-Timing, from route entry to response built)
    of gateway minus baseline, p50/p99, at 64 concurrent rollouts and at 1; end-to-end client
    latencies and throughput of both reported beside it. Goal ≤ 0.5 ms p50 / ≤ 3 ms p99.
 2. call 200 vs call 1 of one conversation (sequential, server-side time; median over several
    conversations per turn index). Goal ratio ≤ 1.2.
 3. ledger tokens stored / unique tokens over 100-turn rollouts, against storing the full prompt
    per call. Goal ≤ 1.05.
 4. the deployed path (`deployed_path`): `rowgrove serve --engine vllm` in front of the vLLM
    stand-in on Qwen3's real vocabulary at c=1 and c=32 (bench_deployed.measure): added latency
    p50/p95 over the stand-in's own, the gateway's CPU per call and the stand-in's beside it; the
    null-engine gateway's CPU per call in the same rounds as the floor. Without Qwen3's tokenizer
    one line says so and only the null engine is measured.

    .venv/bin/python bench/bench_gateway.py [--quick]

`--before TREE` measures only the gateway's per-call cost against the source tree TREE (e.g.
`git worktree add /tmp/rowgrove-before <commit>`), side by side in one run
(bench/results/gateway_before_after.json): throughput of one process at 32 and 64 concurrent
rollouts; the server process's CPU time per call (user + system, from /proc, over the timed
calls: all of it, HTTP, validation, hashing, rendering, tokenizing, SQLite, the response; on a
machine other processes share it moves far less than 1000 / req_per_s, the wall time per call of
a saturated process, also kept); server-side and end-to-end p50/p99, and latency at 1. Both
gateways run as `rowgrove serve` runs them (`make_server`). The two trees alternate, three times
each, and the medians are kept (the machine's load drifts: other processes share it).

`--paired TREE [--bursts N]` measures only the CPU per call at 32 concurrent rollouts of TREE's
gateway and this one's, both served at once and driven in N short alternating bursts: the median
of the per-burst ratios (printed, not written) is steadier than whole runs on a drifting host.

`--dialects-before SRC` measures only the cost of the request dialects instead
(bench/results/gateway_dialects.json): the same conversation over Chat Completions on the gateway
of an earlier source tree SRC and on this one, and over the Responses and Messages routes on this
one, side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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

RESULTS = Path(__file__).resolve().parent / "results" / "gateway.json"

CANNED = orjson.dumps({
    "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "reply"}, "logprobs": None,
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
})


# -- servers (run in a child process) -------------------------------------------------------------


class NullEngine:
    """Fixed reply tokens (`reply` + end-of-turn) with zero logprobs: no model, no thread hop."""

    def __init__(self, tokenizer: Any):
        from rowgrove.engines.base import Generation
        from rowgrove.model.load import end_of_turn_id

        self.tokenizer = tokenizer
        ids = list(tokenizer.encode("reply", add_special_tokens=False)) + [end_of_turn_id(tokenizer)]
        self._gen = Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")

    async def generate(self, prompt_ids, sampling, *, hints=None):
        return self._gen

    async def aclose(self) -> None:
        pass


def baseline_app():
    """Starlette app with the gateway's route shapes returning canned JSON (reads the body)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def create(request: Request) -> Response:
        await request.body()
        base = str(request.base_url).rstrip("/")
        return Response(orjson.dumps({"rollout_id": "ro_x", "base_url": f"{base}/rollouts/ro_x/v1",
                                      "api_key": "k"}), 201, media_type="application/json")

    async def chat(request: Request) -> Response:
        t0 = time.perf_counter()
        orjson.loads(await request.body())
        return Response(CANNED, media_type="application/json",
                        headers={"server-timing": f"gw;dur={(time.perf_counter() - t0) * 1000:.3f}"})

    return Starlette(routes=[Route("/v1/rollouts", create, methods=["POST"]),
                             Route("/rollouts/{rid}/v1/chat/completions", chat, methods=["POST"])])


def run_server(kind: str, port: int, ledger: str) -> None:
    """The baseline under plain uvicorn; the gateway as `rowgrove serve` runs it (`make_server`:
    its own HTTP protocol, no proxy-header middleware) over the null engine."""
    import uvicorn

    if kind == "baseline":
        uvicorn.run(baseline_app(), host="127.0.0.1", port=port, loop="uvloop", log_level="warning",
                    access_log=False, backlog=4096)
        return
    from rowgrove.gateway.server import make_server
    from rowgrove.gateway.sessions import GatewaySettings
    from rowgrove.ledger import Ledger
    from rowgrove.model.load import load_tokenizer

    engine = NullEngine(load_tokenizer("tiny"))
    # a real server holds torch + transformers; import them so the collector has their objects
    import torch  # noqa: F401
    import transformers  # noqa: F401

    make_server(engine, Ledger(ledger), port=port, settings=GatewaySettings(
        max_queue=4096, gc_freeze=kind != "gateway-nofreeze")).run()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server in a child process of `script` (default this file): `script --serve KIND PORT
    ARGS...`, returned once its port accepts connections."""

    def __init__(self, kind: str, *args: str, script: str = __file__, env: dict[str, str] | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, script, "--serve", kind, str(self.port), *args],
            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} server did not start") from None
                time.sleep(0.05)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# -- client -----------------------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection: POST JSON, read status, headers and body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        self.r, self.w, self.host = reader, writer, f"127.0.0.1:{port}"

    @classmethod
    async def open(cls, port: int) -> Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return cls(r, w, port)

    async def post(self, path: str, body: bytes, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.w.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{auth}Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        data = await self.r.readexactly(int(headers["content-length"]))
        return status, headers, data

    def close(self) -> None:
        self.w.close()


def _server_ms(headers: dict[str, str]) -> float:
    return float(headers["server-timing"].split("dur=")[1])


SYSTEM = "You are a terse agent."


def _dialect_request(dialect: str, messages: list[dict]) -> tuple[str, bytes]:
    """(route under base_url, body) for one call of `messages` (system first, then user/assistant
    text turns) in `dialect`: the same conversation each way."""
    rest = messages[1:]
    if dialect == "chat":
        return "/chat/completions", orjson.dumps({"model": "m", "messages": messages, "max_tokens": 16})
    if dialect == "responses":
        items = [m if m["role"] == "user" else {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": m["content"], "annotations": []}]} for m in rest]
        return "/responses", orjson.dumps({"model": "m", "instructions": SYSTEM, "input": items,
                                           "max_output_tokens": 16})
    if dialect == "anthropic":
        return "/messages", orjson.dumps({"model": "m", "system": SYSTEM, "messages": rest, "max_tokens": 16})
    raise ValueError(f"unknown dialect {dialect!r}")


def _reply_text(dialect: str, data: bytes) -> str:
    body = orjson.loads(data)
    if dialect == "chat":
        return body["choices"][0]["message"]["content"]
    if dialect == "responses":
        return body["output"][0]["content"][0]["text"]
    return body["content"][0]["text"]


async def conversation(port: int, turns: int, lat: list, srv: list, *, tag: int, dialect: str = "chat") -> None:
    """One rollout: create it, then `turns` calls each extending the last (timed), in `dialect`."""
    conn = await Conn.open(port)
    try:
        status, _, data = await conn.post("/v1/rollouts", orjson.dumps({"group_id": f"g{tag}"}))
        assert status == 201, data
        ro = orjson.loads(data)
        base = urlsplit(ro["base_url"]).path
        messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": f"task {tag}: count to three"}]
        for t in range(turns):
            route, body = _dialect_request(dialect, messages)
            t0 = time.perf_counter()
            status, headers, data = await conn.post(base + route, body, ro["api_key"])
            lat.append((t, (time.perf_counter() - t0) * 1000))
            assert status == 200, data
            srv.append((t, _server_ms(headers)))
            messages = messages + [{"role": "assistant", "content": _reply_text(dialect, data)},
                                   {"role": "user", "content": f"observation {t}: ok, next"}]
    finally:
        conn.close()


async def drive(port: int, rollouts: int, concurrency: int, turns: int, dialect: str = "chat") -> dict[str, Any]:
    lat: list = []
    srv: list = []
    sem = asyncio.Semaphore(concurrency)

    async def one(k: int) -> None:
        async with sem:
            await conversation(port, turns, lat, srv, tag=k, dialect=dialect)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(rollouts)))
    wall = time.perf_counter() - t0
    return {"lat": lat, "srv": srv, "wall_s": wall, "requests": len(lat)}


def _pcts(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {"p50_ms": round(float(np.percentile(a, 50)), 4), "p99_ms": round(float(np.percentile(a, 99)), 4),
            "mean_ms": round(float(a.mean()), 4)}


def _run(kind: str, ledger: str, fn, env: dict[str, str] | None = None, *, pass_server: bool = False) -> Any:
    import uvloop

    server = Server(kind, ledger, env=env)
    try:
        return uvloop.run(fn(server if pass_server else server.port))
    finally:
        server.close()


# -- the three figures ------------------------------------------------------------------------------


def added_latency(concurrency: int, rollouts: int, turns: int, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {"concurrency": concurrency, "rollouts": rollouts, "turns_per_rollout": turns}
    for kind in ("baseline", "gateway"):
        async def go(port: int) -> dict:
            await drive(port, min(rollouts, concurrency), concurrency, 2)  # warm-up
            return await drive(port, rollouts, concurrency, turns)

        res = _run(kind, f"{tmp}/added-{kind}-{concurrency}.db", go)
        out[kind] = {
            "server": _pcts([ms for _, ms in res["srv"]]),
            "end_to_end": _pcts([ms for _, ms in res["lat"]]),
            "req_per_s": round(res["requests"] / res["wall_s"], 1),
        }
    b, g = out["baseline"], out["gateway"]
    out["added_server_p50_ms"] = round(g["server"]["p50_ms"] - b["server"]["p50_ms"], 4)
    out["added_server_p99_ms"] = round(g["server"]["p99_ms"] - b["server"]["p99_ms"], 4)
    out["added_end_to_end_p50_ms"] = round(g["end_to_end"]["p50_ms"] - b["end_to_end"]["p50_ms"], 4)
    out["added_end_to_end_p99_ms"] = round(g["end_to_end"]["p99_ms"] - b["end_to_end"]["p99_ms"], 4)
    out["added_cpu_ms_per_call"] = round(1000 / g["req_per_s"] - 1000 / b["req_per_s"], 4) if concurrency > 1 else None
    return out


def gc_freeze_effect(concurrency: int, rollouts: int, turns: int, tmp: str) -> dict[str, Any]:
    """The gateway with its start-up objects frozen out of the collector (the default) against
    the same gateway without, side by side: server-side p50/p99 and throughput."""
    out: dict[str, Any] = {"concurrency": concurrency, "rollouts": rollouts, "turns_per_rollout": turns}
    for kind in ("gateway-nofreeze", "gateway"):
        async def go(port: int) -> dict:
            await drive(port, min(rollouts, concurrency), concurrency, 2)  # warm-up
            return await drive(port, rollouts, concurrency, turns)

        res = _run(kind, f"{tmp}/gc-{kind}.db", go)
        out["frozen" if kind == "gateway" else "not_frozen"] = {
            "server": _pcts([ms for _, ms in res["srv"]]),
            "end_to_end": _pcts([ms for _, ms in res["lat"]]),
            "req_per_s": round(res["requests"] / res["wall_s"], 1),
        }
    f, n = out["frozen"], out["not_frozen"]
    out["p99_end_to_end_frozen_over_not_ratio"] = round(f["end_to_end"]["p99_ms"] / n["end_to_end"]["p99_ms"], 3)
    out["throughput_frozen_over_not_ratio"] = round(f["req_per_s"] / n["req_per_s"], 3)
    return out


def long_conversation(turns: int, repeats: int, tmp: str) -> dict[str, Any]:
    async def go(port: int) -> dict:
        await drive(port, 1, 1, 3)  # warm-up
        return await drive(port, repeats, 1, turns)

    res = _run("gateway", f"{tmp}/long.db", go)
    by_turn = np.full((repeats, turns), np.nan)
    counts = [0] * turns
    for t, ms in res["srv"]:
        by_turn[counts[t], t] = ms
        counts[t] += 1
    med = np.nanmedian(by_turn, axis=0)
    window = 10
    first = float(med[1:1 + window].mean())   # continuations 2..11
    last = float(med[turns - window:].mean())  # the last ten calls
    return {
        "turns": turns, "repeats": repeats,
        "call_1_ms": round(float(med[0]), 4),
        f"calls_2_to_{1 + window}_ms": round(first, 4),
        f"calls_{turns - window + 1}_to_{turns}_ms": round(last, 4),
        f"call_{turns}_over_call_1": round(float(med[-1] / med[0]), 3),
        "last10_over_first10_continuations": round(last / first, 3),
        "median_ms_by_turn_every_20": [round(float(x), 4) for x in med[::20]],
    }


def storage(turns: int, rollouts: int, tmp: str) -> dict[str, Any]:
    from rowgrove.ledger import Ledger

    path = f"{tmp}/storage.db"
    _run("gateway", path, lambda port: drive(port, rollouts, rollouts, turns))
    stored = unique = full = 0
    with Ledger(path, readonly=True) as led:
        for ro in led.rollouts():
            calls = led.calls(ro.id)
            stored += sum(len(c.prompt_ids) + len(c.sampled_ids) for c in calls)
            full += sum(c.prompt_len + len(c.sampled_ids) for c in calls)
            last = calls[-1]
            unique += last.prompt_len + len(last.sampled_ids)  # a linear conversation: its final context
            assert all(not c.root for c in calls[1:]), "every later turn should be a continuation"
    return {"turns": turns, "rollouts": rollouts, "stored_tokens": stored, "unique_tokens": unique,
            "full_prompt_per_call_tokens": full, "stored_over_unique": round(stored / unique, 4),
            "full_prompt_over_unique": round(full / unique, 2)}


DIALECT_RUNS = (("chat", "before"), ("chat", "after"), ("responses", "after"), ("anthropic", "after"))


def dialect_cost(before_src: str, concurrency: int, rollouts: int, turns: int, tmp: str) -> dict[str, Any]:
    """Per-call server-side cost of the same conversation: over Chat Completions on the gateway
    built from `before_src` (a source tree from before the request models and dialects) and on
    this one, and over the Responses and Messages routes on this one; side by side in one run,
    ratios against Chat before."""
    out: dict[str, Any] = {"concurrency": concurrency, "rollouts": rollouts, "turns_per_rollout": turns}
    for dialect, tree in DIALECT_RUNS:
        async def go(port: int) -> dict:
            await drive(port, min(rollouts, concurrency), concurrency, 2, dialect)  # warm-up
            return await drive(port, rollouts, concurrency, turns, dialect)

        env = {"PYTHONPATH": before_src} if tree == "before" else None
        res = _run("gateway", f"{tmp}/dialect-{dialect}-{tree}-{concurrency}.db", go, env=env)
        out[f"{dialect}_{tree}"] = {"server": _pcts([ms for _, ms in res["srv"]]),
                                    "end_to_end": _pcts([ms for _, ms in res["lat"]]),
                                    "req_per_s": round(res["requests"] / res["wall_s"], 1)}
    base = out["chat_before"]
    for dialect, tree in DIALECT_RUNS[1:]:
        x = out[f"{dialect}_{tree}"]
        out[f"{dialect}_{tree}_over_chat_before"] = {
            "server_p50": round(x["server"]["p50_ms"] / base["server"]["p50_ms"], 3),
            "server_p99": round(x["server"]["p99_ms"] / base["server"]["p99_ms"], 3),
            "req_per_s": round(x["req_per_s"] / base["req_per_s"], 3)}
    return out


def probe_parse(turns: int, number: int) -> dict[str, float]:
    """`--probe-parse TURNS`, run in a child process over whichever source tree is on its path:
    microseconds per call (best of 5 repeats) to check and translate a request of TURNS
    user/assistant turns, for each dialect the tree has (the Responses and Messages ones with and
    without the rollout's memo of checked items, warmed by the same request)."""
    import timeit

    try:
        from rowgrove.gateway.dialects.openai_format import parse_chat_request
    except ImportError:  # a tree from before the dialects package
        from rowgrove.gateway.openai_format import parse_chat_request

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "task 0: count to three"}]
    for t in range(turns):
        messages += [{"role": "assistant", "content": "reply"}, {"role": "user", "content": f"observation {t}: ok"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = dict(orjson.loads(_dialect_request("chat", messages)[1]), tools=tools)
    cases: dict[str, Any] = {"chat": lambda: parse_chat_request(chat, default_max_tokens=16)}
    try:
        from rowgrove.gateway.dialects.anthropic_api import parse_messages_request
        from rowgrove.gateway.dialects.responses_api import parse_responses_request
    except ImportError:
        try:
            from rowgrove.gateway.anthropic_api import parse_messages_request
            from rowgrove.gateway.responses_api import parse_responses_request
        except ImportError:
            parse_messages_request = None
    if parse_messages_request is None:
        pass
    else:
        resp = orjson.loads(_dialect_request("responses", messages)[1])
        anth = orjson.loads(_dialect_request("anthropic", messages)[1])
        memo_r: dict = {}
        memo_a: dict = {}
        cases["responses_cold"] = lambda: parse_responses_request(resp, default_max_tokens=16)
        cases["responses_memo"] = lambda: parse_responses_request(resp, default_max_tokens=16, memo=memo_r)
        cases["anthropic_cold"] = lambda: parse_messages_request(anth, default_max_tokens=16)
        cases["anthropic_memo"] = lambda: parse_messages_request(anth, default_max_tokens=16, memo=memo_a)
    out = {}
    for name, fn in cases.items():
        fn()
        out[name] = round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 2)
    return out


def parse_cost(before_src: str, turns: tuple[int, ...], number: int) -> dict[str, Any]:
    """Checking and translating one request, in-process (no HTTP, no ledger, no rendering), for the
    tree before and this one, side by side: steadier than the HTTP figures on a shared machine."""
    out: dict[str, Any] = {"unit": "microseconds per call, best of 5 repeats", "calls_per_repeat": number}
    for n in turns:
        row: dict[str, Any] = {}
        for tree, path in (("before", before_src), ("after", str(Path(__file__).resolve().parents[1] / "src"))):
            res = subprocess.run([sys.executable, __file__, "--probe-parse", str(n), str(number)], check=True,
                                 capture_output=True, env=dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1"))
            row[tree] = orjson.loads(res.stdout.splitlines()[-1])
        row["chat_after_over_before"] = round(row["after"]["chat"] / row["before"]["chat"], 3)
        for k in ("responses_memo", "anthropic_memo"):
            row[f"{k}_over_chat_before"] = round(row["after"][k] / row["before"]["chat"], 3)
        out[f"{n}_turns"] = row
    return out


def deployed(quick: bool, tmp: str) -> dict[str, Any]:
    """The deployed path (bench_deployed.measure): this tree's `rowgrove serve --engine vllm` in
    front of the vLLM stand-in on Qwen3's real vocabulary at c=1 and c=32, and in the same rounds
    the null-engine gateway (the floor; this file's conversation, text turns, on the tiny
    vocabulary) with its CPU per call read the same way (all its threads, /proc schedstat).
    Without Qwen3's tokenizer: one line saying so, and the null engine only."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_deployed as bdp

    rounds, c1_convs, c32 = (1, 2, 8) if quick else (7, 4, 32)
    turns = bdp.CALLS
    null = Server("gateway", f"{tmp}/deployed-null.db")
    floor: dict[str, list] = {"c1": [], "c32": []}

    def null_round(_r: int) -> None:
        for c, convs, conc in (("c1", c1_convs, 1), ("c32", c32, c32)):
            c0 = bdp.bl.cpu_ns(null.proc.pid)
            res = asyncio.run(drive(null.port, convs, conc, turns))
            floor[c].append(((bdp.bl.cpu_ns(null.proc.pid) - c0) / 1e6 / res["requests"],
                             res["requests"] / res["wall_s"], [ms for _, ms in res["srv"]]))

    out: dict[str, Any] = {"rounds": rounds, "calls_per_conversation": turns,
                           "conversations": {"c1": f"{c1_convs} one after the other", "c32": f"{c32} at once"}}
    try:
        asyncio.run(drive(null.port, 4, 4, 2))  # warm-up
        why = bdp.qwen3_absent()
        if why is not None:
            print(f"deployed path not measured: {why}; the null engine only", flush=True)
            out["deployed_vllm_qwen3"] = None
            out["deployed_skipped"] = why
            for r in range(rounds):
                null_round(r)
        else:
            out["deployed_vllm_qwen3"] = bdp.measure({"gateway": None}, tmp, rounds, c1_convs, c32,
                                                     extra=null_round)["gateway"]
    finally:
        null.close()
    out["null_engine_floor"] = {c: {
        "gateway_cpu_ms_per_call": round(float(np.median([x[0] for x in floor[c]])), 3),
        **({"req_per_s": round(float(np.median([x[1] for x in floor[c]])))} if c == "c32" else {}),
        "server_p50_ms": round(float(np.percentile([m for x in floor[c] for m in x[2]], 50)), 3),
        "server_p95_ms": round(float(np.percentile([m for x in floor[c] for m in x[2]], 95)), 3),
    } for c in ("c1", "c32")}
    d = out["deployed_vllm_qwen3"]
    if d is not None:
        for c in ("c1", "c32"):
            out[f"deployed_over_null_cpu_ratio_{c}"] = round(
                d[c]["gateway_cpu_ms_per_call"] / out["null_engine_floor"][c]["gateway_cpu_ms_per_call"], 2)
    return out


def _tree_src(flag: str, tree: str) -> str:
    """The `src` folder of the source tree `tree` given to `flag`; SystemExit naming it if none."""
    src = str(Path(tree).resolve() / "src")
    if not (Path(src) / "rowgrove" / "gateway" / "app.py").is_file():
        raise SystemExit(f"{flag} {tree}: not a source tree with src/rowgrove in it "
                         "(e.g. git worktree add /tmp/rowgrove-before <commit>)")
    return src


def before_after(tree: str, quick: bool, out: str | None = None) -> dict[str, Any]:
    """`--before TREE`: the gateway of TREE and of this tree, alternating (module docstring)."""
    src = _tree_src("--before", tree)
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_at_start": round(os.getloadavg()[0], 2)},
        "engine": "null (fixed tokens, zero logprobs): the figures are the gateway's own cost",
        "before": tree, "conversation": "this file's: a system prompt, then user/assistant text turns",
    }
    shapes = ((32, 64 if quick else 128, 4 if quick else 16), (64, 64 if quick else 128, 4 if quick else 16),
              (1, 4 if quick else 16, 8 if quick else 32))
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-ba-") as tmp:
        for conc, rollouts, turns in shapes:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for rnd in range(3):
                for label in ("before", "after"):
                    async def go(server: Server) -> dict:
                        await drive(server.port, min(rollouts, conc), conc, 2)  # warm-up
                        cpu = server.cpu_s()
                        res = await drive(server.port, rollouts, conc, turns)
                        res["cpu_ms_per_call"] = (server.cpu_s() - cpu) * 1000 / res["requests"]
                        return res

                    env = {"PYTHONPATH": src} if label == "before" else None
                    res = _run("gateway", f"{tmp}/ba-{label}-{conc}-{rnd}.db", go, env=env, pass_server=True)
                    runs[label].append({"server": _pcts([ms for _, ms in res["srv"]]),
                                        "end_to_end": _pcts([ms for _, ms in res["lat"]]),
                                        "req_per_s": res["requests"] / res["wall_s"],
                                        "cpu_ms_per_call": res["cpu_ms_per_call"]})
            row: dict[str, Any] = {"concurrency": conc, "rollouts": rollouts, "turns_per_rollout": turns}
            for label, rs in runs.items():
                rps = float(np.median([r["req_per_s"] for r in rs]))
                row[label] = {
                    "req_per_s": round(rps, 1),
                    "wall_ms_per_call": round(1000 / rps, 4) if conc > 1 else None,
                    "cpu_ms_per_call": round(float(np.median([r["cpu_ms_per_call"] for r in rs])), 4),
                    "server_p50_ms": round(float(np.median([r["server"]["p50_ms"] for r in rs])), 4),
                    "server_p99_ms": round(float(np.median([r["server"]["p99_ms"] for r in rs])), 4),
                    "end_to_end_p50_ms": round(float(np.median([r["end_to_end"]["p50_ms"] for r in rs])), 4),
                    "end_to_end_p99_ms": round(float(np.median([r["end_to_end"]["p99_ms"] for r in rs])), 4),
                }
            row["throughput_after_over_before"] = round(row["after"]["req_per_s"] / row["before"]["req_per_s"], 3)
            row["cpu_after_over_before"] = round(row["after"]["cpu_ms_per_call"] / row["before"]["cpu_ms_per_call"], 3)
            results[f"c{conc}"] = row
            print(f"c={conc}: req/s before {row['before']['req_per_s']} after {row['after']['req_per_s']}; "
                  f"server CPU ms/call before {row['before']['cpu_ms_per_call']} after {row['after']['cpu_ms_per_call']}; "
                  f"e2e p99 before {row['before']['end_to_end_p99_ms']} after {row['after']['end_to_end_p99_ms']} ms",
                  flush=True)
    results["load_avg_at_end"] = round(os.getloadavg()[0], 2)
    results["quick"] = quick
    print(json.dumps(results, indent=1))
    if not quick:
        path = Path(out) if out else RESULTS.parent / "gateway_before_after.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def dialects_main(before_src: str, quick: bool) -> dict[str, Any]:
    """`--dialects-before SRC`: only the dialect figure (bench/results/gateway_dialects.json)."""
    src = str(Path(before_src).resolve())
    if not (Path(src) / "rowgrove" / "gateway" / "app.py").is_file():
        raise SystemExit(f"--dialects-before {before_src}: not a source tree with rowgrove/ in it "
                         "(e.g. git archive <commit> src | tar -x -C /some/dir, then pass /some/dir/src)")
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-dialects-") as tmp:
        results = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "load_avg_at_start": os.getloadavg()[0]},
            "engine": "null (fixed tokens, zero logprobs): the figures are the gateway's own cost",
            "before": "the gateway from the source tree given as --dialects-before",
            "parse": parse_cost(src, (2, 30, 100), 200 if quick else 2000),
            "c64": dialect_cost(src, 64, 64 if quick else 128, 4 if quick else 16, tmp),
            "c1": dialect_cost(src, 1, 4 if quick else 16, 8 if quick else 32, tmp),
        }
    print(json.dumps(results, indent=1))
    for n, row in results["parse"].items():
        if n.endswith("_turns"):
            print(f"parse+translate at {n}: chat before {row['before']['chat']} us, after {row['after']['chat']} us; "
                  f"responses {row['after']['responses_memo']} us, anthropic {row['after']['anthropic_memo']} us "
                  "(with the rollout's memo)")
    for c in ("c64", "c1"):
        r = results[c]
        print(f"{c}: server p50 ms  chat before {r['chat_before']['server']['p50_ms']:.3f}  "
              + "  ".join(f"{d} {t} {r[f'{d}_{t}']['server']['p50_ms']:.3f}" for d, t in DIALECT_RUNS[1:]))
    results["quick"] = quick
    if not quick:
        path = RESULTS.parent / "gateway_dialects.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def paired(tree: str, bursts: int, quick: bool) -> dict[str, Any]:
    """`--paired TREE`: the CPU per call at 32 concurrent rollouts of TREE's gateway and this
    one's, both served at once and driven in short alternating bursts (64 rollouts of 16 calls;
    the order flips each burst). The host's speed drifts within minutes on these machines; two
    bursts seconds apart see nearly the same host, so the median of the per-burst ratios moves
    far less than whole runs do. Prints the figures; writes nothing."""
    src = _tree_src("--paired", tree)
    rollouts, n = (16, min(bursts, 4)) if quick else (64, bursts)
    per: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-pair-") as tmp:
        servers = {"before": Server("gateway", f"{tmp}/before.db", env={"PYTHONPATH": src}),
                   "after": Server("gateway", f"{tmp}/after.db")}

        async def go() -> None:
            for server in servers.values():
                await drive(server.port, 64, 32, 2)  # warm-up
            for k in range(n):
                for label in ("before", "after") if k % 2 == 0 else ("after", "before"):
                    server = servers[label]
                    cpu = server.cpu_s()
                    res = await drive(server.port, rollouts, 32, 16)
                    per[label].append((server.cpu_s() - cpu) * 1000 / res["requests"])

        import uvloop

        try:
            uvloop.run(go())
        finally:
            for server in servers.values():
                server.close()
    ratios = [a / b for a, b in zip(per["after"], per["before"], strict=True)]
    out = {"bursts": n, "rollouts_per_burst": rollouts, "before": tree,
           "cpu_ms_per_call_before": round(float(np.median(per["before"])), 4),
           "cpu_ms_per_call_after": round(float(np.median(per["after"])), 4),
           "after_over_before_median": round(float(np.median(ratios)), 3),
           "after_over_before_quartiles": [round(float(q), 3) for q in np.percentile(ratios, [25, 75])],
           "quick": quick}
    print(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--dialects-before", metavar="SRC",
                   help="only the dialect figure: Chat on the gateway in source tree SRC against Chat, "
                        "Responses and Messages on this one")
    p.add_argument("--before", metavar="TREE",
                   help="only the per-call cost: the gateway of source tree TREE against this one, alternating")
    p.add_argument("--paired", metavar="TREE",
                   help="only the CPU per call at c=32: TREE's gateway and this one's served at once, in short "
                        "alternating bursts; prints the median per-burst ratio (writes nothing)")
    p.add_argument("--bursts", type=int, default=40, help="with --paired: how many bursts of each (default 40)")
    p.add_argument("--out", metavar="FILE", help="with --before: where the figures go "
                   "(default bench/results/gateway_before_after.json)")
    p.add_argument("--serve", nargs=3, metavar=("KIND", "PORT", "LEDGER"), help=argparse.SUPPRESS)
    p.add_argument("--probe-parse", nargs=2, type=int, metavar=("TURNS", "NUMBER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe_parse:
        print(json.dumps(probe_parse(*args.probe_parse)))
        return {}
    if args.serve:
        run_server(args.serve[0], int(args.serve[1]), args.serve[2])
        return {}
    if args.dialects_before:
        return dialects_main(args.dialects_before, args.quick)
    if args.before:
        return before_after(args.before, args.quick, args.out)
    if args.paired:
        return paired(args.paired, args.bursts, args.quick)
    q = args.quick
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-gw-") as tmp:
        results = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "load_avg_at_start": os.getloadavg()[0]},
            "engine": "null (fixed tokens, zero logprobs): the figures are the gateway's own cost",
            "client": "raw asyncio-streams HTTP/1.1 keep-alive, one connection per rollout",
            "added_latency_c64": added_latency(64, 64 if q else 128, 4 if q else 16, tmp),
            "added_latency_c1": added_latency(1, 4 if q else 16, 8 if q else 32, tmp),
            "gc_freeze_c64": gc_freeze_effect(64, 64 if q else 128, 4 if q else 16, tmp),
            "call_200_vs_call_1": long_conversation(60 if q else 200, 2 if q else 5, tmp),
            "storage_100_turns": storage(30 if q else 100, 4 if q else 8, tmp),
            "deployed_path": deployed(q, tmp),
        }
    c64, c1, long_, st = (results[k] for k in ("added_latency_c64", "added_latency_c1", "call_200_vs_call_1",
                                               "storage_100_turns"))
    print(json.dumps(results, indent=1))
    print(f"added server-side latency at 64 concurrent rollouts: p50 {c64['added_server_p50_ms']:.3f} ms, "
          f"p99 {c64['added_server_p99_ms']:.3f} ms (goal <= 0.5 / 3 ms)")
    gcf = results["gc_freeze_c64"]
    print(f"gc.freeze at 64 concurrent: end-to-end p99 {gcf['frozen']['end_to_end']['p99_ms']:.1f} ms frozen vs "
          f"{gcf['not_frozen']['end_to_end']['p99_ms']:.1f} ms not; throughput {gcf['frozen']['req_per_s']} vs "
          f"{gcf['not_frozen']['req_per_s']} req/s")
    print(f"added server-side latency at 1: p50 {c1['added_server_p50_ms']:.3f} ms, p99 {c1['added_server_p99_ms']:.3f} ms; "
          f"throughput at 64: gateway {c64['gateway']['req_per_s']} vs baseline {c64['baseline']['req_per_s']} req/s")
    print(f"call {long_['turns']} / call 1: {next(v for k, v in long_.items() if k.endswith('_over_call_1'))}; "
          f"last 10 / first 10 continuations: {long_['last10_over_first10_continuations']} (goal <= 1.2)")
    print(f"ledger stored / unique tokens: {st['stored_over_unique']} (goal <= 1.05); "
          f"full prompt per call would be {st['full_prompt_over_unique']}x")
    dp = results["deployed_path"]
    for c in ("c1", "c32"):
        fl, d = dp["null_engine_floor"][c], dp["deployed_vllm_qwen3"]
        line = f"{c}: null engine (floor) CPU {fl['gateway_cpu_ms_per_call']} ms/call"
        if d is not None:
            line += (f"; --engine vllm on Qwen3: gateway CPU {d[c]['gateway_cpu_ms_per_call']} ms/call "
                     f"(stand-in's own {d[c]['standin_cpu_ms_per_call']}), added p50 {d[c]['added_p50_ms']} / "
                     f"p95 {d[c]['added_p95_ms']} ms over the stand-in's own {d[c]['standin_p50_ms']} ms")
            if c == "c32":
                line += f", {d[c]['req_per_s']} req/s"
        print(line)
    results["quick"] = q
    if not q:  # smoke figures never replace the measured ones
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
