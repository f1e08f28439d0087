"""A verl agent loop named "rowgrove": the rollout's agent talks to a rowgrove gateway that samples
through the `server_manager` verl hands the loop, and every row the rollout became is a sequence
of verl's batch (the engine's own prompt and sampled ids, its logprobs, a loss mask that is 1 only
on sampled tokens, the weight version = verl's `global_steps` of the server's weights).

Sampling. Each AgentLoopWorker process runs one gateway (in a thread, on loopback), started by
its first rowgrove loop, whose engine is `rowgrove.engines.verl_server.VerlServerEngine` over that
worker's `server_manager` (`LLMServerClient.generate`): the calls go to the same vLLM/SGLang
servers verl's own loops use, which verl's checkpoint engine updates after every step, so the
sampler is the actor's weights with no second weight path.

Rows. `run` returns one `AgentLoopOutput` per row, as a list when there are several: the form
verl 0.9.1's own multi-output path takes (`verl/trainer/ppo/v1/agent_loop_tq.py`,
`AgentLoopWorkerTQ._agent_loop_postprocess`: "agent loop may has multiple outputs"). verl's
classic `AgentLoopWorker` takes exactly one output per rollout; under it a rollout of several
rows is refused with an error naming the worker that takes them
(`rowgrove.integrations.verl_manager.RowgroveAgentLoopManager`, set as
`actor_rollout_ref.rollout.agent.agent_loop_manager_class`). Nothing is dropped silently.

Configure it with an agent-loop config file (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: rowgrove
      _target_: rowgrove.integrations.verl_agent_loop.RowgroveAgentLoop
      agent: my_package.agents:solve        # async def solve(client, prompt) -> Episode
      loss_mode: token-mean                 # or rollout-mean (rowgrove.algo.loss_weights)

and `agent_name: rowgrove` in the dataset rows (or `actor_rollout_ref.rollout.agent.default_agent_loop=rowgrove`).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import Any

import numpy as np

from rowgrove.errors import InputError
from rowgrove.integrations.harness import Agent, arollouts_to_rows
from rowgrove.integrations.weighting import check_mode
from rowgrove.types import Row

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, _agent_loop_registry

MANAGER = "rowgrove.integrations.verl_manager.RowgroveAgentLoopManager"


def load_agent(spec: str) -> Agent:
    """`"package.module:function"` -> the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise InputError(f"agent {spec!r} is not 'package.module:function'")
    return getattr(importlib.import_module(module), name)


class _WorkerGateway:
    """The gateway of one worker process over one server manager, and its engine."""

    def __init__(self, handle: Any, engine: Any):
        self.handle = handle
        self.engine = engine


_GATEWAYS: dict[int, asyncio.Future] = {}


async def worker_gateway(server_manager: Any, tokenizer: Any) -> _WorkerGateway:
    """The gateway this process runs over `server_manager` (started on first use, in a thread, on
    a free loopback port, its ledger in a temporary folder; the same one for every later loop of
    the worker). Its engine awaits the manager on the calling (the worker's) event loop."""
    if server_manager is None:
        raise InputError("the rowgrove agent loop got no server_manager: run it inside verl's AgentLoopWorker, "
                         "which hands every loop its LLMServerClient")
    key = id(server_manager)
    fut = _GATEWAYS.get(key)
    if fut is None:
        loop = asyncio.get_running_loop()
        fut = _GATEWAYS[key] = loop.create_future()
        try:
            from rowgrove.engines.verl_server import VerlServerEngine
            from rowgrove.gateway.testing import launch_gateway

            engine = VerlServerEngine(server_manager, tokenizer, loop=loop)
            handle = await loop.run_in_executor(None, lambda: launch_gateway(engine=engine, model_name="policy"))
            fut.set_result(_WorkerGateway(handle, engine))
        except BaseException as e:
            del _GATEWAYS[key]
            fut.set_exception(e)
            raise
    return await asyncio.shield(fut)


def row_output(row: Row, *, loss_mode: str, prompt_length: int, response_length: int) -> AgentLoopOutput:
    """One row as verl's AgentLoopOutput: prompt = the tokens before its first sampled token,
    response = the rest, `response_mask` = its loss mask there, `response_logprobs` = the engine's,
    `reward_score` = the rollout's reward (None for an invalid rollout); `extra_fields` name the
    rollout, the row, its validity and weight versions, and the loss mode."""
    mask = np.asarray(row.loss_mask) != 0
    start = int(mask.argmax()) if mask.any() else len(mask)
    ids = [int(x) for x in row.input_ids]
    if start > prompt_length or len(ids) - start > response_length:
        raise InputError(
            f"a row of rollout {row.rollout_id} has {start} prompt and {len(ids) - start} response tokens, over "
            f"actor_rollout_ref.rollout.prompt_length={prompt_length} / response_length={response_length}: "
            "raise them (rows are never truncated: that would drop sampled tokens)")
    versions = [int(v) for v in np.asarray(row.weight_versions)[mask]] if row.weight_versions is not None else []
    return AgentLoopOutput(
        prompt_ids=ids[:start], response_ids=ids[start:],
        response_mask=[int(x) for x in mask[start:]],
        response_logprobs=[float(x) for x in np.asarray(row.logprobs)[start:]],
        reward_score=None if not row.valid else float(row.reward),
        num_turns=2 * len(row.call_ids),
        metrics=AgentLoopMetrics(),
        extra_fields={"rollout_id": row.rollout_id, "rowgrove_segment": int(row.segment),
                      "rowgrove_valid": bool(row.valid), "rowgrove_mask_reason": row.mask_reason,
                      "rowgrove_loss_mode": loss_mode,
                      "min_global_steps": min(versions) if versions else None,
                      "max_global_steps": max(versions) if versions else None},
    )


class RowgroveAgentLoop(AgentLoopBase):
    """`run` creates a gateway rollout in the prompt's group (verl's `uid`), runs the agent with an
    OpenAI client pointed at it, finishes it with the agent's reward, and returns the rollout's
    rows as AgentLoopOutputs (`row_output`): one, or a list when the worker takes several
    (`many_rows`, set by rowgrove's worker; verl's v1 worker passes `session_id` and takes lists)."""

    many_rows = False

    def __init__(self, *args: Any, agent: str | None = None, loss_mode: str = "token-mean",
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        spec = agent or os.environ.get("ROWGROVE_AGENT")
        if not spec:
            raise InputError("the rowgrove agent loop needs agent ('package.module:function'): set it in the "
                             "agent-loop config file, or ROWGROVE_AGENT")
        check_mode(loss_mode)
        self.agent = load_agent(spec)
        self.loss_mode = loss_mode
        self.global_steps: int | None = None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        prompt = kwargs.get("raw_prompt")
        group = kwargs.get("uid", kwargs.get("index"))
        if prompt is None or group is None:
            raise InputError("the rowgrove agent loop needs raw_prompt and uid from verl's batch")
        gw = await worker_gateway(self.server_manager, self.tokenizer)
        steps = kwargs.get("global_steps", self.global_steps)
        if steps is not None and int(steps) >= 0:
            gw.engine.weights_version = int(steps)  # used only when a server reports no global_steps
        rows = await arollouts_to_rows(gw.handle.url, [list(prompt)], self.agent, group_ids=[str(group)])
        outs = [row_output(r, loss_mode=self.loss_mode, prompt_length=self.rollout_config.prompt_length,
                           response_length=self.rollout_config.response_length) for r in rows]
        if len(outs) == 1:
            return outs[0]
        if not (self.many_rows or "session_id" in kwargs):
            raise InputError(
                f"rollout {rows[0].rollout_id if rows else '?'} became {len(rows)} rows (compaction, sub-agents or "
                "retries that rewrote context) and verl's classic AgentLoopWorker carries one sequence per rollout: "
                f"set actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}, whose worker puts every "
                "row in the batch with its weight")
        return outs


# registered like verl's `@register("rowgrove")`, but never over an entry an agent-loop config file
# already made (importing this module late, inside a worker, must not drop that entry's `agent`)
_agent_loop_registry.setdefault("rowgrove", {"_target_": f"{__name__}.RowgroveAgentLoop"})

__all__ = ["MANAGER", "RowgroveAgentLoop", "load_agent", "row_output", "worker_gateway"]
