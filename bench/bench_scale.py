"""Benchmark: rollout throughput of 1, 2 and 4 gateways behind Ray (rowgrove.scale.GatewayPool),
scripted engine, on this machine; calls/s as a ratio to one gateway, and where the time goes.

Each configuration starts a pool of N gateway actors (scripted engine on the tiny model, one torch
thread each) on a local Ray, warms it (the episode workers start on the first run), then runs the
same episodes: R rollouts of T turns (ScriptedHarness, the official openai SDK), at most
`--in-flight` episode tasks at once whatever N, so only the number of gateways changes. The three
pools run one after another in one process, on one Ray, in the order 1, 2, 4, then 1 again (the
second 1-gateway figure shows how far the machine drifted during the run).

Where the time goes, per episode (means, from inside the Ray task): create (POST /v1/rollouts),
model calls (the harness: each call is a gateway decide + render + the scripted engine's forward
pass for the logprobs + the ledger), finish + rows (POST finish, GET rows); and outside the task:
Ray's scheduling and result transfer, estimated as in-flight x wall / episodes - mean task time.

Goals: no episode masked or lost (every call answered and every rollout's rows read back), and
N gateways not slower than 0.7x one gateway (the gateways share this machine's cores with each
other and with the harness tasks, so scaling past the cores is not expected; the goal bounds the
cost of spreading rollouts over actors). Results: bench/results/scale.json (not with --quick).

    .venv/bin/python bench/bench_scale.py [--quick] [--rollouts R] [--turns T] [--in-flight K]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"


def _jobs(rollouts: int, turns: int, tag: str):
    from rowgrove.scale import EpisodeJob, ScriptedHarness

    return [EpisodeJob(key=f"{tag}-{k}", group_id=f"{tag}-g{k // 4}",
                       harness=ScriptedHarness([f"reply {k} {t}" for t in range(turns)], float(k % 2)))
            for k in range(rollouts)]


def measure(n: int, rollouts: int, turns: int, in_flight: int, ledger_dir: Path) -> dict:
    """One pool of `n` gateways: start, warm, timed run; its figures."""
    from rowgrove.scale import GatewayPool

    t0 = time.perf_counter()
    pool = GatewayPool(n, ledger_dir=ledger_dir, gateway_cpus=0.1, episode_cpus=0.1, max_in_flight=in_flight)
    start_s = time.perf_counter() - t0
    try:
        pool.run(_jobs(min(rollouts, 2 * in_flight), 1, f"warm{n}"))
        step = pool.run(_jobs(rollouts, turns, f"n{n}"))
    finally:
        pool.close()
    outs = step.outcomes
    calls = sum(o.calls for o in outs)
    ok = [o for o in outs if not o.mask_reason]

    def mean_ms(key: str) -> float:
        return 1e3 * statistics.fmean(o.timings[key] for o in ok) if ok else float("nan")

    task_s = statistics.fmean(o.seconds for o in ok) if ok else float("nan")
    return {
        "gateways": n, "pool_start_s": round(start_s, 2), "wall_s": round(step.seconds, 3), "calls": calls,
        "calls_per_s": calls / step.seconds, "episodes": len(outs), "masked": len(step.masked),
        "per_gateway_episodes": [sum(o.slot == k for o in outs) for k in range(n)],
        "where_ms_per_episode": {
            "create": mean_ms("create"), "model_calls": mean_ms("harness"), "finish_and_rows": mean_ms("finish_and_rows"),
            "outside_task_ray": 1e3 * (in_flight * step.seconds / len(outs) - task_s),
        },
        "ms_per_call_in_harness": mean_ms("harness") / turns,
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print ratios, write the results file; returns the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 rollouts x 2 turns, no results file")
    p.add_argument("--rollouts", type=int, default=128)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=16, help="episode tasks at once, the same for every N")
    p.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS}; none with --quick)")
    args = p.parse_args(argv)
    rollouts, turns = (16, 2) if args.quick else (args.rollouts, args.turns)
    import ray

    src = str(Path(__file__).resolve().parents[1] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (src, os.environ.get("PYTHONPATH")) if x)
    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray_init_s = time.perf_counter() - t0
    out: dict = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "python": platform.python_version(),
        "ray": ray.__version__, "rollouts": rollouts, "turns": turns, "in_flight": args.in_flight,
        "engine": "scripted (tiny model, 1 torch thread per gateway)", "ray_init_s": round(ray_init_s, 2),
        "load_avg_before": round(os.getloadavg()[0], 2), "runs": [],
    }
    print(f"{rollouts} rollouts x {turns} turns, {args.in_flight} in flight, load avg {out['load_avg_before']}")
    try:
        with tempfile.TemporaryDirectory(prefix="rowgrove-bench-scale-") as tmp:
            for k, n in enumerate((1, 2, 4, 1)):
                r = measure(n, rollouts, turns, args.in_flight, Path(tmp) / f"run{k}")
                out["runs"].append(r)
                w = r["where_ms_per_episode"]
                print(f"  {n} gateway{'s' if n > 1 else ' '}: {r['calls_per_s']:7.1f} calls/s  wall {r['wall_s']:.2f}s  "
                      f"per episode: create {w['create']:.0f} ms, calls {w['model_calls']:.0f} ms, "
                      f"finish+rows {w['finish_and_rows']:.0f} ms, Ray {w['outside_task_ray']:.0f} ms; "
                      f"spread {r['per_gateway_episodes']}; start {r['pool_start_s']:.1f}s")
    finally:
        ray.shutdown()
    base = out["runs"][0]["calls_per_s"]
    out["ratio_to_one_gateway"] = {f"{r['gateways']}_gateways_ratio": r["calls_per_s"] / base for r in out["runs"][1:3]}
    out["drift_ratio_one_gateway_again"] = out["runs"][3]["calls_per_s"] / base
    out["load_avg_after"] = round(os.getloadavg()[0], 2)
    lost = sum(r["masked"] + (r["episodes"] != rollouts) for r in out["runs"])
    worst = min(out["ratio_to_one_gateway"].values())
    out["goals"] = {
        "episodes_masked_or_lost": {"value": lost, "goal": "== 0", "met": lost == 0},
        "worst_ratio_to_one_gateway": {"value": round(worst, 3), "goal": ">= 0.7", "met": worst >= 0.7},
    }
    for k, v in out["ratio_to_one_gateway"].items():
        print(f"  {k}: {v:.2f}x")
    print(f"  one gateway again (drift): {out['drift_ratio_one_gateway_again']:.2f}x")
    dest = args.out or (None if args.quick else RESULTS)
    if dest is not None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {dest}")
    return out


if __name__ == "__main__":
    res = main(sys.argv[1:])
    sys.exit(0 if all(g["met"] for g in res["goals"].values()) else 1)
