"""The reference agent harness: an OpenAI-client tool loop with bounded resampling and context
compaction policies, and helpers that run it as gateway rollouts for a trainer.

    run_episode(client, env, task, config)        one episode with any AsyncOpenAI-like client
    run_rollout(gateway_url, group_id, ...)       create → episode → finish, through the gateway
    run_rollouts_concurrently(gateway_url, jobs)  a trainer step's rollouts
"""

from __future__ import annotations

from rowgrove.agents.compaction import COLLAPSED, collapse_env, compact, drop_reasoning, keep_last_rounds
from rowgrove.agents.config import COMPACTIONS, AgentConfig
from rowgrove.agents.loop import EpisodeResult, assistant_dict, check_response, run_episode
from rowgrove.agents.rollout import RolloutError, RolloutJob, run_rollout, run_rollouts_concurrently

__all__ = [
    "COLLAPSED", "COMPACTIONS", "AgentConfig", "EpisodeResult", "RolloutError", "RolloutJob", "assistant_dict",
    "check_response", "collapse_env", "compact", "drop_reasoning", "keep_last_rounds", "run_episode",
    "run_rollout", "run_rollouts_concurrently",
]
