"""Benchmark: rollout throughput of 1, 2 and 4 gateways behind Ray (rowgrove.scale.GatewayPool),
scripted engine, on this machine; calls/s as a ratio to one gateway, and where the time goes.

Each configuration starts a pool of N gateway actors (scripted engine on the tiny model, one torch
thread each) on a local Ray, warms it (the episode workers start on the first run), then runs the
same episodes: R rollouts of T turns (ScriptedHarness, the official openai SDK), at most
`--in-flight` episode tasks at once whatever N, so only the number of gateways changes. The three
pools live side by side on one Ray in one process, and their timed runs alternate (`--reps`
rounds, the order rotated each round) so that a machine whose load drifts slows every N alike;
the ratio is of the best run of each, the median ratio is printed too.

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


def figures(n: int, step, turns: int, in_flight: int) -> dict:
    """calls/s and where the time went, for one timed run of a pool of `n` gateways."""
    outs = step.outcomes
    calls = sum(o.calls for o in outs)
    ok = [o for o in outs if not o.mask_reason]

    def mean_ms(key: str) -> float:
        return 1e3 * statistics.fmean(o.timings[key] for o in ok) if ok else float("nan")

    task_s = statistics.fmean(o.seconds for o in ok) if ok else float("nan")
    return {
        "gateways": n, "wall_s": round(step.seconds, 3), "calls": calls, "calls_per_s": calls / step.seconds,
        "episodes": len(outs), "masked": len(step.masked),
        "per_gateway_episodes": [sum(o.slot == k for o in outs) for k in range(n)],
        "where_ms_per_episode": {
            "create": mean_ms("create"), "model_calls": mean_ms("harness"), "finish_and_rows": mean_ms("finish_and_rows"),
            "outside_task_ray": 1e3 * (in_flight * step.seconds / len(outs) - task_s),
        },
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print ratios, write the results file; returns the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 rollouts x 2 turns, no results file")
    p.add_argument("--rollouts", type=int, default=48)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=8, help="episode tasks at once, the same for every N")
    p.add_argument("--reps", type=int, default=3, help="timed runs per pool, alternating between the pools")
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
    sizes = (1, 2, 4)
    try:
        with tempfile.TemporaryDirectory(prefix="rowgrove-bench-scale-") as tmp:
            from rowgrove.scale import GatewayPool

            pools, start_s = {}, {}
            for n in sizes:  # every pool alive at once, so the timed runs can alternate
                t = time.perf_counter()
                pools[n] = GatewayPool(n, ledger_dir=Path(tmp) / f"pool{n}", gateway_cpus=0.1, episode_cpus=0.1,
                                       max_in_flight=args.in_flight)
                start_s[n] = round(time.perf_counter() - t, 2)
                pools[n].run(_jobs(2 * args.in_flight, 1, f"warm{n}"))  # starts the episode workers
            for rep in range(args.reps):
                for n in sizes[rep % 3:] + sizes[:rep % 3]:  # rotate the order: drift hits every N alike
                    r = figures(n, pools[n].run(_jobs(rollouts, turns, f"n{n}r{rep}")), turns, args.in_flight)
                    r["rep"] = rep
                    out["runs"].append(r)
                    w = r["where_ms_per_episode"]
                    print(f"  rep {rep}, {n} gateway{'s' if n > 1 else ' '}: {r['calls_per_s']:7.1f} calls/s  "
                          f"wall {r['wall_s']:.2f}s  per episode: create {w['create']:.0f} ms, calls "
                          f"{w['model_calls']:.0f} ms, finish+rows {w['finish_and_rows']:.0f} ms, Ray "
                          f"{w['outside_task_ray']:.0f} ms; spread {r['per_gateway_episodes']}")
            for p in pools.values():
                p.close()
    finally:
        ray.shutdown()
    out["pool_start_s"] = {str(n): s for n, s in start_s.items()}
    best = {n: max(r["calls_per_s"] for r in out["runs"] if r["gateways"] == n) for n in sizes}
    median = {n: statistics.median(r["calls_per_s"] for r in out["runs"] if r["gateways"] == n) for n in sizes}
    out["best_calls_per_s"] = {str(n): round(v, 2) for n, v in best.items()}
    out["median_calls_per_s"] = {str(n): round(v, 2) for n, v in median.items()}
    out["ratio_to_one_gateway"] = {f"{n}_gateways_ratio": best[n] / best[1] for n in sizes[1:]}
    out["median_ratio_to_one_gateway"] = {f"{n}_gateways_ratio": median[n] / median[1] for n in sizes[1:]}
    out["where_ms_per_episode_median"] = {
        str(n): {k: round(statistics.median(r["where_ms_per_episode"][k] for r in out["runs"] if r["gateways"] == n), 1)
                 for k in ("create", "model_calls", "finish_and_rows", "outside_task_ray")} for n in sizes}
    out["load_avg_after"] = round(os.getloadavg()[0], 2)
    lost = sum(r["masked"] + (r["episodes"] != rollouts) for r in out["runs"])
    worst = min(out["ratio_to_one_gateway"].values())
    out["goals"] = {
        "episodes_masked_or_lost": {"value": lost, "goal": "== 0", "met": lost == 0},
        "worst_ratio_to_one_gateway": {"value": round(worst, 3), "goal": ">= 0.7", "met": worst >= 0.7},
    }
    for k, v in out["ratio_to_one_gateway"].items():
        print(f"  {k} (best of {args.reps}): {v:.2f}x, median {out['median_ratio_to_one_gateway'][k]:.2f}x")
    dest = args.out or (None if args.quick else RESULTS)
    if dest is not None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {dest}")
    return out


if __name__ == "__main__":
    res = main(sys.argv[1:])
    sys.exit(0 if all(g["met"] for g in res["goals"].values()) else 1)
