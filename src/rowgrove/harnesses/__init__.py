"""Coding-agent CLIs run unmodified through a gateway: `run` drives N rollouts of one group (the
`rowgrove run` command), `known` points each known harness (codex, claude, qwen, opencode, mini) at
its rollout by its own settings. Part of the core, not an optional adapter: it needs only the
harness's own executable."""

from rowgrove.harnesses.run import RolloutResult, RunError, run_group

__all__ = ["RolloutResult", "RunError", "run_group"]
