"""Running the reference harness as gateway rollouts: create the rollout, run the episode with the
official `openai` SDK against the rollout's base_url, finish it with the accepted conversation
and the reward. `run_rollouts_concurrently` is what a trainer calls once per step.

    POST /v1/rollouts {group_id}  ──►  AsyncOpenAI(base_url, api_key)  ──►  run_episode
                                                                              │
    POST /v1/rollouts/{id}/finish {messages, reward[, valid: false]}  ◄───────┘
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from rowgrove.agents.config import AgentConfig
from rowgrove.agents.loop import EpisodeResult, ExtraBody, run_episode
from rowgrove.envs.base import Env, Task
from rowgrove.errors import RowgroveError

log = logging.getLogger(__name__)


class RolloutError(RowgroveError):
    """A gateway control route (create or finish) refused a rollout; the message has its answer."""


@dataclass
class RolloutJob:
    """One rollout to run: its group (the prompt's id), a fresh env (one per job: envs hold an
    episode's state), the task, the harness config and optional metadata stored with it."""

    group_id: str
    env: Env
    task: Task
    config: AgentConfig
    metadata: dict[str, Any] | None = None
    extra_body: ExtraBody = None


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = await http.post(url, json=body, headers=headers)
    if r.status_code >= 400:
        raise RolloutError(f"POST {url} answered {r.status_code}: {r.text[:500]}")
    return r.json()


async def run_rollout(gateway_url: str, group_id: str, env: Env, task: Task, config: AgentConfig, *,
                      http: httpx.AsyncClient | None = None, metadata: dict[str, Any] | None = None,
                      admin_key: str | None = None, model: str = "policy",
                      extra_body: ExtraBody = None) -> EpisodeResult:
    """Create a rollout of `group_id`, run one episode through the gateway, finish the rollout.

    The result's `info["rollout_id"]` names the rollout. If the episode fails (the model call
    errors after the SDK's 2 retries), the rollout is finished as invalid (`valid: false`, reward 0,
    only the prompt as messages) so that it is masked with a reason, and the result has
    `valid=False` and `info["error"]`; create/finish failures raise RolloutError. `http` is reused (and not
    closed) when given; `admin_key` is the gateway's admin key, if it has one.
    """
    own = http is None
    client_http = http or httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
    base = gateway_url.rstrip("/")
    try:
        body: dict[str, Any] = {"group_id": group_id}
        if metadata:
            body["metadata"] = metadata
        created = await _post(client_http, f"{base}/v1/rollouts", body, admin_key)
        rollout_id = created["rollout_id"]
        base_url = created["base_url"]
        if base_url.startswith("/"):
            base_url = base + base_url
        client = openai.AsyncOpenAI(base_url=base_url, api_key=created["api_key"], max_retries=2,
                                    http_client=client_http)
        try:
            result = await run_episode(client, env, task, config, model=model, extra_body=extra_body)
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            log.warning("rollout %s (group %s) failed: %s", rollout_id, group_id, exc)
            prompt = [{"role": "user", "content": task.prompt}]
            result = EpisodeResult(messages=prompt, reward=0.0, actions=0, rejected=0, compactions=0,
                                   calls=0, valid=False, info={"end": "error", "error": f"{type(exc).__name__}: {exc}"})
        finish: dict[str, Any] = {"messages": result.messages, "reward": result.reward}
        if not result.valid:
            finish["valid"] = False
        await _post(client_http, f"{base}/v1/rollouts/{rollout_id}/finish", finish, created["api_key"])
        result.info["rollout_id"] = rollout_id
        result.info["group_id"] = group_id
        return result
    finally:
        if own:
            await client_http.aclose()


async def run_rollouts_concurrently(gateway_url: str, jobs: list[RolloutJob], concurrency: int = 16, *,
                                    admin_key: str | None = None, model: str = "policy") -> list[EpisodeResult]:
    """Run every job as a rollout, at most `concurrency` at a time, sharing one HTTP client;
    results in job order. A job whose create/finish fails raises (after the others finish)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0), limits=limits) as http:
        async def one(job: RolloutJob) -> EpisodeResult:
            async with sem:
                return await run_rollout(gateway_url, job.group_id, job.env, job.task, job.config, http=http,
                                         metadata=job.metadata, admin_key=admin_key, model=model,
                                         extra_body=job.extra_body)

        outcomes = await asyncio.gather(*(one(j) for j in jobs), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise RolloutError(f"{len(errors)} of {len(jobs)} rollouts could not be created or finished; "
                           f"first: {errors[0]}") from errors[0]
    return [o for o in outcomes if isinstance(o, EpisodeResult)]
