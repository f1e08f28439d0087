"""Past one machine: many gateways as Ray actors, harness episodes as Ray tasks.

    GatewayPool ──► N gateway actors (each: engine + gateway + its own ledger, on one node)
        │  place(): least open rollouts, sticky: an episode keeps its gateway's base_url
        ▼
    episode tasks (bounded in flight) ──HTTP──► their gateway ──► rows of the finished rollout
        │
        ▼  gather: rows of every gateway (ids unique across them), masked rollouts named
    assign_advantages over the union: a group's baseline spans gateways

A gateway actor that dies takes its open rollouts with it: they come back masked
(`mask_reason` "gateway_died: ...", no rows, never reward 0) and the pool starts a replacement
with a fresh ledger. Needs the `ray` extra (`pip install 'rowgrove[ray]'`).
"""

from rowgrove.scale.episodes import EpisodeJob, EpisodeOutcome, HarnessResult, ScriptedHarness
from rowgrove.scale.pool import GatewayPool, StepRollouts, require_ray

__all__ = [
    "EpisodeJob",
    "EpisodeOutcome",
    "GatewayPool",
    "HarnessResult",
    "ScriptedHarness",
    "StepRollouts",
    "require_ray",
]
