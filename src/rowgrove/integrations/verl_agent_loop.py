"""A verl agent loop named "rowgrove": the rollout's agent talks to a rowgrove gateway instead of
verl's server manager, and the sequence verl trains is the gateway's row (the engine's own prompt
and sampled ids, its logprobs, a loss mask that is 1 only on sampled tokens).

verl's classic agent-loop path takes exactly one `AgentLoopOutput` per rollout
(verl/experimental/agent_loop/agent_loop.py, docs/advance/agent_loop.rst). A rollout that became
one row maps onto it exactly, and since a row is then a rollout, verl's own estimators see one
reward per rollout. A rollout that became several rows (compaction, sub-agents) cannot be
expressed there: `run` refuses it with an error naming `rows_to_dataproto`, the path that carries
any number of rows per rollout with their weights. Nothing is dropped silently.

Configure it with an agent-loop config file (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: rowgrove
      _target_: rowgrove.integrations.verl_agent_loop.RowgroveAgentLoop
      gateway_url: http://127.0.0.1:8000
      agent: my_package.agents:solve        # async def solve(client, prompt) -> Episode

and put `agent_name: rowgrove` in the dataset rows (or `actor_rollout_ref.rollout.agent.default_agent_loop=rowgrove`).
The gateway serves its own engine: keep its weights in step with the actor (rowgrove's engines
take `update_weights(state_dict)`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from rowgrove.errors import InputError
from rowgrove.integrations.harness import Agent, arollouts_to_rows

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register


def load_agent(spec: str) -> Agent:
    """`"package.module:function"` -> the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise InputError(f"agent {spec!r} is not 'package.module:function'")
    return getattr(importlib.import_module(module), name)


@register("rowgrove")
class RowgroveAgentLoop(AgentLoopBase):
    """`run` creates a gateway rollout in the prompt's group (verl's `uid`), runs the agent with an
    OpenAI client pointed at it, finishes it with the agent's reward, and returns the rollout's
    one row as an AgentLoopOutput (prompt = the row's tokens before its first sampled token,
    response = the rest, `response_mask` = its loss mask there, `response_logprobs` = the
    engine's, `reward_score` = the rollout's reward; `extra_fields["rollout_id"]`)."""

    def __init__(self, *args: Any, gateway_url: str | None = None, agent: str | None = None,
                 admin_key: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gateway_url = gateway_url or os.environ.get("ROWGROVE_GATEWAY_URL")
        spec = agent or os.environ.get("ROWGROVE_AGENT")
        if not self.gateway_url or not spec:
            raise InputError("the rowgrove agent loop needs gateway_url and agent ('package.module:function'): set "
                             "them in the agent-loop config file, or ROWGROVE_GATEWAY_URL and ROWGROVE_AGENT")
        self.agent = load_agent(spec)
        self.admin_key = admin_key

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt = kwargs.get("raw_prompt")
        group = kwargs.get("uid", kwargs.get("index"))
        if prompt is None or group is None:
            raise InputError("the rowgrove agent loop needs raw_prompt and uid from verl's batch")
        rows = await arollouts_to_rows(self.gateway_url, [list(prompt)], self.agent, group_ids=[str(group)],
                                       admin_key=self.admin_key)
        if len(rows) != 1:
            raise InputError(
                f"rollout {rows[0].rollout_id if rows else '?'} became {len(rows)} rows (compaction, sub-agents or "
                "retries that rewrote context); verl's agent loop carries one sequence per rollout. Train such "
                "rollouts through rowgrove.integrations.verl.rows_to_dataproto, which keeps every row and its weight"
            )
        row = rows[0]
        mask = np.asarray(row.loss_mask) != 0
        start = int(mask.argmax()) if mask.any() else len(mask)
        ids = [int(x) for x in row.input_ids]
        return AgentLoopOutput(
            prompt_ids=ids[:start], response_ids=ids[start:],
            response_mask=[int(x) for x in mask[start:]],
            response_logprobs=[float(x) for x in np.asarray(row.logprobs)[start:]],
            reward_score=None if not row.valid else float(row.reward),
            num_turns=2 * len(row.call_ids),
            metrics=AgentLoopMetrics(),
            extra_fields={"rollout_id": row.rollout_id, "rowgrove_valid": bool(row.valid),
                          "rowgrove_mask_reason": row.mask_reason},
        )


__all__ = ["RowgroveAgentLoop", "load_agent"]
