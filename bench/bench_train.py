"""Packed vs padded micro-batches: training tokens per second of the policy update on the row-
length mix the demo produces.

Rows: the demo's agent (counter task, keep_last_rounds compaction) driven by a scripted random
policy, its calls cut into rows the way the gateway cuts them (a compaction starts a new row),
rendered with the demo's tiny tokenizer (`rowgrove.train.warmup.agent_transcripts`). Engine
logprobs are synthetic; the update is `rowgrove.train.update.update_policy` with everything
equal but `packed`: packed micro-batches (rows concatenated, varlen attention per row) against
the baseline, rows padded to the longest of their micro-batch, both at the same token capacity
(padding counted). Tokens/s counts real tokens (prompt + sampled) of the rows, not padding.

    python bench/bench_train.py [--quick] [--capacity 4096] [--repeats 3]

Writes bench/results/train.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "train.json"


def demo_rows(n_episodes: int, seed: int = 0) -> list[Any]:
    """Rows with the demo's shapes: tokens, loss masks, one rollout id and group per episode."""
    import numpy as np

    from rowgrove.agents import AgentConfig
    from rowgrove.envs import make_env, task_corpus
    from rowgrove.model.load import load_tokenizer
    from rowgrove.model.tiny import tiny_model_dir
    from rowgrove.train.presets import DEMO
    from rowgrove.train.warmup import agent_transcripts, transcript_row
    from rowgrove.types import Row

    tok = load_tokenizer(str(tiny_model_dir(seed=0, extra_corpus=tuple(task_corpus("counter")))))
    agent = AgentConfig(**DEMO["agent"])
    tools = make_env("counter").tools
    rng = np.random.default_rng(seed)
    rows = []
    # one episode's conversations are consecutive in agent_transcripts' output; re-run per episode
    for e in range(n_episodes):
        for j, conv in enumerate(agent_transcripts("counter", 1, seed * 100003 + e, "random", agent)):
            r = transcript_row(tok, conv, tools, f"e{e}")
            lp = [float(-rng.uniform(0.01, 2.0)) if m else 0.0 for m in r.loss_mask]
            rows.append(Row(rollout_id=f"e{e}", group_id=f"g{e // 8}", input_ids=r.input_ids, loss_mask=r.loss_mask,
                            reward=float(rng.random()), advantage=float(rng.normal()), logprobs=lp, segment=j))
    return rows


def wide_rows(demo: list[Any], seed: int = 0) -> list[Any]:
    """The demo's rows cut to a wide length mix (log-uniform 48..full length, as agentic rows are
    when prompts are short and turns vary): where padding wastes much, packing has room to win."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for r in demo:
        n = int(np.exp(rng.uniform(np.log(48), np.log(len(r.input_ids)))))
        out.append(dataclasses.replace(r, input_ids=list(r.input_ids[:n]), loss_mask=list(r.loss_mask[:n]),
                                       logprobs=list(r.logprobs[:n])))
    return out


def time_update(rows: list[Any], *, packed: bool, capacity: int, repeats: int) -> float:
    """Best-of-`repeats` seconds of one full update (all mini-batches) of a fresh tiny model."""
    import torch

    from rowgrove.model.load import load_model
    from rowgrove.model.tiny import tiny_model_dir
    from rowgrove.envs import task_corpus
    from rowgrove.train.update import update_policy

    best = float("inf")
    for _ in range(repeats):
        model, _ = load_model(str(tiny_model_dir(seed=0, extra_corpus=tuple(task_corpus("counter")))))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        t0 = time.perf_counter()
        update_policy(model, opt, rows, rollouts_per_minibatch=32, microbatch_tokens=capacity, packed=packed)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rows and repeats (smoke check)")
    p.add_argument("--capacity", type=int, default=4096, help="tokens per micro-batch (padding counted)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    episodes = 16 if args.quick else 64
    repeats = 1 if args.quick else args.repeats
    rows = demo_rows(episodes)
    lengths = np.asarray([len(r.input_ids) for r in rows])
    tokens = int(lengths.sum())
    padded_s = time_update(rows, packed=False, capacity=args.capacity, repeats=repeats)
    packed_s = time_update(rows, packed=True, capacity=args.capacity, repeats=repeats)
    result = {
        "benchmark": "train: packed vs padded micro-batches (policy update, tiny model, CPU)",
        "rows": len(rows), "rollouts": episodes, "tokens": tokens,
        "row_length": {"min": int(lengths.min()), "median": float(np.median(lengths)), "max": int(lengths.max())},
        "capacity": args.capacity, "threads": torch.get_num_threads(), "quick": args.quick,
        "padded_tokens_per_s": tokens / padded_s, "packed_tokens_per_s": tokens / packed_s,
        "packed_over_padded_ratio": padded_s / packed_s,
    }
    wide = wide_rows(rows)
    wl = np.asarray([len(r.input_ids) for r in wide])
    w_padded = time_update(wide, packed=False, capacity=args.capacity, repeats=repeats)
    w_packed = time_update(wide, packed=True, capacity=args.capacity, repeats=repeats)
    result["wide_mix"] = {
        "row_length": {"min": int(wl.min()), "median": float(np.median(wl)), "max": int(wl.max())},
        "tokens": int(wl.sum()), "padded_tokens_per_s": int(wl.sum()) / w_padded,
        "packed_tokens_per_s": int(wl.sum()) / w_packed, "packed_over_padded_ratio": w_padded / w_packed,
    }
    print(f"rows {len(rows)} ({episodes} rollouts), lengths {result['row_length']}, capacity {args.capacity}")
    print(f"demo mix: padded {result['padded_tokens_per_s']:.0f} tok/s   packed {result['packed_tokens_per_s']:.0f} tok/s"
          f"   packed/padded = {result['packed_over_padded_ratio']:.2f}x")
    w = result["wide_mix"]
    print(f"wide mix {w['row_length']}: padded {w['padded_tokens_per_s']:.0f} tok/s   packed "
          f"{w['packed_tokens_per_s']:.0f} tok/s   packed/padded = {w['packed_over_padded_ratio']:.2f}x")
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
