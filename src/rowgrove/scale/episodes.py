"""One harness episode against one gateway, as a Ray task runs it: create the rollout, run the
harness on the rollout's base_url, finish it, read back its rows.

The task never raises for a failure the step should survive: an unreachable gateway, a refused
control route or a harness that raises come back as an `EpisodeOutcome` with `mask_reason` (and
no rows), so an infrastructure failure is a masked rollout, never a reward of 0. Rows come from
the gateway's own `GET /v1/rollouts/{id}/rows` as soon as the rollout is finished, so a gateway
that dies later does not take finished rollouts with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from rowgrove.types import Row

Message = dict[str, Any]


@dataclass
class HarnessResult:
    """What a harness hands back: its accepted conversation, the reward, its own validity."""

    messages: list[Message]
    reward: float
    valid: bool = True
    calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)


# async (base_url, api_key) -> HarnessResult; must be picklable (it travels to a Ray worker)
Harness = Callable[[str, str], Awaitable[HarnessResult]]


@dataclass
class EpisodeJob:
    """One rollout to run: its group (GRPO's baseline is per group, across gateways), the harness,
    and metadata stored with the rollout. `key` names the job in the step's outcomes."""

    key: str
    group_id: str
    harness: Harness
    metadata: dict[str, Any] | None = None


@dataclass
class EpisodeOutcome:
    """What became of one job. `slot`/`generation` name the gateway actor it ran on (a replaced
    actor has the next generation). A masked outcome has `mask_reason`, `reward` None and no rows."""

    key: str
    group_id: str
    slot: int
    generation: int
    rollout_id: str | None
    reward: float | None
    rows: list[Row] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    invalid_reason: str | None = None
    mask_reason: str | None = None
    calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class ScriptedHarness:
    """A harness for tests and benchmarks: `turns` user messages, each answered through the
    official `openai` SDK by the gateway's scripted engine with `replies[i]` (the `script` field),
    `pause` seconds between calls; the accepted conversation is every turn, the reward is fixed."""

    replies: list[str]
    reward: float
    pause: float = 0.0
    model: str = "policy"

    async def __call__(self, base_url: str, api_key: str) -> HarnessResult:
        import openai

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                    timeout=httpx.Timeout(60.0, connect=5.0))
        messages: list[Message] = []
        try:
            for i, reply in enumerate(self.replies):
                messages.append({"role": "user", "content": f"turn {i}"})
                out = await client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                           max_tokens=32, extra_body={"script": reply})
                messages.append({"role": "assistant", "content": out.choices[0].message.content})
                if self.pause:
                    await asyncio.sleep(self.pause)
        finally:
            await client.close()
        return HarnessResult(messages=messages, reward=self.reward, calls=len(self.replies))


@dataclass
class AgentHarness:
    """The reference agent (`rowgrove.agents.run_episode`) on one task of env `env`, as a harness:
    what `rowgrove train --ray` runs in each episode task. `extra_body(action, attempt)` gives
    each model call's extra fields (the trainer's sampling seeds). A model call that fails after
    the SDK's retries ends the episode invalid (masked by its rows), as in
    `rowgrove.agents.run_rollout`."""

    env: str
    env_seed: int
    task: Any
    config: Any
    extra_body: Any = None

    async def __call__(self, base_url: str, api_key: str) -> HarnessResult:
        import openai

        from rowgrove.agents.loop import run_episode as agent_episode
        from rowgrove.envs import make_env

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2,
                                    timeout=httpx.Timeout(300.0, connect=10.0))
        try:
            res = await agent_episode(client, make_env(self.env, self.env_seed), self.task, self.config,
                                      model="policy", extra_body=self.extra_body)
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            return HarnessResult(messages=[{"role": "user", "content": self.task.prompt}], reward=0.0, valid=False,
                                 info={"end": "error", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            await client.close()
        return HarnessResult(messages=res.messages, reward=res.reward, valid=res.valid, calls=res.calls,
                             info={**res.info, "actions": res.actions, "rejected": res.rejected,
                                   "compactions": res.compactions})


async def _episode(gateway_url: str, job: EpisodeJob, slot: int, generation: int) -> EpisodeOutcome:
    from rowgrove.assemble import row_from_json

    out = EpisodeOutcome(key=job.key, group_id=job.group_id, slot=slot, generation=generation,
                         rollout_id=None, reward=None)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=gateway_url, timeout=httpx.Timeout(120.0, connect=5.0)) as http:
        step = "create"
        try:
            r = await http.post("/v1/rollouts", json={"group_id": job.group_id, "metadata": job.metadata or {}})
            r.raise_for_status()
            created = r.json()
            out.rollout_id = created["rollout_id"]
            base_url = created["base_url"]
            if base_url.startswith("/"):
                base_url = gateway_url.rstrip("/") + base_url
            auth = {"authorization": f"Bearer {created['api_key']}"}
            t1 = time.perf_counter()
            step = "harness"
            result = await job.harness(base_url, created["api_key"])
            t2 = time.perf_counter()
            step = "finish"
            body: dict[str, Any] = {"messages": result.messages, "reward": result.reward}
            if not result.valid:
                body["valid"] = False
            r = await http.post(f"/v1/rollouts/{out.rollout_id}/finish", json=body, headers=auth)
            r.raise_for_status()
            step = "rows"
            r = await http.get(f"/v1/rollouts/{out.rollout_id}/rows", headers=auth)
            r.raise_for_status()
            got = r.json()
            t3 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - any failure masks this rollout; the step goes on
            out.mask_reason = f"episode_failed at {step}: {type(e).__name__}: {str(e)[:200]}"
            out.seconds = time.perf_counter() - t0
            return out
    out.reward = float(result.reward)
    out.calls = result.calls
    out.info = dict(result.info)
    out.rows = [row_from_json(d) for d in got["rows"]]
    out.metrics = dict(got.get("metrics") or {})
    out.invalid_reason = got.get("invalid_reason")
    out.seconds = t3 - t0
    out.timings = {"create": t1 - t0, "harness": t2 - t1, "finish_and_rows": t3 - t2}
    return out


def run_episode(gateway_url: str, job: EpisodeJob, slot: int, generation: int) -> EpisodeOutcome:
    """Run `job` against the gateway at `gateway_url` (the body of the pool's Ray task)."""
    return asyncio.run(_episode(gateway_url, job, slot, generation))
