"""Benchmark: the gateway's own time per call along one long agent conversation, in front of an
instant fake vLLM, call 200 against call 1 (goal: ratio <= 2).

Three processes, as a user runs them:
    fake vLLM   rowgrove's vLLM stand-in (`rowgrove.standins.vllm`: vLLM's wire format, the prompt
                ids echoed as vLLM echoes them) over an engine that answers at once with one tool
                call (no model compute); it times each /v1/completions request from the moment
                its ASGI app is called to its last body byte, by X-Request-Id (the gateway's call id)
    gateway     `python -m rowgrove serve --engine vllm --engine-url <fake>` (its own HTTP protocol)
    client      this process: one rollout, 200 chat completions of one agent conversation, each
                extending the last (bench/bench_decide.py's: a system prompt, two tools, per call an
                assistant tool call answered by a ~600-byte tool result, every fifth round a user
                message too; ~88k prompt tokens at call 200 on the tiny ChatML model)

For each call: the gateway's own time = its Server-Timing (`gw;dur`, route entry to response
built) minus the fake vLLM's time for that call's request. So it counts everything the gateway
does around the engine, its engine client included (writing the prompt ids, reading the answer).
Before the measured rollout a short warm-up rollout runs, so call 1 is not the process's first.
The model folder is the tiny ChatML model with a 128k context (its config says 8k; only the
rendering and the tokenizer are used).

`--before TREE` runs the gateway of an older source tree (its src/ imported; e.g.
`git worktree add /tmp/rg-before <commit>`) and of this one alternately, `--rounds` times each
(default 3), against the same fake vLLM; the per-round ratios and their spread are reported,
with the 1-minute load average. Results: bench/results/long_conversation.json (`--out` elsewhere;
never written with `--quick`).

    .venv/bin/python bench/bench_long_conversation.py [--before TREE] [--calls 200] [--rounds 3] [--quick]
        [--family qwen3]   (Qwen3's real vocabulary and template; results to --out)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "long_conversation.json"
CONTEXT = 131072


def _bench_decide():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rowgrove_bench_decide_shared", HERE / "bench_decide.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


bd = _bench_decide()


# -- the fake vLLM (a child process) ----------------------------------------------------------------


class InstantToolEngine:
    """Answers every request at once with one `read_file` tool call (its path named after the
    prompt's length, so each call's reply differs) and the end-of-turn id; zero logprobs."""

    def __init__(self, tokenizer: Any):
        from rowgrove.model.load import end_of_turn_id, stop_token_ids

        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        self.eot = end_of_turn_id(tokenizer)
        self.weights_version = 0

    async def generate(self, prompt_ids, sampling, *, hints=None):  # type: ignore[no-untyped-def]
        from rowgrove.engines.base import Generation
        from rowgrove.toolcalls import format_assistant_text

        text = format_assistant_text(None, [("read_file", {"path": f"src/module_{len(prompt_ids)}.py"})])
        ids = (list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eot])[: sampling.max_tokens]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                          weight_versions=[0] * len(ids))

    async def aclose(self) -> None:
        pass


def timed(app: Any, times: dict[str, float]) -> Any:
    """`app` with each /v1/completions request timed (ms, from the call of the app to its last
    body message, by X-Request-Id) and `GET /_bench/engine_times` answering them."""
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if scope["path"] == "/_bench/engine_times":
            body = orjson.dumps(times)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return None
        if scope["path"] != "/v1/completions":
            return await app(scope, receive, send)
        t0 = time.perf_counter()
        rid = dict(scope["headers"]).get(b"x-request-id", b"").decode()

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                times[rid] = (time.perf_counter() - t0) * 1000

        return await app(scope, receive, timed_send)

    return wrapped


def serve_engine(port: int, folder: str) -> None:
    import uvicorn

    from rowgrove.model.load import load_tokenizer
    from rowgrove.standins.common import StandinState
    from rowgrove.standins.vllm import create_app

    class Quiet(StandinState):
        """The stand-in's state without its request log (it keeps every body it saw)."""

        def begin_generation(self, request_id, route, prompt, fault):  # type: ignore[no-untyped-def]
            return {"token_ids": [], "logprobs": [], "top_logprobs": [], "weight_versions": []}

    state = Quiet()
    state.requests = _Drop()  # type: ignore[assignment]
    app = create_app(InstantToolEngine(load_tokenizer(folder)), folder, state, segment=1 << 20,
                     max_model_len=CONTEXT, served_model_name="tiny-long")
    uvicorn.run(timed(app, {}), host="127.0.0.1", port=port, loop="uvloop", log_level="warning",
                access_log=False)


class _Drop(list):
    def append(self, item: Any) -> None:  # noqa: D102 - a log that keeps nothing
        pass


# -- processes --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process serving HTTP on `port`, returned once `GET path` answers 200."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str], ready: str = "/health"):
        self.port = port
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(f"GET {ready} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    if s.recv(64).split(b" ")[1:2] == [b"200"]:
                        break
            except (OSError, IndexError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(cmd[:4])} did not start")
            time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def long_model(tmp: Path, family: str | None = None) -> str:
    """The tiny ChatML model's folder, or with `family` the tiny model of that family of
    tests/families.py on its real tokenizer (e.g. qwen3: Qwen3's template and vocabulary), with a
    context of CONTEXT tokens."""
    from rowgrove.model.load import model_dir

    out = tmp / "tiny-long"
    if family is None:
        shutil.copytree(model_dir("tiny"), out)
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from families import family_model_dir

        shutil.copytree(family_model_dir(family, vocab="real"), out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = CONTEXT
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if src is not None:
        env["PYTHONPATH"] = src
    return env


def start_gateway(src: str | None, folder: str, engine_url: str, ledger: str) -> Proc:
    port = _free_port()
    cmd = [sys.executable, "-m", "rowgrove", "serve", "--engine", "vllm", "--engine-url", engine_url,
           "--model", folder, "--served-model-name", "tiny-long", "--ledger", ledger, "--port", str(port),
           "--max-body-bytes", str(64 << 20), "--log-level", "warning"]
    return Proc(cmd, port, _env(src))


# -- the client -------------------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection: GET/POST JSON, read status, headers and body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        self.r, self.w, self.host = reader, writer, f"127.0.0.1:{port}"

    @classmethod
    async def open(cls, port: int) -> Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        return cls(r, w, port)

    async def request(self, method: str, path: str, body: bytes = b"",
                      key: str | None = None) -> tuple[int, dict[str, str], bytes]:
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.w.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{auth}Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        data = await self.r.readexactly(int(headers["content-length"]))
        return status, headers, data

    def close(self) -> None:
        self.w.close()


def cpu_ns(pid: int) -> int:
    """CPU time (ns) the process `pid` has used so far, all its threads (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return total


async def conversation(port: int, calls: int, tag: str, pid: int | None = None) -> list[dict[str, Any]]:
    """One rollout of `calls` agent calls (bench_decide's conversation, replies as the gateway
    answered them); per call: call id, Server-Timing ms, end-to-end ms, prompt tokens, request
    bytes, and with `pid` the CPU time that process used over the call."""
    conn = await Conn.open(port)
    out: list[dict[str, Any]] = []
    try:
        status, _, data = await conn.request("POST", "/v1/rollouts", orjson.dumps({"group_id": tag}))
        assert status == 201, data
        ro = orjson.loads(data)
        path = urlsplit(ro["base_url"]).path + "/chat/completions"
        msgs: list[dict[str, Any]] = [{"role": "system", "content": bd.SYSTEM},
                                      {"role": "user", "content": "fix the bug in f"}]
        for k in range(calls):
            body = orjson.dumps({"model": "tiny-long", "messages": msgs, "tools": bd.TOOLS, "max_tokens": 64,
                                 "temperature": 1.0})
            c0 = cpu_ns(pid) if pid is not None else 0
            t0 = time.perf_counter()
            status, headers, data = await conn.request("POST", path, body, ro["api_key"])
            e2e = (time.perf_counter() - t0) * 1000
            cpu = (cpu_ns(pid) - c0) / 1e6 if pid is not None else None
            assert status == 200, data[:500]
            reply = orjson.loads(data)
            message = reply["choices"][0]["message"]
            assert message.get("tool_calls"), f"call {k + 1}: no tool call in {message}"
            out.append({"call_id": reply["id"], "server_ms": float(headers["server-timing"].split("dur=")[1]),
                        "e2e_ms": e2e, "cpu_ms": cpu, "prompt_tokens": reply["usage"]["prompt_tokens"], "request_bytes": len(body)})
            msgs.append(message)
            msgs.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": f"{k}\n{bd.RESULT}"})
            if k % 5 == 4:
                msgs.append({"role": "user", "content": f"keep going, round {k}"})
        status, _, data = await conn.request("GET", f"/v1/rollouts/{ro['rollout_id']}")
        lineage = orjson.loads(data) if status == 200 else {}
        roots = [c for c in lineage.get("calls", []) if not c.get("parent_id")]
        if len(roots) != 1:
            raise SystemExit(f"{len(roots)} roots in the measured rollout: the conversation did not continue")
    finally:
        conn.close()
    return out


async def _engine_times(port: int) -> dict[str, float]:
    conn = await Conn.open(port)
    try:
        _, _, data = await conn.request("GET", "/_bench/engine_times")
    finally:
        conn.close()
    return orjson.loads(data)


def one_run(src: str | None, folder: str, engine: Proc, ledger: str, calls: int, conversations: int) -> dict[str, Any]:
    """A fresh gateway process (of `src`, None: this tree): a warm-up rollout, then `conversations`
    measured ones; per call index the median over them."""
    gw = start_gateway(src, folder, f"http://127.0.0.1:{engine.port}", ledger)
    try:
        load = os.getloadavg()[0]
        asyncio.run(conversation(gw.port, 5, "warm-up"))
        convs = [asyncio.run(conversation(gw.port, calls, f"measured-{k}", gw.proc.pid)) for k in range(conversations)]
        times = asyncio.run(_engine_times(engine.port))
    finally:
        gw.close()
    for conv in convs:
        for c in conv:
            c["engine_ms"] = times[c["call_id"]]
            c["own_ms"] = c["server_ms"] - c["engine_ms"]
    med = [{key: statistics.median(conv[k][key] for conv in convs)
            for key in ("own_ms", "cpu_ms", "server_ms", "engine_ms", "prompt_tokens", "request_bytes")}
           for k in range(calls)]
    return {"load_avg_1min": round(load, 2), "calls": med}


def summary(run: dict[str, Any]) -> dict[str, Any]:
    calls = run["calls"]
    own = [c["own_ms"] for c in calls]
    cpu = [c["cpu_ms"] for c in calls]
    late, late_cpu = statistics.median(own[-5:]), statistics.median(cpu[-5:])
    # call 10 as the last calls are read: the median of the five calls around it (8-12)
    cpu_10 = statistics.median(cpu[7:12]) if len(cpu) >= 12 else cpu[-1]
    return {
        "load_avg_1min": run["load_avg_1min"],
        "prompt_tokens_call_1": calls[0]["prompt_tokens"], "prompt_tokens_last": calls[-1]["prompt_tokens"],
        "request_bytes_last": calls[-1]["request_bytes"],
        "own_ms_call_1": round(own[0], 3),
        "own_ms_calls_2_6": round(statistics.median(own[1:6]), 3),
        "own_ms_last_5": round(late, 3),
        "ratio_last_vs_call_1": round(late / own[0], 2),
        "cpu_ms_call_1": round(cpu[0], 3),
        "cpu_ms_last_5": round(late_cpu, 3),
        "cpu_ratio_last_vs_call_1": round(late_cpu / cpu[0], 2),
        "cpu_ms_call_10": round(cpu_10, 3),
        "cpu_ratio_last_vs_call_10": round(late_cpu / cpu_10, 2),
        "prompt_tokens_call_10": calls[min(9, len(calls) - 1)]["prompt_tokens"],
        "server_ms_last_5": round(statistics.median(c["server_ms"] for c in calls[-5:]), 3),
        "engine_ms_last_5": round(statistics.median(c["engine_ms"] for c in calls[-5:]), 3),
        "own_ms_by_call": [round(x, 3) for x in own],
        "cpu_ms_by_call": [round(x, 3) for x in cpu],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=None, help="an older source tree to run side by side (its src/ is imported)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=3, help="measured conversations per gateway process")
    ap.add_argument("--family", default=None, help="a family of tests/families.py on its real tokenizer "
                    "(e.g. qwen3: Qwen3's vocabulary); default the tiny ChatML model")
    ap.add_argument("--quick", action="store_true", help="40 calls, one round (smoke check; nothing written)")
    ap.add_argument("--out", default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--serve-engine", nargs=2, metavar=("PORT", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_engine:
        serve_engine(int(args.serve_engine[0]), args.serve_engine[1])
        return {}
    if args.quick:
        args.calls, args.rounds, args.conversations = min(args.calls, 40), 1, 1
    before_src = None
    if args.before:
        before_src = str(Path(args.before).resolve() / "src")
        if not (Path(before_src) / "rowgrove" / "gateway" / "app.py").is_file():
            raise SystemExit(f"--before {args.before}: not a source tree with src/rowgrove in it "
                             "(e.g. git worktree add /tmp/rg-before <commit>)")
    labels = ("before", "after") if before_src else ("after",)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-long-") as tmp:
        folder = long_model(Path(tmp), args.family)
        port = _free_port()
        engine = Proc([sys.executable, __file__, "--serve-engine", str(port), folder], port, _env(None),
                      ready="/health")
        try:
            for rnd in range(args.rounds):
                for label in labels:
                    src = before_src if label == "before" else str(ROOT / "src")
                    s = summary(one_run(src, folder, engine, f"{tmp}/{label}-{rnd}.db", args.calls,
                                              args.conversations))
                    runs[label].append(s)
                    print(f"round {rnd + 1} {label:6s} load {s['load_avg_1min']:.2f}: own ms call 1 "
                          f"{s['own_ms_call_1']:.2f}, calls 2-6 {s['own_ms_calls_2_6']:.2f}, last 5 "
                          f"{s['own_ms_last_5']:.2f} (server {s['server_ms_last_5']:.2f} - engine "
                          f"{s['engine_ms_last_5']:.2f}), ratio {s['ratio_last_vs_call_1']:.2f}; CPU ms call 1 "
                          f"{s['cpu_ms_call_1']:.2f}, calls 8-12 {s['cpu_ms_call_10']:.2f}, last 5 {s['cpu_ms_last_5']:.2f}, ratio to "
                          f"call 1 {s['cpu_ratio_last_vs_call_1']:.2f}, to call 10 {s['cpu_ratio_last_vs_call_10']:.2f}; "
                          f"{s['prompt_tokens_last']} prompt tokens", flush=True)
        finally:
            engine.close()
    result: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "calls": args.calls, "rounds": args.rounds,
        "engine": "the vLLM stand-in over an instant engine (one tool call, no model compute)",
        "model": f"tiny {args.family} on its real tokenizer" if args.family else "tiny ChatML",
        "before_tree": args.before, "quick": args.quick,
        "load_avg_1min_at_end": round(os.getloadavg()[0], 2),
    }
    for label, rs in runs.items():
        ratios = [r["ratio_last_vs_call_1"] for r in rs]
        cpu_ratios = [r["cpu_ratio_last_vs_call_1"] for r in rs]
        cpu_ratios_10 = [r["cpu_ratio_last_vs_call_10"] for r in rs]
        result[label] = {
            "own_ms_call_1": round(statistics.median(r["own_ms_call_1"] for r in rs), 3),
            "own_ms_last_5": round(statistics.median(r["own_ms_last_5"] for r in rs), 3),
            "ratio_median": round(statistics.median(ratios), 2),
            "ratio_spread": [min(ratios), max(ratios)],
            "cpu_ms_call_1": round(statistics.median(r["cpu_ms_call_1"] for r in rs), 3),
            "cpu_ms_last_5": round(statistics.median(r["cpu_ms_last_5"] for r in rs), 3),
            "cpu_ratio_median": round(statistics.median(cpu_ratios), 2),
            "cpu_ratio_spread": [min(cpu_ratios), max(cpu_ratios)],
            "cpu_ms_call_10": round(statistics.median(r["cpu_ms_call_10"] for r in rs), 3),
            "cpu_ratio_vs_call_10_median": round(statistics.median(cpu_ratios_10), 2),
            "cpu_ratio_vs_call_10_spread": [min(cpu_ratios_10), max(cpu_ratios_10)],
            "rounds": rs,
        }
        r = result[label]
        print(f"{label}: own ms call 1 {r['own_ms_call_1']}, calls {args.calls - 4}-{args.calls} {r['own_ms_last_5']}, "
              f"ratio median {r['ratio_median']} (rounds {min(ratios)}-{max(ratios)}); CPU ms call 1 "
              f"{r['cpu_ms_call_1']}, last 5 {r['cpu_ms_last_5']}, ratio median {r['cpu_ratio_median']} "
              f"(rounds {min(cpu_ratios)}-{max(cpu_ratios)}); against calls 8-12 ({r['cpu_ms_call_10']}) "
              f"{r['cpu_ratio_vs_call_10_median']} (rounds {min(cpu_ratios_10)}-{max(cpu_ratios_10)})")
    if not args.quick:
        out = Path(args.out) if args.out else RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
