"""Benchmark: the deployed path's CPU per call, an older source tree against this one, side by side.

Three kinds of process, as a user runs them: the vLLM stand-in over an instant engine (one tool
call, no model compute; bench_long_conversation's), and one `python -m rowgrove serve --engine
vllm` per tree in front of it, both on the tiny Qwen3 model with Qwen3's real tokenizer
(tests/families.py, `vocab="real"`). The client is bench_long_conversation's raw keep-alive one:
conversations of 12 calls, each extending the last (system prompt, two tools, tool calls and
~600-byte tool results). Rounds alternate the trees; per round, at c=1 four conversations one
after the other (CPU per call read around each call, all the gateway's threads) and at c=32
32 conversations at once (the gateway's CPU over the burst / calls, and requests/s). Medians over
rounds. Results: bench/results/deployed_before_after.json (`--out` elsewhere).

    .venv/bin/python bench/bench_deployed.py --before /tmp/rg-before [--rounds 5]   # git worktree add --detach /tmp/rg-before <commit>

This is the before/after check of the continuation-tokenization fix; `rowgrove bench gateway`
does not measure this path yet.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_long_conversation as bl  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="an older source tree (its src/ is imported)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "deployed_before_after.json"))
    args = ap.parse_args(argv)
    from families import family_model_dir

    srcs = {"before": str(Path(args.before).resolve() / "src"), "after": str(HERE.parent / "src")}
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-deployed-") as tmp:
        folder = str(Path(tmp) / "q3")
        shutil.copytree(family_model_dir("qwen3", vocab="real"), folder)
        port = bl._free_port()
        eng = bl.Proc([sys.executable, bl.__file__, "--serve-engine", str(port), folder], port, bl._env(None))
        gws = {k: bl.start_gateway(v, folder, f"http://127.0.0.1:{port}", f"{tmp}/{k}.db") for k, v in srcs.items()}
        try:
            for g in gws.values():
                asyncio.run(bl.conversation(g.port, 5, "warm-up"))

            async def burst(g: bl.Proc, tag: str) -> None:
                await asyncio.gather(*(bl.conversation(g.port, 12, f"{tag}-{i}") for i in range(32)))

            c1: dict[str, list[float]] = {k: [] for k in gws}
            c32: dict[str, list[tuple[float, float]]] = {k: [] for k in gws}
            for r in range(args.rounds):
                for k, g in gws.items():
                    calls = []
                    for i in range(4):
                        calls += asyncio.run(bl.conversation(g.port, 12, f"{k}-{r}-{i}", g.proc.pid))
                    c1[k].append(st.median(c["cpu_ms"] for c in calls))
                    c0, t0 = bl.cpu_ns(g.proc.pid), time.perf_counter()
                    asyncio.run(burst(g, f"{k}-{r}-c32"))
                    c32[k].append(((bl.cpu_ns(g.proc.pid) - c0) / 1e6 / (32 * 12), 32 * 12 / (time.perf_counter() - t0)))
        finally:
            for g in gws.values():
                g.close()
            eng.close()
    result: dict = {"before_tree": args.before, "rounds": args.rounds, "cpus": os.cpu_count(),
                    "model": "tiny qwen3 on Qwen3's real tokenizer", "load_avg_1min_at_end": round(os.getloadavg()[0], 2)}
    for k in gws:
        result[k] = {"cpu_ms_per_call_c1": round(st.median(c1[k]), 3),
                     "cpu_ms_per_call_c32": round(st.median(x for x, _ in c32[k]), 3),
                     "req_per_s_c32": round(st.median(y for _, y in c32[k])),
                     "rounds_c1": [round(x, 3) for x in c1[k]],
                     "rounds_c32": [[round(x, 3), round(y)] for x, y in c32[k]]}
        print(k, result[k])
    result["ratio_c1"] = round(st.median(a / b for a, b in zip(c1["after"], c1["before"], strict=True)), 2)
    result["ratio_c32"] = round(st.median(a[0] / b[0] for a, b in zip(c32["after"], c32["before"], strict=True)), 2)
    print("after/before per round, median: c=1", result["ratio_c1"], "c=32", result["ratio_c32"])
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
