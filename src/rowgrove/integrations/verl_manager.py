"""verl's agent-loop manager and worker, taught that one rollout may be several sequences.

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=rowgrove.integrations.verl_manager.RowgroveAgentLoopManager

verl 0.9.1's classic `AgentLoopWorker` (verl/experimental/agent_loop/agent_loop.py) runs one agent
loop per input and pads its one `AgentLoopOutput` into one row of the DataProto. The "rowgrove"
agent loop returns one output per training row (a compacted rollout: one per context). This
worker (a subclass: `_run_agent_loop` and `_postprocess` only) pads each of them as verl pads
one, and builds the batch over all of them, the input's non-tensor fields repeated per sequence;
the manager runs it as verl runs its own (`ray.remote` actors, chunks of the input) and adds what
rowgrove's weighting needs:

  - `uid` becomes a `rowgrove.integrations.verl.RolloutKey` (a str equal to verl's uid, carrying the
    sequence's rollout id and the update's settings), so verl's `compute_advantage` with
    `algorithm.adv_estimator=rowgrove` groups by prompt and counts each rollout once;
  - `rowgrove_weights` [sequences, response_length]: `rowgrove.algo.loss_weights` per response
    token ("token-mean" or "rollout-mean", the loop's `loss_mode`), the rows of a rollout summing
    to its share of the update whatever their number; `meta_info["rowgrove"]` the counts.

Sequences of invalid rollouts (an engine error, a timeout: `rowgrove_valid` False) are left out
and counted; they are never trained with reward 0.

The batch has more sequences than the input had prompts. verl's legacy `RayPPOTrainer.fit`
(`trainer.use_v1=False`) slices the manager's output to the input's length and unions it with
the repeated prompt batch, so it takes exactly one sequence per rollout: with it, a rollout of
several rows cannot be trained (docs/integrations.md). The batch from `generate_sequences` is
complete for a caller that trains on it (`compute_advantage`, the actor's update).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import ray

from rowgrove.errors import InputError, name_some
from rowgrove.integrations.verl import AGG_MODES, RolloutKey
from rowgrove.integrations.verl_agent_loop import RowgroveAgentLoop
from rowgrove.integrations.weighting import weigh_rows
from rowgrove.types import Row

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopManager,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await
from verl.utils.rollout_trace import rollout_trace_attr


class RowgroveAgentLoopWorker(AgentLoopWorker):
    """verl's AgentLoopWorker; an agent loop may return a list of outputs, each one sequence."""

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *,
                              agent_name: str, trace: bool = True, **kwargs: Any) -> list[Any]:
        """verl's `_run_agent_loop` (the loop instantiated with the same arguments), returning the
        padded outputs as a list; a rowgrove loop is told it may return several and the batch's
        `global_steps`."""
        import hydra

        with rollout_trace_attr(step=trajectory["step"], sample_index=trajectory["sample_index"],
                                rollout_n=trajectory["rollout_n"], validate=trajectory["validate"],
                                name="agent_loop", trace=trace):
            if agent_name not in _agent_loop_registry:
                raise InputError(f"agent loop {agent_name!r} is not registered (registered: "
                                 f"{', '.join(_agent_loop_registry)})")
            loop = hydra.utils.instantiate(
                config=_agent_loop_registry[agent_name], trainer_config=DictConfigWrap(config=self.config),
                server_manager=self.llm_client, tokenizer=self.tokenizer, processor=self.processor,
                hf_model_type=self.hf_model_type, dataset_cls=self.dataset_cls,
                data_config=DictConfigWrap(self.config.data), tools=ToolListWrap(self.tools))
            if isinstance(loop, RowgroveAgentLoop):
                loop.many_rows = True
                loop.global_steps = trajectory["step"]
            output = await loop.run(sampling_params, **kwargs)
            outputs = output if isinstance(output, list) else [output]
            return [await self._agent_loop_postprocess(o, trajectory["validate"], **kwargs) for o in outputs]

    def _postprocess(self, inputs: list[Any], input_non_tensor_batch: dict | None = None,
                     validate: bool = False) -> DataProto:
        """verl's `_postprocess` over every sequence of every input (invalid rollouts' left out),
        the input's non-tensor fields repeated per sequence; `rowgrove_invalid_sequences` in
        meta_info counts what was left out."""
        kept = [[o for o in outs if o.extra_fields.get("rowgrove_valid", True)] for outs in inputs]
        dropped = sum(len(a) - len(b) for a, b in zip(inputs, kept, strict=True))
        counts = [len(k) for k in kept]
        flat = [o for k in kept for o in k]
        if not flat:
            raise InputError(f"every one of the {len(inputs)} rollouts of this chunk is invalid (engine errors or "
                             "timeouts, see the gateway's mask reasons): nothing to train on")
        repeated = None
        if input_non_tensor_batch:
            repeated = {k: np.repeat(v, counts, axis=0) for k, v in input_non_tensor_batch.items()}
        data = super()._postprocess(flat, input_non_tensor_batch=repeated, validate=validate)
        data.meta_info["rowgrove_invalid_sequences"] = dropped
        return data


def rowgrove_batch(data: DataProto, *, loss_agg_mode: str, estimator: str = "grpo",
                   scale_by_std: bool = True) -> DataProto:
    """Mark a batch of rowgrove sequences for verl's "rowgrove" estimator and attach their loss
    weights (see the module docstring). Every sequence must come from the rowgrove agent loop
    (a `rollout_id`) and carry a reward (`rm_scores`); the loss mode is the loop's."""
    if loss_agg_mode not in AGG_MODES:
        raise InputError(f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode!r} cannot carry rowgrove's weights: "
                         "use token-sum (or token-mean); sequence modes divide by rows")
    nt = data.non_tensor_batch
    rids = nt.get("rollout_id")
    missing = [i for i in range(len(data)) if rids is None or rids[i] is None]
    if missing:
        raise InputError(f"{len(missing)} sequences (positions {name_some(missing)}) do not come from the rowgrove "
                         "agent loop: with RowgroveAgentLoopManager every sample needs agent_name=rowgrove")
    if "rm_scores" not in data.batch.keys():
        raise InputError("the batch has no rm_scores: every rowgrove sequence carries its rollout's reward")
    modes = sorted({str(m) for m in nt["rowgrove_loss_mode"]})
    if len(modes) != 1:
        raise InputError(f"one update needs one loss mode, the batch has {modes}")
    mode = modes[0]
    mask = data.batch["response_mask"].cpu().numpy() != 0
    rewards = data.batch["rm_scores"].double().sum(-1).cpu().numpy()
    uids = [str(u) for u in nt["uid"]]
    rows = [Row(rollout_id=str(r), group_id=u, input_ids=np.zeros(m.size + 1, np.int32),
                loss_mask=np.concatenate([[0], m]).astype(np.int32), reward=float(x),
                logprobs=np.zeros(m.size + 1, np.float32))
            for r, u, m, x in zip(rids, uids, mask, rewards, strict=True)]
    weighted = weigh_rows(rows, loss_mode=mode, estimator=estimator, scale_by_std=scale_by_std)
    weights = np.zeros(mask.shape, np.float32)
    for w in weighted.rows:
        weights[w.index] = w.weight_T[1:]
    import torch

    data.batch["rowgrove_weights"] = torch.as_tensor(weights)
    keys = np.empty(len(data), dtype=object)
    keys[:] = [RolloutKey(u, str(r), mode, loss_agg_mode, estimator, scale_by_std) for u, r in zip(uids, rids, strict=True)]
    nt["uid"] = keys
    data.meta_info["rowgrove"] = {"loss_mode": mode, "loss_agg_mode": loss_agg_mode, "estimator": estimator,
                                  "sequences": len(data), "rollouts": len(weighted.rollout_ids),
                                  "dropped_empty_rows": weighted.dropped_empty}
    return data


class RowgroveAgentLoopManager(AgentLoopManager):
    """verl's AgentLoopManager with `RowgroveAgentLoopWorker` actors; `generate_sequences` returns
    every rollout's rows as sequences, marked by `rowgrove_batch` with verl's config
    (`actor.loss_agg_mode`, `algorithm.norm_adv_by_std_in_grpo`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.agent_loop_workers_class = ray.remote(RowgroveAgentLoopWorker)
        super().__init__(*args, **kwargs)

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        """As verl's (priority per sample, chunks to the workers, concat, timing), then `rowgrove_batch`."""
        if "priority" not in prompts.non_tensor_batch:
            prompts.non_tensor_batch["priority"] = np.arange(len(prompts), dtype=np.int64)
        chunks = prompts.chunk(len(self.agent_loop_workers))
        outputs = await asyncio.gather(*[w.generate_sequences.remote(c)
                                         for w, c in zip(self.agent_loop_workers, chunks, strict=True)])
        dropped = sum(o.meta_info.pop("rowgrove_invalid_sequences", 0) for o in outputs)
        output = DataProto.concat(outputs)
        metrics = [o.meta_info.pop("metrics") for o in outputs]
        timing = self._performance_metrics(metrics, output)
        output.meta_info = {"timing": timing, **outputs[0].meta_info}
        actor = self.config.actor_rollout_ref.actor
        output = rowgrove_batch(output, loss_agg_mode=str(actor.get("loss_agg_mode", "token-mean")),
                                scale_by_std=bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", True)))
        output.meta_info["rowgrove"]["dropped_invalid_sequences"] = dropped
        return output


__all__ = ["RowgroveAgentLoopManager", "RowgroveAgentLoopWorker", "rowgrove_batch"]
