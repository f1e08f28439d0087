"""Run an agent against a rowgrove gateway for a batch of prompts and get the rows back, so that
a trainer's `rows_fn` is one line:

    rows_fn = lambda prompts, trainer: rollouts_to_rows(GATEWAY_URL, prompts, my_agent)

`agent(client, prompt)` is any async function that talks to the model only through `client` (an
`openai.AsyncOpenAI` pointed at the rollout's base_url) and returns an `Episode`: the harness's
accepted conversation (every accepted assistant turn, across compactions; or `conversations`,
one per sub-agent) and the reward. The gateway records every call; the rows come back from
`GET /v1/rollouts/{id}/rows`, one per chain of accepted calls, with the engine's tokens and
logprobs.

Groups: rollouts of the same prompt in one call form one group (the prompt's own id when
`group_ids` is given, else a hash of the prompt and a per-call nonce), so a trainer that repeats
each prompt `num_generations` times (TRL) gets one group per prompt, explicitly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rowgrove.errors import InputError, RowgroveError
from rowgrove.types import Row


@dataclass
class Episode:
    """What an agent returns: `messages` (its accepted conversation) or `conversations` (several:
    sub-agents), the rollout's `reward`, and `valid=False` when it failed for a reason that is not
    the model's (the rollout is then masked, never trained with reward 0)."""

    reward: float
    messages: list[dict[str, Any]] | None = None
    conversations: list[list[dict[str, Any]]] | None = None
    valid: bool = True


Agent = Callable[[Any, Any], Awaitable[Episode]]


class HarnessError(RowgroveError):
    """A gateway control route refused a rollout (create, finish or rows); the message has its answer."""


def prompt_group_ids(prompts: Sequence[Any]) -> list[str]:
    """One group id per prompt: equal prompts (text or message lists) share it; a nonce keeps
    groups of different calls apart."""
    nonce = uuid.uuid4().hex[:8]
    return [f"{nonce}:{hashlib.sha1(json.dumps(p, sort_keys=True, default=str).encode()).hexdigest()[:12]}"
            for p in prompts]


async def arollouts_to_rows(gateway_url: str, prompts: Sequence[Any], agent: Agent, *,
                            group_ids: Sequence[str] | None = None, concurrency: int = 8,
                            admin_key: str | None = None, timeout: float = 300.0) -> list[Row]:
    """The async form of `rollouts_to_rows`."""
    import httpx
    import openai

    from rowgrove.assemble.io import row_from_json

    prompts = list(prompts)
    if group_ids is None:
        group_ids = prompt_group_ids(prompts)
    if len(group_ids) != len(prompts):
        raise InputError(f"{len(prompts)} prompts but {len(group_ids)} group ids: give one per prompt")
    if concurrency < 1:
        raise InputError(f"concurrency must be >= 1, got {concurrency}")
    base = gateway_url.rstrip("/")
    admin = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    sem = asyncio.Semaphore(concurrency)

    async def call(http: httpx.AsyncClient, method: str, url: str, body: Any = None, key: str | None = None) -> Any:
        headers = {"authorization": f"Bearer {key}"} if key else admin
        r = await http.request(method, url, json=body, headers=headers)
        if r.status_code >= 400:
            raise HarnessError(f"{method} {url} answered {r.status_code}: {r.text[:500]}")
        return r.json()

    async def one(http: httpx.AsyncClient, prompt: Any, group_id: str) -> list[Row]:
        async with sem:
            created = await call(http, "POST", f"{base}/v1/rollouts", {"group_id": group_id})
            url = created["base_url"]
            url = base + url if url.startswith("/") else url
            client = openai.AsyncOpenAI(base_url=url, api_key=created["api_key"], http_client=http, max_retries=2)
            ep = await agent(client, prompt)
            if not isinstance(ep, Episode) or (ep.messages is None) == (ep.conversations is None):
                raise InputError("the agent must return an Episode with messages or conversations (one of them)")
            body: dict[str, Any] = {"reward": ep.reward}
            body["messages" if ep.messages is not None else "conversations"] = (
                ep.messages if ep.messages is not None else ep.conversations)
            if not ep.valid:
                body["valid"] = False
            rid = created["rollout_id"]
            await call(http, "POST", f"{base}/v1/rollouts/{rid}/finish", body, created["api_key"])
            got = await call(http, "GET", f"{base}/v1/rollouts/{rid}/rows", key=created["api_key"])
            return [row_from_json(r) for r in got["rows"]]

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0)) as http:
        parts = await asyncio.gather(*(one(http, p, g) for p, g in zip(prompts, group_ids, strict=True)))
    return [row for part in parts for row in part]


def rollouts_to_rows(gateway_url: str, prompts: Sequence[Any], agent: Agent, *,
                     group_ids: Sequence[str] | None = None, concurrency: int = 8,
                     admin_key: str | None = None, timeout: float = 300.0) -> list[Row]:
    """Run `agent` once per prompt entry as a gateway rollout (create, run, finish) and return
    every rollout's rows, in prompt order (a rollout's rows in segment order). Blocks; call it
    from synchronous code (a trainer's rows_fn). Raises HarnessError when a control route
    refuses a rollout, and whatever the agent raises."""
    return asyncio.run(arollouts_to_rows(gateway_url, prompts, agent, group_ids=group_ids, concurrency=concurrency,
                                         admin_key=admin_key, timeout=timeout))


__all__ = ["Agent", "Episode", "HarnessError", "arollouts_to_rows", "prompt_group_ids", "rollouts_to_rows"]
