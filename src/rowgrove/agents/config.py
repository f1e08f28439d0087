"""The reference harness's configuration: one frozen dataclass, one line per field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rowgrove.errors import InputError

COMPACTIONS = ("none", "keep_last_rounds", "drop_reasoning", "collapse_env", "keep_newest_image")
ON_EXHAUSTED = ("invalid", "score")


@dataclass(frozen=True)
class AgentConfig:
    """How the reference harness runs one episode."""

    max_actions: int = 6
    """Most tool calls accepted in one episode; the episode ends after that many."""
    max_resamples: int = 2
    """Most retries of one action after a rejected response (so at most 1 + this many calls)."""
    compaction: str = "none"
    """Context rewrite: "none" | "keep_last_rounds" | "drop_reasoning" | "collapse_env" |
    "keep_newest_image" (every call shows only the newest `keep_images` images; older image parts
    become a text note, as NeMo RL #4124's computer-use harness keeps only the newest screenshot)."""
    keep_images: int = 1
    """keep_newest_image: how many of the newest images every context keeps."""
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

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **defaults: Any) -> AgentConfig:
        """The config of `options` (e.g. a training config's `agent:` section) over `defaults`;
        InputError naming any option that is not a field, with the known ones."""
        known = [f.name for f in fields(cls)]
        unknown = [str(k) for k in options if k not in known]
        if unknown:
            import difflib

            named = ", ".join(
                repr(k) + "".join(f" (did you mean {m}?)" for m in difflib.get_close_matches(k, known, 1))
                for k in unknown
            )
            raise InputError(f"unknown agent option{'s' if len(unknown) > 1 else ''} {named}: "
                             f"known options are {', '.join(known)}")
        return cls(**{**defaults, **options})

    def __post_init__(self) -> None:
        for name in ("max_actions", "max_resamples", "keep_rounds", "every_k", "max_tokens", "keep_images"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise InputError(f"AgentConfig.{name} is an integer, got {getattr(self, name)!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise InputError(f"AgentConfig.temperature is a number, got {self.temperature!r}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise InputError(f"AgentConfig.system_prompt is a string or null, got {self.system_prompt!r}")
        if self.compaction not in COMPACTIONS:
            raise InputError(f"unknown compaction {self.compaction!r}: use one of {', '.join(COMPACTIONS)}")
        for name in ("max_actions", "keep_rounds", "every_k", "max_tokens", "keep_images"):
            if getattr(self, name) < 1:
                raise InputError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.on_exhausted not in ON_EXHAUSTED:
            raise InputError(f"unknown on_exhausted {self.on_exhausted!r}: use one of {', '.join(ON_EXHAUSTED)}")
        if self.max_resamples < 0:
            raise InputError(f"AgentConfig.max_resamples must be >= 0, got {self.max_resamples}")
