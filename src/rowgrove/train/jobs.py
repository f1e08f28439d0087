"""What both rollout runners of the trainer build their jobs from: the agent's options and the
per-job seed.

The in-process runner (`rowgrove.train.loop.run_group_rollouts`) and the Ray one
(`rowgrove.train.ray_rollouts.RayRollouts`) must give the same rollout the same agent and the
same seeds, so a run on Ray samples what the same run in one process samples. Both import these
two functions from here; neither imports the other.
"""

from __future__ import annotations

from typing import Any

from rowgrove.train.config import TrainConfig


def mix(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (FNV-1a over the parts): the same parts give the
    same seed on every machine and in every process, which `hash()` does not promise."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) % 2**64
    return h % 2**63


def agent_config(cfg: TrainConfig) -> Any:
    """The reference agent's AgentConfig for a training config: `cfg.agent`'s options with the
    run's sampling temperature and max tokens. Raises InputError on an unknown agent option."""
    from rowgrove.agents import AgentConfig

    return AgentConfig.from_options(dict(cfg.agent), temperature=cfg.temperature, max_tokens=cfg.max_tokens)
