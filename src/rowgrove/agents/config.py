"""The reference harness's configuration: one frozen dataclass, one line per field."""

from __future__ import annotations

from dataclasses import dataclass

from rowgrove.errors import InputError

COMPACTIONS = ("none", "keep_last_rounds", "drop_reasoning", "collapse_env")
ON_EXHAUSTED = ("invalid", "score")


@dataclass(frozen=True)
class AgentConfig:
    """How the reference harness runs one episode."""

    max_actions: int = 6
    """Most tool calls accepted in one episode; the episode ends after that many."""
    max_resamples: int = 2
    """Most retries of one action after a rejected response (so at most 1 + this many calls)."""
    compaction: str = "none"
    """Context rewrite: "none" | "keep_last_rounds" | "drop_reasoning" | "collapse_env"."""
    keep_rounds: int = 1
    """keep_last_rounds: tool rounds (assistant turn + its tool results) kept after a compaction."""
    every_k: int = 2
    """Compact after every k-th accepted assistant turn (all policies); 1 compacts after each."""
    temperature: float = 1.0
    """Sampling temperature sent with every model call."""
    max_tokens: int = 64
    """Most tokens per model response."""
    system_prompt: str | None = None
    """A system message put first in every context, or None for the template's default."""
    on_exhausted: str = "invalid"
    """When every resample of an action was rejected: "invalid" finishes the rollout masked (its
    reward was decided by responses that are never trained, so it must not push its accepted
    turns down), "score" keeps the environment's reward so far."""

    def __post_init__(self) -> None:
        if self.compaction not in COMPACTIONS:
            raise InputError(f"unknown compaction {self.compaction!r}: use one of {', '.join(COMPACTIONS)}")
        for name in ("max_actions", "keep_rounds", "every_k", "max_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.on_exhausted not in ON_EXHAUSTED:
            raise InputError(f"unknown on_exhausted {self.on_exhausted!r}: use one of {', '.join(ON_EXHAUSTED)}")
        if self.max_resamples < 0:
            raise InputError(f"AgentConfig.max_resamples must be >= 0, got {self.max_resamples}")
