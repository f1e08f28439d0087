"""Benchmark: group_advantages on 1M rollouts in 100k uneven groups, against two baselines
measured in the same run.

    loop     a dict-of-lists loop written the way verl's compute_grpo_outcome_advantage works
             (defaultdict(list) of scalar score tensors by uid, torch.mean / torch.std per group,
             then a loop writing each score back); a numpy flavour of the same loop is reported too
    argsort  one np.argsort of the same ids, as the caller would pass them (a lower bound for any
             sort-based grouping)

group_advantages is timed on the raw ids the user passes (str uids like "p12345", or an int
array), so the id factorization is inside its time. Ours and argsort are run interleaved, best of
--reps; the loops once. Ratios are printed and written to bench/results/advantages.json.

    .venv/bin/python bench/bench_advantages.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rowgrove.algo import group_advantages

RESULTS = Path(__file__).resolve().parent / "results" / "advantages.json"


def make_data(n_rollouts: int, n_groups: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(rewards_R, group number per rollout): uneven group sizes 1..19 (mean ~10), shuffled order."""
    rng = np.random.default_rng(seed)
    target = rng.integers(1, 20, n_groups) * n_rollouts / (10 * n_groups)
    sizes = np.maximum(1, np.floor(target).astype(np.int64))
    while sizes.sum() != n_rollouts:  # hand out (or take back) the rounding, one per group
        short = n_rollouts - sizes.sum()
        pick = rng.choice(np.flatnonzero(sizes > 1) if short < 0 else n_groups, min(abs(short), n_groups), replace=False)
        sizes[pick] += np.sign(short)
    gid = np.repeat(np.arange(n_groups), sizes)
    rng.shuffle(gid)
    rewards = rng.integers(0, 2, n_rollouts).astype(np.float64) + rng.normal(0, 0.1, n_rollouts)
    return rewards, gid


def verl_loop(rewards: np.ndarray, index: list, epsilon: float = 1e-6):
    """verl's compute_grpo_outcome_advantage, per-rollout scores (token sum already done)."""
    import torch

    scores = torch.as_tensor(rewards).clone()
    id2score = defaultdict(list)
    id2mean, id2std = {}, {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
        for i in range(bsz):
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return scores.numpy()


def numpy_loop(rewards: np.ndarray, index: list, epsilon: float = 1e-6) -> np.ndarray:
    """The same dict-of-lists loop over Python floats with numpy mean/std per group."""
    scores = rewards.tolist()
    id2score = defaultdict(list)
    for i, s in enumerate(scores):
        id2score[index[i]].append(s)
    id2mean, id2std = {}, {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            a = np.asarray(vals)
            id2mean[idx], id2std[idx] = float(a.mean()), float(a.std(ddof=1))
    return np.asarray([(s - id2mean[g]) / (id2std[g] + epsilon) for s, g in zip(scores, index, strict=True)])


def _once(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print ratios, write the results file; returns the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100k rollouts in 10k groups")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions of ours and argsort (best is kept)")
    p.add_argument("--no-loop", action="store_true", help="skip the (slow) loop baselines")
    p.add_argument("--out", type=Path, default=None,
                   help=f"results file (default {RESULTS}; with --quick, none unless given)")
    args = p.parse_args(argv)
    n, g = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    rewards, gid = make_data(n, g)
    inputs = {"str": [f"p{x}" for x in gid.tolist()], "int": gid.astype(np.int64)}
    sizes = np.bincount(gid)
    multi = sizes[gid] > 1  # verl keeps a lone rollout's score as is; rowgrove gives it 0
    out: dict = {
        "n_rollouts": n, "n_groups": g, "group_sizes": [int(sizes.min()), int(sizes.max())],
        "reps": args.reps, "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "python": platform.python_version(), "numpy": np.__version__,
        "load_avg_before": round(os.getloadavg()[0], 2), "ids": {},
    }
    print(f"group_advantages on {n:,} rollouts in {g:,} groups (sizes {sizes.min()}..{sizes.max()}), "
          f"load avg {out['load_avg_before']}")
    for kind, ids in inputs.items():
        ours, srt = [], []
        for _ in range(args.reps):
            ours.append(_once(lambda ids=ids: group_advantages(rewards, ids)))
            srt.append(_once(lambda ids=ids: np.argsort(ids)))
        row = {"ours_s": min(ours), "argsort_s": min(srt), "ours_median_s": float(np.median(ours)),
               "argsort_median_s": float(np.median(srt))}
        row["x_vs_argsort"] = row["argsort_s"] / row["ours_s"]
        line = f"  {kind:>3} ids: ours {row['ours_s'] * 1e3:8.1f} ms | argsort {row['argsort_s'] * 1e3:8.1f} ms " \
               f"({row['x_vs_argsort']:.2f}x)"
        if not args.no_loop:
            index = ids if isinstance(ids, list) else ids.tolist()
            adv = group_advantages(rewards, ids)
            t = time.perf_counter()
            ref = verl_loop(rewards, index)
            row["verl_loop_s"] = time.perf_counter() - t
            t = time.perf_counter()
            ref_np = numpy_loop(rewards, index)
            row["numpy_loop_s"] = time.perf_counter() - t
            np.testing.assert_allclose(adv[multi], ref[multi], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(adv[multi], ref_np[multi], rtol=1e-6, atol=1e-6)
            row["x_vs_verl_loop"] = row["verl_loop_s"] / row["ours_s"]
            row["x_vs_numpy_loop"] = row["numpy_loop_s"] / row["ours_s"]
            line += f" | verl loop {row['verl_loop_s']:7.2f} s ({row['x_vs_verl_loop']:.0f}x)" \
                    f" | numpy loop {row['numpy_loop_s']:6.2f} s ({row['x_vs_numpy_loop']:.0f}x)"
        print(line)
        out["ids"][kind] = row
    out["load_avg_after"] = round(os.getloadavg()[0], 2)
    path = args.out or (None if args.quick else RESULTS)  # smoke figures never replace the measured ones
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
