"""The demo's embedded defaults: the CPU run `rowgrove demo` makes (examples/demo.yaml holds the
same values for `rowgrove train --config`)."""

from __future__ import annotations

from typing import Any

DEMO: dict[str, Any] = {
    "model": "tiny-task",
    "env": "counter",
    "agent": {"compaction": "keep_last_rounds", "keep_rounds": 1, "every_k": 2, "max_resamples": 2},
    "prompts_per_step": 8,
    "rollouts_per_prompt": 8,
    "rollouts_per_minibatch": 32,
    "steps": 20,
    "lr": 1e-3,
    "warmup_sft_steps": 120,
    "warmup_sft_lr": 5e-3,
    "max_tokens": 32,
    "eval_prompts": 32,
    "checkpoint_every": 5,
    "out": "runs/demo",
}
