"""`rowgrove demo`: the main job on embedded defaults (rowgrove.train.presets.DEMO).

Builds the tiny model with the counter task's corpus, warms it up on synthetic agent transcripts
so that it acts through tools, then trains it with GRPO on the CPU through the gateway, with a
compaction agent (one rollout becomes several rows). Prints the summary (reward first -> last
steps, eval reward after warm-up and after GRPO, rows per rollout, tokens, time) and where the
report is. `--out`, `--seed`, `--steps` and `--set` change the defaults.
"""

from __future__ import annotations

import argparse
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rowgrove.commands.train import add_config_arguments

    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rowgrove.commands.train import overrides_from, print_summary
    from rowgrove.train.config import TrainConfig, load_config
    from rowgrove.train.loop import train
    from rowgrove.train.presets import DEMO

    cfg = load_config(None, overrides_from(args), base=TrainConfig(**DEMO))
    if args.out is None:
        cfg = cfg.replace(out=f"{cfg.out}-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"rowgrove demo: {cfg.steps} GRPO steps of {cfg.prompts_per_step} prompts x {cfg.rollouts_per_prompt} "
          f"rollouts on {cfg.env!r}, agent {dict(cfg.agent)}, run directory {cfg.out}")
    print_summary(train(cfg))
    return 0
