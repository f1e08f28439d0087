"""Benchmark: the deployed path, `rowgrove serve --engine vllm` in front of the vLLM stand-in on
Qwen3's real vocabulary, at c=1 and c=32; and (`--before TREE`) an older tree against this one.

Three kinds of process, as a user runs them: the vLLM stand-in over an instant engine (one tool
call, no model compute; bench_long_conversation's), and one `python -m rowgrove serve --engine
vllm` per tree in front of it, both on the tiny Qwen3 model with Qwen3's real tokenizer
(tests/families.py, `vocab="real"`). The client is bench_long_conversation's raw keep-alive one:
conversations of 12 calls, each extending the last (system prompt, two tools, tool calls and
~600-byte tool results). Rounds alternate the gateways; per round, at c=1 four conversations one
after the other (CPU per call read around each call, all the gateway's threads) and at c=32
32 conversations at once (the gateway's CPU over the burst / calls, and requests/s). Per call the
gateway's added latency is its Server-Timing (route entry to response built) minus the
stand-in's own time for that call's request (timed inside the stand-in by X-Request-Id); the
stand-in's own CPU per call is read beside the gateway's. Medians over rounds.

`measure()` is the machinery; `rowgrove bench gateway` (bench_gateway.py) calls it for this
tree's gateway (figure `deployed_vllm_qwen3` in bench/results/gateway.json). This file's main is
the before/after check of the continuation-tokenization fix
(bench/results/deployed_before_after.json, `--out` elsewhere):

    .venv/bin/python bench/bench_deployed.py --before /tmp/rg-before [--rounds 5]   # git worktree add --detach /tmp/rg-before <commit>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics as st
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_long_conversation as bl  # noqa: E402

CALLS = 12  # calls per conversation


def qwen3_absent() -> str | None:
    """None when Qwen3's real tokenizer is in the tokenizer folder, else a one-line reason."""
    from families import family
    from realfiles import has_tokenizer, tokenizers_dir

    tok = family("qwen3").tokenizer
    if tok is not None and has_tokenizer(tok):
        return None
    return f"Qwen3's tokenizer ({tok}) is not in {tokenizers_dir()} ($ROWGROVE_TOKENIZERS)"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def measure(srcs: dict[str, str | None], tmp: str, rounds: int, c1_convs: int = 4, c32: int = 32,
            extra: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """One stand-in and a gateway per `srcs` entry (label: its src/ folder, None: this tree),
    driven in alternating rounds; `extra(round)` (if given) runs in each round after them (e.g. a
    null-engine floor measured the same way). Per label: medians over rounds of CPU ms per call
    (gateway and stand-in) at c=1 and c=32, req/s at c=32, and over all calls p50/p95 of the added
    latency (Server-Timing minus the stand-in's own time), the stand-in's own and end to end."""
    folder = str(Path(tmp) / "q3")
    from families import family_model_dir

    shutil.copytree(family_model_dir("qwen3", vocab="real"), folder)
    port = bl._free_port()
    eng = bl.Proc([sys.executable, bl.__file__, "--serve-engine", str(port), folder], port, bl._env(None))
    gws: dict[str, bl.Proc] = {}
    rec: dict[str, dict[str, list]] = {k: {"c1": [], "c32": [], "calls_c1": [], "calls_c32": []} for k in srcs}
    try:
        for k, v in srcs.items():
            gws[k] = bl.start_gateway(v, folder, f"http://127.0.0.1:{port}", f"{tmp}/{k}.db")
        for g in gws.values():
            asyncio.run(bl.conversation(g.port, 5, "warm-up"))

        async def burst(g: bl.Proc, tag: str) -> list[list[dict]]:
            return await asyncio.gather(*(bl.conversation(g.port, CALLS, f"{tag}-{i}") for i in range(c32)))

        for r in range(rounds):
            for k, g in gws.items():
                calls: list[dict] = []
                e0 = bl.cpu_ns(eng.proc.pid)
                for i in range(c1_convs):
                    calls += asyncio.run(bl.conversation(g.port, CALLS, f"{k}-{r}-{i}", g.proc.pid))
                e1 = bl.cpu_ns(eng.proc.pid)
                rec[k]["c1"].append((st.median(c["cpu_ms"] for c in calls), (e1 - e0) / 1e6 / len(calls)))
                rec[k]["calls_c1"] += calls
                c0, e0, t0 = bl.cpu_ns(g.proc.pid), bl.cpu_ns(eng.proc.pid), time.perf_counter()
                convs = asyncio.run(burst(g, f"{k}-{r}-c32"))
                n = c32 * CALLS
                rec[k]["c32"].append(((bl.cpu_ns(g.proc.pid) - c0) / 1e6 / n, (bl.cpu_ns(eng.proc.pid) - e0) / 1e6 / n,
                                      n / (time.perf_counter() - t0)))
                rec[k]["calls_c32"] += [c for conv in convs for c in conv]
            if extra is not None:
                extra(r)
        times = asyncio.run(bl._engine_times(eng.port))
    finally:
        for g in gws.values():
            g.close()
        eng.close()
    out: dict[str, dict[str, Any]] = {}
    for k, d in rec.items():
        row: dict[str, Any] = {}
        for c in ("c1", "c32"):
            calls = d[f"calls_{c}"]
            added = [x["server_ms"] - times[x["call_id"]] for x in calls]
            standin = [times[x["call_id"]] for x in calls]
            e2e = [x["e2e_ms"] for x in calls]
            row[c] = {
                "gateway_cpu_ms_per_call": round(st.median(x[0] for x in d[c]), 3),
                "standin_cpu_ms_per_call": round(st.median(x[1] for x in d[c]), 3),
                **({"req_per_s": round(st.median(x[2] for x in d[c]))} if c == "c32" else {}),
                "added_p50_ms": round(_pct(added, 50), 3), "added_p95_ms": round(_pct(added, 95), 3),
                "standin_p50_ms": round(_pct(standin, 50), 3), "standin_p95_ms": round(_pct(standin, 95), 3),
                "end_to_end_p50_ms": round(_pct(e2e, 50), 3), "end_to_end_p95_ms": round(_pct(e2e, 95), 3),
                "calls": len(calls),
                "rounds_gateway_cpu_ms_per_call": [round(x[0], 3) for x in d[c]],
            }
        out[k] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="an older source tree (its src/ is imported)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one round: a smoke run (writes nothing)")
    ap.add_argument("--out", default=None, help="default bench/results/deployed_before_after.json")
    args = ap.parse_args(argv)
    if (why := qwen3_absent()) is not None:
        raise SystemExit(why)
    srcs = {"before": str(Path(args.before).resolve() / "src"), "after": None}
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-deployed-") as tmp:
        m = measure(srcs, tmp, rounds)
    result: dict = {"before_tree": args.before, "rounds": rounds, "cpus": os.cpu_count(),
                    "model": "tiny qwen3 on Qwen3's real tokenizer", "load_avg_1min_at_end": round(os.getloadavg()[0], 2)}
    for k in srcs:
        result[k] = m[k]
        print(k, json.dumps(m[k]))

    def ratio(c: str) -> float:
        a, b = m["after"][c]["rounds_gateway_cpu_ms_per_call"], m["before"][c]["rounds_gateway_cpu_ms_per_call"]
        return round(st.median(x / y for x, y in zip(a, b, strict=True)), 2)

    result["ratio_c1"], result["ratio_c32"] = ratio("c1"), ratio("c32")
    print("after/before per round, median: c=1", result["ratio_c1"], "c=32", result["ratio_c32"])
    if not args.quick or args.out is not None:
        Path(args.out or HERE / "results" / "deployed_before_after.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
