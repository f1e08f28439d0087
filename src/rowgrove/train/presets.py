"""The demo's embedded defaults: the CPU run `rowgrove demo` makes (examples/demo.yaml holds the
same values for `rowgrove train --config`).

Why these values (measured on 2 CPU cores, see docs/training.md): rollout-mean, because an
episode that wanders takes more turns and so carries more format tokens; under token-mean its
negative advantage pushed the shared tool-call format down until every sample was rejected
(seen at steps 7-17 in several runs). The KL penalty to the warmed policy and the LR decay keep
the format in place for the whole run; 4 optimizer updates per step give GRPO enough updates
to find the task's first lesson (prefer add(3)) within 14 steps."""

from __future__ import annotations

from typing import Any

DEMO: dict[str, Any] = {
    "model": "tiny-task",
    "env": "counter",
    "agent": {"compaction": "keep_last_rounds", "keep_rounds": 1, "every_k": 2, "max_resamples": 2},
    "prompts_per_step": 8,
    "rollouts_per_prompt": 8,
    "rollouts_per_minibatch": 16,
    "steps": 14,
    "lr": 1e-3,
    "lr_decay_to": 0.1,
    "loss_mode": "rollout-mean",
    "kl_coef": 0.1,
    "warmup_sft_steps": 120,
    "warmup_sft_lr": 5e-3,
    "max_tokens": 32,
    "eval_prompts": 64,
    "checkpoint_every": 5,
    "out": "runs/demo",
}
