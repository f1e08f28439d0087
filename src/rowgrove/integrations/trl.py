"""rowgrove rows into TRL's GRPOTrainer (`pip install 'rowgrove[trl]'`, trl 1.16.0).

    trainer = RowgroveGRPOTrainer(model, args=GRPOConfig(loss_type="dapo", beta=0.0, ...),
                                  rows_fn=rows_fn, train_dataset=prompts, processing_class=tok)
    trainer.train()

`rows_fn(prompts, trainer) -> list[rowgrove.types.Row]` returns the rows of the finished rollouts
of one generation batch (from a gateway: any number of rows per rollout, any group sizes,
explicit group ids; `rowgrove.integrations.harness.rollouts_to_rows` makes it one line).

Why a subclass: TRL's `rollout_func` must return exactly one completion per prompt entry, and
GRPOTrainer computes advantages as `rewards.view(-1, num_generations)` (positional groups, no
group id) with no way to supply them; the maintainers advise overriding
`_generate_and_score_completions` (trl#4525). This class overrides it: the generation batch is
`rows_fn`'s rows, each row one TRL sequence (prompt = tokens before its first generated token,
completion = the rest; `tool_mask` = the row's loss mask, so tool output inside the completion
is context, not trained), `old_per_token_logps` = the engine's logprobs (the ratio is against the
sampler, as in rowgrove's own update), and the advantage of completion token t of row i is

    advantages[i, t] = A_rollout(i) * w[i][t]

with A from `rowgrove.algo.assign_advantages` and w from `rowgrove.algo.loss_weights(rows, mode)`.
TRL accepts (B, T) advantages. With `loss_type="dapo"` TRL's loss is
`sum(per_token_loss * mask) / normalizer`, `normalizer = num_items_in_batch / num_processes *
current_gradient_accumulation_steps / steps_per_generation`; this class sets `num_items_in_batch`
so the normalizer is exactly 1 (the constant C = 1), so the gradient accumulated over the
generation batch is rowgrove's, however TRL shuffles and cuts the rows into micro-batches. The
other loss types divide per sequence (grpo, sapo, luspo), per micro-batch (bnpo) or by a fixed
completion length (dr_grpo), or reweigh tokens (cispo, vespo); they are refused.

Also refused, each because it would add or reweigh terms rowgrove's loss does not have: beta != 0
(KL to a reference), an entropy bonus, top_entropy_quantile < 1, off_policy_mask_threshold,
delta (two-sided clipping), importance_sampling_level="sequence", use_vllm (generation happens
behind the gateway), steps_per_generation != gradient_accumulation_steps (TRL would cut one
generation batch into several optimizer steps by rows), and more than one process (the weights'
divisors are per process here). Rows are padded to a multiple of steps_per_generation with empty
rows (mask 0: they add nothing) because TRL's split drops a remainder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rowgrove.errors import InputError
from rowgrove.integrations.weighting import check_mode, padded_layout, weigh_rows
from rowgrove.types import Row

LOSS_TYPE = "dapo"

try:
    from trl import GRPOTrainer as _GRPOTrainer
except ImportError as e:  # the extra is not installed
    raise ImportError("rowgrove.integrations.trl needs TRL: pip install 'rowgrove[trl]' (trl==1.16.0)") from e


def _no_reward(*args: Any, **kwargs: Any) -> list[float]:
    raise InputError("RowgroveGRPOTrainer takes rewards from the rows (one per rollout), never from reward "
                     "functions; this placeholder should not be called")


def check_config(args: Any) -> None:
    """InputError naming every GRPOConfig setting under which TRL's loss would not be rowgrove's."""
    problems = []
    if args.loss_type != LOSS_TYPE:
        problems.append(f"loss_type='{LOSS_TYPE}' (is {args.loss_type!r}: it divides per sequence, per "
                        "micro-batch or by a fixed length, or reweighs tokens)")
    if args.beta != 0.0:
        problems.append("beta=0.0 (a KL term is not part of rowgrove's loss)")
    if getattr(args, "entropy_coef", 0.0) or getattr(args, "use_adaptive_entropy", False):
        problems.append("entropy_coef=0.0 and no adaptive entropy")
    if args.top_entropy_quantile < 1.0:
        problems.append("top_entropy_quantile=1.0")
    if args.off_policy_mask_threshold is not None:
        problems.append("off_policy_mask_threshold=None")
    if args.delta is not None:
        problems.append("delta=None (two-sided clipping)")
    if args.importance_sampling_level != "token":
        problems.append("importance_sampling_level='token'")
    if args.use_vllm:
        problems.append("use_vllm=False (generation happens behind the rowgrove gateway)")
    if args.steps_per_generation != args.gradient_accumulation_steps:
        problems.append(f"steps_per_generation == gradient_accumulation_steps (are {args.steps_per_generation} and "
                        f"{args.gradient_accumulation_steps}: TRL would cut one batch of rows into several updates)")
    if problems:
        raise InputError("TRL's loss would not be rowgrove's under this GRPOConfig; set " + "; ".join(problems))


class RowgroveGRPOTrainer(_GRPOTrainer):
    """GRPOTrainer whose generation batch is rowgrove rows and whose loss is rowgrove's.

    `rows_fn(prompts, trainer)` gets the generation batch's prompts (each dataset prompt repeated
    `num_generations` times, as TRL samples them) and returns rows of finished rollouts.
    `loss_mode` ("token-mean" | "rollout-mean"), `estimator` and `scale_by_std` are
    `rowgrove.algo`'s. Other keyword arguments go to GRPOTrainer (callbacks, optimizers, ...);
    `reward_funcs` are not taken: the reward is the rollout's, on its rows.
    """

    def __init__(self, model: Any, args: Any, rows_fn: Callable[[list[Any], Any], Sequence[Row]], *,
                 train_dataset: Any = None, processing_class: Any = None, loss_mode: str = "token-mean",
                 estimator: str = "grpo", scale_by_std: bool = True, **kwargs: Any):
        check_mode(loss_mode)
        check_config(args)
        if "reward_funcs" in kwargs or "rollout_func" in kwargs:
            raise InputError("RowgroveGRPOTrainer takes rows from rows_fn: do not pass reward_funcs or rollout_func")
        self.rows_fn = rows_fn
        self.loss_mode = loss_mode
        self.estimator = estimator
        self.scale_by_std = scale_by_std
        super().__init__(model=model, reward_funcs=[_no_reward], args=args, train_dataset=train_dataset,
                         processing_class=processing_class, **kwargs)
        if self.accelerator.num_processes > 1:
            raise InputError(f"RowgroveGRPOTrainer runs in one process (got {self.accelerator.num_processes}): "
                             "the loss weights' divisors would be per process")
        if self._entropy_bonus_enabled:
            raise InputError("TRL's loss would not be rowgrove's: set entropy_coef=0.0")
        self.last_rows: list[Row] = []

    # ---- the generation batch: rows -------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        prompts = [x.get("prompt") for x in inputs]
        rows = list(self.rows_fn(prompts, self))
        self.last_rows = rows
        weighted = weigh_rows(rows, loss_mode=self.loss_mode, estimator=self.estimator, scale_by_std=self.scale_by_std)
        pad = int(self._tokenizer.pad_token_id or 0)
        kept = weighted.rows
        S = self.args.steps_per_generation if self.model.training else 1
        n = len(kept) + (-len(kept)) % S
        P = max(w.start for w in kept)
        T = max(len(w.row.input_ids) - w.start for w in kept)
        lay = padded_layout(kept, pad=pad, prompt_len=P, response_len=T, n_rows=n)
        prompt_ids, prompt_mask = lay["prompts"], lay["prompt_mask"]
        completion_ids, completion_mask, tool_mask = lay["responses"], lay["response_attention"], lay["loss_mask"]
        adv, old = lay["coef"], lay["logprobs"]
        prompt_mask[len(kept):, -1] = 1  # padding rows: one pad token of context, nothing trained
        dev = self.accelerator.device

        def t(a: np.ndarray, dtype: Any) -> Any:
            return torch.as_tensor(a, dtype=dtype, device=dev)

        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["rowgrove/rows"].append(float(len(kept)))
        self._metrics[mode]["rowgrove/rollouts"].append(float(len(weighted.rollout_ids)))
        self._metrics[mode]["rowgrove/dropped_invalid_rows"].append(float(weighted.dropped_invalid))
        rewards = {w.row.rollout_id: float(w.row.reward) for w in kept}
        self._metrics[mode]["reward"].append(float(np.mean(list(rewards.values()))))
        return {
            "prompt_ids": t(prompt_ids, torch.long), "prompt_mask": t(prompt_mask, torch.long),
            "completion_ids": t(completion_ids, torch.long), "completion_mask": t(completion_mask, torch.long),
            "tool_mask": t(tool_mask, torch.long), "advantages": t(adv, torch.float32),
            "old_per_token_logps": t(old, torch.float32),
            "num_items_in_batch": t(np.asarray(1.0), torch.float32),  # replaced in _compute_loss
        }

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        """TRL's own loss with its "dapo" normalizer set to 1: num_items_in_batch = num_processes *
        steps_per_generation / current_gradient_accumulation_steps (train) or num_processes (eval)."""
        import torch

        procs = self.accelerator.num_processes
        if self.model.training:
            items = procs * self.args.steps_per_generation / self.current_gradient_accumulation_steps
        else:
            items = procs
        inputs = {**inputs, "num_items_in_batch": torch.tensor(float(items), device=self.accelerator.device)}
        return super()._compute_loss(model, inputs)


__all__ = ["LOSS_TYPE", "RowgroveGRPOTrainer", "check_config"]
