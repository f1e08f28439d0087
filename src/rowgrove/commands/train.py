"""`rowgrove train`: the reference GRPO trainer (rowgrove.train.loop.train) on a config.

    rowgrove train --config examples/demo.yaml --out runs/a
    rowgrove train --config examples/gpu.yaml --model /models/Qwen3-0.6B --device cuda --out runs/b
    rowgrove train --config examples/gpu.yaml --model /models/Qwen3-0.6B --engine vllm --engine-url http://127.0.0.1:8001
    rowgrove train --resume runs/a                      # continue after the last checkpoint
    rowgrove train --resume runs/a --set steps=40       # ... and run longer
    rowgrove train --config examples/demo.yaml --nproc 2 --out runs/c   # data-parallel, 2 local ranks
    rowgrove train --config examples/demo.yaml --ray --gateways 4 --out runs/d   # rollouts on a local Ray
    rowgrove train --config examples/multinode.yaml --ray --ray-address auto --nproc 8 --device cuda
    torchrun --nproc-per-node 8 --no-python rowgrove train --config examples/gpu.yaml --device cuda

Precedence: the YAML file, then explicit flags, then `--set key=value` (values parsed as YAML;
`agent.compaction=keep_last_rounds` sets one agent option). With --resume the run's own
config.json is the base.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `train` and `demo` share."""
    p.add_argument("--out", help="run directory (metrics.jsonl, ledger.sqlite, checkpoints/, report.html)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set any config field, e.g. --set lr=1e-3 --set agent.compaction=collapse_env")
    p.add_argument("--seed", type=int, help="seed for prompts, sampling, model init")
    p.add_argument("--steps", type=int, help="GRPO steps")
    p.add_argument("--device", help="torch device: cpu, cuda, cuda:1")
    p.add_argument("--threads", type=int, help="torch threads for the one process (0 = torch default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of TrainConfig fields (see examples/)")
    p.add_argument("--model", help='"tiny-task", "tiny" or a Hugging Face model directory')
    p.add_argument("--engine", choices=("hf", "vllm", "sglang"),
                   help="who samples: hf (in this process, default) or a running vllm/sglang server serving --model")
    p.add_argument("--engine-url", help="the vllm/sglang server(s), comma-separated")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel trainer ranks on this machine (torch.distributed: gloo on CPU, NCCL on GPU); "
                        "rank 0 runs the gateway and writes the run")
    p.add_argument("--ray", action="store_true",
                   help="run the rollouts on Ray: gateway actors (--gateways), episodes as Ray tasks (needs rowgrove[ray])")
    p.add_argument("--gateways", type=int, help="gateway actors with --ray (default 2), each with its own engine and ledger")
    p.add_argument("--ray-address", help="Ray cluster to join with --ray (e.g. auto); without it a local Ray starts")
    add_config_arguments(p)


def overrides_from(args: argparse.Namespace) -> list[str]:
    """Explicit flags as key=value overrides, followed by --set ones."""
    out = []
    for key in ("out", "seed", "steps", "device", "threads", "model", "engine", "engine_url", "gateways",
                "ray_address"):
        value = getattr(args, key, None)
        if value is not None:
            out.append(f"{key}={value}")
    if getattr(args, "ray", False):
        out.append("ray=true")
    if getattr(args, "no_progress", False):
        out.append("progress=false")
    return out + list(args.overrides)


def print_summary(summary: object) -> None:
    table = summary.table()  # type: ignore[attr-defined]
    width = max(len(k) for k in table)
    print()
    for k, v in table.items():
        print(f"  {k:<{width}}  {v:.3f}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    print(f"\nreport: {summary.report}")  # type: ignore[attr-defined]


def train_and_print(cfg: object, resume: bool) -> None:
    """Train (every rank); the rank that returns a summary (rank 0) prints it."""
    from rowgrove.train.loop import train

    summary = train(cfg, resume=resume)  # type: ignore[arg-type]
    if summary is not None:
        print_summary(summary)


def run(args: argparse.Namespace) -> int:
    from rowgrove.errors import InputError
    from rowgrove.train.config import load_config

    if args.resume:
        if args.config:
            raise InputError("--resume takes the run's own config.json: drop --config (use --set to change fields)")
        run_dir = Path(args.resume)
        base = load_config(run_dir / "config.json")
        cfg = load_config(None, [f"out={run_dir}", *overrides_from(args)], base=base)
    else:
        cfg = load_config(args.config, overrides_from(args))
    if args.nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {args.nproc}")
    if not cfg.ray and (args.gateways is not None or args.ray_address is not None):
        raise InputError("--gateways and --ray-address set up the Ray rollouts: add --ray")
    if args.nproc == 1:
        train_and_print(cfg, bool(args.resume))
        return 0
    from rowgrove.train.parallel import launch

    return launch(train_and_print, args.nproc, cfg, bool(args.resume), device=cfg.device)
